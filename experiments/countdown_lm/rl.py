"""One RL run through the real parts: TRL's GRPO via the plug-in's SetpoGRPOTrainer, against a live
setpo-server. Every arm is the same trainer with its own settings (arms.Config): GRPO is lambda = 0 (it then sends
nothing to the service), the SetPO forms are the plug-in's diversity policy, the unlikeliness reward is GRPO with a
reward that ranks each group's correct answers by their likelihood; so all arms share every line of code, the
data, the steps and the hyperparameters."""

import json
import time
from pathlib import Path
from statistics import median

import torch
from datasets import Dataset
from transformers.trainer_callback import ProgressCallback, TrainerCallback
from trl import GRPOConfig

from experiments.countdown_lm.arms import Config
from experiments.countdown_lm.plan import RLSettings
from setpo_client import SetpoClient
from setpo_client.integrations.trl import SetpoGRPOTrainer
from setpo_client.keys import countdown_expression
from setpo_client.weight import WeightController
from setpo_trainer.rewards import countdown_reward


class QuietProgress(ProgressCallback):
    """TRL's progress bar, with the step's reward on it instead of printing every step's metrics (logging_steps
    is 1 so that the log history, and the report, has every step)."""

    def __init__(self, label: str):
        super().__init__()
        self.label = label

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.training_bar.set_description(self.label)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_bar is not None and logs and "reward" in logs:
            self.training_bar.set_postfix(reward=f"{logs['reward']:.3f}")


def countdown(completions, numbers, target, **kwargs) -> list[float]:
    """The project's scorer: 1 for a correct expression, 0.1 for a formatted wrong one, 0 without an answer."""
    return [countdown_reward(c, list(n), t) for c, n, t in zip(completions, numbers, target)]


def countdown_pass(completions, numbers, target, **kwargs) -> list[float]:
    """Pass/fail: 1 for a correct expression, else 0 (the reward MaxRL and W-REINFORCE are defined for)."""
    return [float(r == 1.0) for r in countdown(completions, numbers, target)]


def focal(gamma: float, generations: int):
    """F-GRPO (arXiv 2602.06717): GRPO's advantage times (1 - p)^gamma, p the group's success rate. Under Dr. GRPO's
    advantage r - mean(r), scaling a group's rewards by a factor scales its advantages by it, so the factor goes on
    the rewards: a prompt the policy already solves is pushed less."""

    def reward(completions, numbers, target, **kwargs) -> list[float]:
        rewards = countdown(completions, numbers, target)
        for start in range(0, len(rewards), generations):  # TRL puts a prompt's G completions side by side
            group = rewards[start : start + generations]
            factor = (1 - sum(r == 1.0 for r in group) / len(group)) ** gamma
            rewards[start : start + generations] = [r * factor for r in group]
        return rewards

    reward.__name__ = "countdown_focal"
    return reward


class Checkpoints(TrainerCallback):
    """The policy every `every` steps (before the last), model and tokenizer, under out/steps/step-N: experiment v4
    evaluates each on validation after training, so the runs' randomness is not touched."""

    def __init__(self, out: Path, every: int, tokenizer):
        self.out, self.every, self.tokenizer = out, every, tokenizer

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every and state.global_step % self.every == 0 and state.global_step < state.max_steps:
            where = self.out / "steps" / f"step-{state.global_step}"
            model.save_pretrained(where)
            self.tokenizer.save_pretrained(where)


def unlikeliness(rank_penalty: float, generations: int, trainer_of: dict):
    """The unlikeliness reward (He, Fried and Welleck, 2025): within each group, the correct answers ranked by their
    mean token log-probability under the current policy, the least likely first (rank 0); a correct answer's reward
    becomes 1 - rank_penalty * rank / G, so the likeliest is rewarded least. Wrong answers keep theirs. One extra
    forward pass a step, on the policy's own completions."""

    def reward(prompts, completions, completion_ids, numbers, target, **kwargs) -> list[float]:
        rewards = countdown(completions, numbers, target)
        likelihood = mean_logprobs(trainer_of["trainer"], prompts, completion_ids)
        for start in range(0, len(rewards), generations):  # TRL puts a prompt's G completions side by side
            group = range(start, start + generations)
            correct = sorted((i for i in group if rewards[i] == 1.0), key=lambda i: likelihood[i])
            for rank, i in enumerate(correct):
                rewards[i] = 1.0 - rank_penalty * rank / generations
        return rewards

    reward.__name__ = "countdown_unlikeliness"
    return reward


@torch.no_grad()
def mean_logprobs(trainer, prompts: list[str], completion_ids: list[list[int]]) -> list[float]:
    """Each completion's mean token log-probability given its prompt, under the trainer's current model."""
    tokenizer, model = trainer.processing_class, trainer.model
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] + list(c) for p, c in zip(prompts, completion_ids)]
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id or 0)  # (B, T)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
    logits = model(input_ids=ids).logits.float()  # (B, T, V): right padding never reaches a row's own tokens
    token_logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1)
    means = []
    for b, (row, completion) in enumerate(zip(rows, completion_ids)):
        start = len(row) - len(completion) - 1  # logits at t predict token t + 1
        means.append(token_logps[b, start : len(row) - 1].mean().item() if len(completion) else 0.0)
    return means


def train(
    base: Path,
    out: Path,
    puzzles: list[dict],
    url: str,
    config: Config,
    seed: int,
    settings: RLSettings,
    label: str = "RL",
    checkpoint_every: int = 0,
) -> dict:
    """Trains `base` for settings.steps steps with the arm's settings and saves the policy to out/model (and every
    checkpoint_every steps to out/steps/step-N, when given); returns the run's summary."""
    dataset = Dataset.from_list(
        [{"prompt": p["prompt"], "numbers": p["numbers"], "target": p["target"]} for p in puzzles]
    )
    arguments = GRPOConfig(
        output_dir=str(out),
        max_steps=settings.steps,
        per_device_train_batch_size=settings.prompts_per_step * settings.generations,
        num_generations=settings.generations,
        max_completion_length=settings.max_completion_length,
        temperature=1.0,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type=settings.loss_type,
        scale_rewards=settings.scale_rewards,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=seed,
        data_seed=seed,
        # TRL defaults to bf16 autocast and gradient checkpointing: both only slow a 2M-parameter model on a CPU
        bf16=False,
        gradient_checkpointing=False,
    )
    controller = None
    if config.target_ratio is not None:  # lambda in [0.01, 5] x the first one; the EMA over ~10 steps
        controller = WeightController(config.target_ratio, 0.01 * config.weight, 5.0 * config.weight, ema=0.9)
    trainer_of: dict = {}
    if config.rank_penalty:
        reward = unlikeliness(config.rank_penalty, settings.generations, trainer_of)
    elif config.focal:
        reward = focal(config.focal, settings.generations)
    elif config.advantage != "framework":
        reward = countdown_pass
    else:
        reward = countdown
    with SetpoClient(url) as client:
        trainer = SetpoGRPOTrainer(
            model=str(base),
            reward_funcs=reward,
            args=arguments,
            train_dataset=dataset,
            setpo_client=client,
            setpo_weight=config.weight,
            setpo_on_error="fail",
            setpo_min_reward=config.min_reward,
            setpo_key=countdown_expression if config.kernel != "embedding" else None,
            setpo_kernel=config.kernel,  # type: ignore[arg-type]
            setpo_normalize=config.normalize,  # type: ignore[arg-type]
            setpo_controller=controller,
            setpo_embed_span=config.embed_span,
            setpo_advantage=config.advantage,
            setpo_positive_weight=config.positive_weight,
            setpo_combine=config.combine,
            setpo_replay_weight=settings.replay_weight if config.replay else 0.0,
            setpo_replay_capacity=settings.replay_capacity,
            setpo_replay_threshold=config.replay_threshold,
        )
        trainer_of["trainer"] = trainer
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(QuietProgress(label))
        trainer.add_callback(Checkpoints(out, checkpoint_every, trainer.processing_class))
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    trainer.save_model(str(out / "model"))
    trainer.processing_class.save_pretrained(str(out / "model"))
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    (out / "log_history.json").write_text(json.dumps(history, indent=1))
    summary = {
        "config": config.as_dict(),
        "seed": seed,
        "steps": settings.steps,
        "seconds": seconds,
        "seconds_per_step": seconds / settings.steps,
        **metric_means(history),
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def metric_means(history: list[dict]) -> dict:
    """What the run's log says about SetPO and learning: means over the run (time share from step 2 on,
    as SetpoShaper logs it; the bonus ratio's median) and the reward at the start and the end."""

    def mean(key, rows=history):
        values = [e[key] for e in rows if key in e]
        return sum(values) / len(values) if values else None

    def middle(key):  # the median: in a step of nearly all-correct groups Dr. GRPO's advantages are ~0, the ratio huge
        values = [e[key] for e in history if key in e]
        return median(values) if values else None

    tenth = max(1, len(history) // 10)
    return {
        "reward_first": mean("reward", history[:tenth]),
        "reward_last": mean("reward", history[-tenth:]),
        "setpo_time_share": mean("setpo/time_share"),
        "setpo_time_s": mean("setpo/time_s"),
        "saturation": mean("setpo/saturation"),
        "set_score": mean("setpo/set_score_mean"),
        "marginal_std": mean("setpo/marginal_std"),
        "duplicate_share": mean("setpo/duplicate_share"),
        "weight_mean": mean("setpo/weight"),
        "weight_last": mean("setpo/weight", history[-tenth:]),
        "bonus_ratio": middle("setpo/bonus_ratio"),
        "scored_share": mean("setpo/scored_share"),
        "frac_reward_zero_std": mean("frac_reward_zero_std"),
    }

"""One RL run through the real parts: TRL's GRPO via the plug-in's SetpoGRPOTrainer, against a live
setpo-server. GRPO is the same trainer with lambda = 0 (it then sends nothing to the service), so both arms
share every line of code, the data, the steps and the hyperparameters."""

import json
import time
from pathlib import Path

from datasets import Dataset
from transformers.trainer_callback import ProgressCallback
from trl import GRPOConfig

from experiments.countdown_lm.plan import RLSettings
from setpo_client import SetpoClient
from setpo_client.integrations.trl import SetpoGRPOTrainer
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


def train(
    base: Path,
    out: Path,
    puzzles: list[dict],
    url: str,
    weight: float,
    seed: int,
    settings: RLSettings,
    label: str = "RL",
) -> dict:
    """Trains `base` for settings.steps steps and saves the policy to out/model; returns the run's summary."""
    dataset = Dataset.from_list(
        [{"prompt": p["prompt"], "numbers": p["numbers"], "target": p["target"]} for p in puzzles]
    )
    config = GRPOConfig(
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
    with SetpoClient(url) as client:
        trainer = SetpoGRPOTrainer(
            model=str(base),
            reward_funcs=countdown,
            args=config,
            train_dataset=dataset,
            setpo_client=client,
            setpo_weight=weight,
            setpo_on_error="fail",
        )
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(QuietProgress(label))
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    trainer.save_model(str(out / "model"))
    trainer.processing_class.save_pretrained(str(out / "model"))
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    (out / "log_history.json").write_text(json.dumps(history, indent=1))
    summary = {
        "weight": weight,
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
    as SetpoShaper logs it) and the reward at the start and the end."""

    def mean(key, rows=history):
        values = [e[key] for e in rows if key in e]
        return sum(values) / len(values) if values else None

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
        "frac_reward_zero_std": mean("frac_reward_zero_std"),
    }

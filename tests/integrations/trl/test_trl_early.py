"""SetPO off TRL's critical path, in real few-step GRPO runs on CPU against the real service: the forms that need no
reward are submitted at generation and scored while TRL computes its log-probs and rewards; with min_reward the
step is scored after TRL's rewards. Either way the loss sees TRL's advantages plus the step's own bonus."""

import threading
from concurrent.futures import wait

import pytest
import torch
from trl import GRPOTrainer

from setpo_client.shaping import SetpoShaper
from tests.integrations.trl.test_trl_plugin import WEIGHT, make_trainer, spy, tiny_model, varied_reward  # noqa: F401


def slow_reward_recording(seen: dict):
    """A reward function that stands for TRL's slow work before the advantages (log-prob passes, code execution): it
    records whether the step's scoring was already submitted, and lets it finish first."""

    def reward(completions, **kwargs):
        pending = seen["trainer"].setpo.pending
        seen["submitted"].append(pending is not None and pending.work is not None)
        if pending is not None and pending.work is not None:
            wait([pending.work])
        return varied_reward(completions)

    return reward


def step_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("setpo-step")]


def test_the_papers_form_is_scored_while_trl_computes_its_rewards(tiny_model, client, spy, tmp_path):  # noqa: F811
    seen: dict = {"submitted": []}
    trainer = make_trainer(tiny_model, client, tmp_path, reward_funcs=slow_reward_recording(seen), beta=0.04)
    seen["trainer"] = trainer
    trainer.train()

    assert seen["submitted"] == [True, True]  # in flight before TRL's rewards, after its reference pass
    for (base, texts), trained_on in zip(spy["trl"], spy["loss"]):  # still exactly the step's own bonus
        groups = [texts[i : i + 4] for i in range(0, len(texts), 4)]
        marginals = torch.tensor(
            [s for g in client.diversity([{"texts": g} for g in groups]).groups for s in g.marginals]
        )
        expected = base + WEIGHT * marginals
        assert all(trained_on[text] == pytest.approx(expected[i].item(), abs=1e-5) for i, text in enumerate(texts))
    logged = [entry for entry in trainer.state.log_history if "setpo/wait_s" in entry]
    assert len(logged) == 2
    for entry in logged:  # the requests were hidden: the trainer blocked for less than SetPO's time
        assert entry["setpo/wait_s"] < entry["setpo/time_s"] and entry["setpo/dropped_steps"] == 0
    for thread in step_threads():  # a finished step's thread exits at once; one still working would not
        thread.join(timeout=10)
    assert not step_threads()


def test_with_min_reward_the_step_is_scored_after_trls_rewards(tiny_model, client, tmp_path):  # noqa: F811
    seen: dict = {"submitted": []}
    policy = {"setpo_min_reward": 0.0}  # every completion in scope: the step is shaped
    trainer = make_trainer(tiny_model, client, tmp_path, reward_funcs=slow_reward_recording(seen), setpo_policy=policy)
    seen["trainer"] = trainer
    trainer.train()
    assert seen["submitted"] == [False, False]
    logged = [entry for entry in trainer.state.log_history if "setpo/wait_s" in entry]
    assert len(logged) == 2 and all(entry["setpo/active"] == 1 for entry in logged)


def eos_every_other(prompts, trainer):
    """A rollout whose odd completions end in EOS and even ones are cut at the length limit (truncated)."""
    tokenizer = trainer.processing_class
    out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
    for i, prompt in enumerate(prompts):
        answer = tokenizer(f"answer number {i} to this", add_special_tokens=False)["input_ids"]
        ids = answer + [tokenizer.eos_token_id] if i % 2 else answer
        out["prompt_ids"].append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        out["completion_ids"].append(ids)
        out["logprobs"].append([0.0] * len(ids))
    return out


def test_texts_submitted_at_generation_are_those_the_loss_trains_on(tiny_model, client, tmp_path, monkeypatch):  # noqa: F811
    """mask_truncated_completions: TRL drops a truncated completion from the loss after generation; the texts
    submitted at generation leave it out too (None, not scored), exactly as the loss's own masks say."""
    submitted, trained = [], []
    submit, generate = SetpoShaper.submit, GRPOTrainer._generate_and_score_completions

    def record_submit(self, groups, *args, **kwargs):
        submitted.append([member for group in groups for member in group])
        return submit(self, groups, *args, **kwargs)

    def record_trained(self, inputs):
        output = generate(self, inputs)
        mask = output["completion_mask"]
        trained.append([self.completion_text(ids, row) for ids, row in zip(output["completion_ids"], mask)])
        return output

    monkeypatch.setattr(SetpoShaper, "submit", record_submit)
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", record_trained)
    trainer = make_trainer(
        tiny_model, client, tmp_path, max_steps=1, rollout_func=eos_every_other, mask_truncated_completions=True
    )
    trainer.train()
    assert len(submitted) == len(trained) == 1
    assert submitted == trained
    assert sum(text is None for text in submitted[0]) == len(submitted[0]) // 2  # the truncated half

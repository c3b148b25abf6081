"""Replay in SetpoGRPOTrainer (setpo_replay_weight), in real few-step TRL runs against the real service: the answers
that reach setpo_min_reward are banked when they differ, the loss gains alpha times the replay term, and the bank is
saved in every checkpoint and comes back on resume."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from setpo_client.integrations.replay import ReplayBank
from setpo_client.integrations.trl import SetpoGRPOTrainer
from tests.integrations.trl import spy as trl_spy
from tests.integrations.trl.test_trl_plugin import make_trainer as plugin_trainer
from tests.tiny_model import tiny_llama

PROMPTS = ["What is 2 + 3?", "Name a prime number."]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def even_length(completions, **kwargs):
    """Pass/fail for the test: a completion of even length is 'correct'."""
    return [float(len(c) % 2 == 0) for c in completions]


def make_trainer(model, client, tmp_path, **config):
    """test_trl_plugin's trainer, banking the answers that reach reward 1 (even length)."""
    replay = {"setpo_replay_weight": 0.1, "setpo_replay_threshold": 0.9}
    policy = {"setpo_min_reward": 1.0, "setpo_normalize": "zscore", **replay}
    return plugin_trainer(
        model, client, tmp_path, reward_funcs=even_length, prompts=PROMPTS * 8, setpo_policy=policy, **config
    )


def test_verified_distinct_answers_are_banked_and_replayed_in_the_loss(tiny_model, client, monkeypatch, tmp_path):
    seen = trl_spy.install(monkeypatch.setattr)
    losses: dict[str, list[float]] = {"trl": [], "trained": []}
    trl_loss = GRPOTrainer.compute_loss  # the spy's, which calls TRL's own

    def record_trl(self, *args, **kwargs):
        value = trl_loss(self, *args, **kwargs)
        losses["trl"].append(value.item())
        return value

    monkeypatch.setattr(GRPOTrainer, "compute_loss", record_trl)
    trainer = make_trainer(tiny_model, client, tmp_path)
    shaped_loss = trainer.compute_loss
    trainer.compute_loss = lambda *a, **k: (lambda v: (losses["trained"].append(v.item()), v)[1])(shaped_loss(*a, **k))
    trainer.train()
    rewarded = {text for _, texts in seen["trl"] for text in texts if len(text) % 2 == 0}
    bank = trainer.setpo_replay
    assert bank is not None and bank.size() > 0
    for banked in bank.prompts.values():
        texts = [b.text for b in banked]
        assert len(set(texts)) == len(texts) <= 16
        assert set(texts) <= rewarded  # only answers that reached setpo_min_reward
        assert all(b.vector is not None for b in banked)  # compared by the service's embeddings
    logged = [entry for entry in trainer.state.log_history if "setpo/replay_loss" in entry]
    assert len(logged) == 2
    assert logged[-1]["setpo/replay_bank_size"] == bank.size() and logged[-1]["setpo/replay_embed_failures"] == 0
    assert logged[-1]["setpo/replay_loss"] > 0 and logged[-1]["setpo/replay_prompts"] > 0
    # what the optimizer saw: TRL's loss plus alpha times the replay term, every step
    replayed = [entry["setpo/replay_loss"] for entry in logged]
    assert [t - r for t, r in zip(losses["trained"], losses["trl"])] == pytest.approx(
        [0.1 * x for x in replayed], abs=1e-6
    )


def test_the_bank_is_saved_in_every_checkpoint_and_loaded_on_resume(tiny_model, client, tmp_path):
    first = make_trainer(tiny_model, client, tmp_path, save_strategy="steps", save_steps=1)
    first.train()
    saved = json.loads((tmp_path / "checkpoint-2" / "setpo_replay.json").read_text())
    assert (tmp_path / "checkpoint-1" / "setpo_replay.json").exists()
    expected = ReplayBank()
    expected.load_state_dict(saved)
    assert expected == first.setpo_replay and expected.size() > 0

    loaded: list[int] = []
    resumed = make_trainer(tiny_model, client, tmp_path, max_steps=3, save_strategy="steps", save_steps=1)
    original = resumed.setpo_admit
    resumed.setpo_admit = lambda *args: (loaded.append(resumed.setpo_replay.size()), original(*args))[1]
    resumed.train(resume_from_checkpoint=True)
    assert loaded == [expected.size()]  # the one step left began from the saved bank
    assert resumed.state.global_step == 3


def test_replay_needs_the_reward_a_verified_answer_reaches(tiny_model, client, tmp_path):
    with pytest.raises(ValueError, match=r"setpo_replay_weight banks verified answers.*setpo_min_reward"):
        SetpoGRPOTrainer(
            model=tiny_model,
            reward_funcs=even_length,
            args=GRPOConfig(
                output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, report_to=[], use_cpu=True
            ),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS * 8}),
            setpo_client=client,
            setpo_replay_weight=0.1,
        )


def test_two_processes_train_on_when_only_one_has_answers_to_replay(tiny_model, server, tmp_path):
    """Each process runs the replay forward on every step, a bank or not: a distributed model (DDP's buffer broadcast,
    ZeRO-3's or FSDP's gathers) waits for every rank at each forward, so one that skipped it hung the other."""
    from tests.integrations.trl.test_trl_plugin import free_port

    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    command += ["--module", "tests.integrations.trl.two_process_replay", tiny_model, server.url, str(tmp_path)]
    root = Path(__file__).parents[3]  # torchrun's workers import the script by module name, from the root
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    run = subprocess.Popen(command, cwd=root, **pipes)
    try:
        output = run.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:  # SIGTERM: torchrun stops its workers (each in a session of its own) itself
        run.terminate()
        pytest.fail(
            f"two processes with replay still running after 300 s: hung\n{run.communicate(timeout=60)[0][-3000:]}"
        )
    assert run.returncode == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["bank"] == ranks[1]["bank"] and len(ranks[0]["bank"]["prompts"]) == 1  # the sum's answers only
    # the case itself: a step on which one process replayed and the other had nothing to replay
    steps = list(zip(ranks[0]["replay_prompts"], ranks[1]["replay_prompts"]))
    assert any((a > 0) != (b > 0) for a, b in steps), steps

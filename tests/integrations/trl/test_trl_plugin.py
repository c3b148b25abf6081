"""SetpoGRPOTrainer in real few-step TRL GRPO runs on CPU, against the real running service."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from setpo_client import SetpoClient, SetpoError
from setpo_client.integrations.trl import SetpoGRPOTrainer
from setpo_client.weight import WeightController
from setpo_server.local import free_port
from tests.integrations.trl import spy as trl_spy
from tests.tiny_model import tiny_llama

WEIGHT = 0.5
PROMPTS = ["What is 2 + 3?", "Name a prime number.", "Spell 'cat' backwards.", "What is 10 / 2?"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def varied_reward(completions, **kwargs):
    """Different rewards within a group, so TRL's own advantages are not all zero."""
    return [float(len(c) % 3) for c in completions]


@pytest.fixture
def spy(monkeypatch):
    return trl_spy.install(monkeypatch.setattr)


def make_trainer(
    model,
    client,
    tmp_path,
    on_error="skip",
    max_steps=2,
    max_completion_length=12,
    rollout_func=None,
    setpo_policy=None,
    reward_funcs=varied_reward,
    beta=0.0,
    weight=WEIGHT,
    prompts=PROMPTS * 4,
    **config,
):
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=max_completion_length,
        max_steps=max_steps,
        learning_rate=1e-4,
        beta=beta,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        **{"save_strategy": "no", **config},
    )
    return SetpoGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        rollout_func=rollout_func,
        setpo_client=client,
        setpo_weight=weight,
        setpo_on_error=on_error,
        **(setpo_policy or {}),
    )


@pytest.mark.parametrize(
    "config",
    [
        {"loss_type": "grpo"},
        {"loss_type": "dr_grpo"},
        {"loss_type": "dapo", "epsilon_high": 0.28},
        {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    ],
    ids=["grpo", "dr_grpo", "dapo", "gspo"],
)
def test_loss_sees_trls_advantages_plus_weight_times_service_marginals(tiny_model, client, spy, tmp_path, config):
    trainer = make_trainer(tiny_model, client, tmp_path, **config)
    trainer.train()
    assert len(spy["trl"]) == len(spy["loss"]) == 2
    for (base, texts), trained_on in zip(spy["trl"], spy["loss"]):
        assert len(set(texts)) == len(texts) == len(trained_on)  # completions identify their rows
        groups = [texts[i : i + 4] for i in range(0, len(texts), 4)]
        marginals = torch.tensor(
            [s for g in client.diversity([{"texts": g} for g in groups]).groups for s in g.marginals]
        )
        expected = base + WEIGHT * marginals
        assert all(trained_on[text] == pytest.approx(expected[i].item(), abs=1e-5) for i, text in enumerate(texts))
        assert not torch.allclose(expected, base)  # the shaping is really there
    logged = [entry for entry in trainer.state.log_history if "setpo/set_score_mean" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert entry["setpo/weight"] == WEIGHT and entry["setpo/fallback_steps"] == 0 and entry["setpo/active"] == 1
        assert {"setpo/saturation", "setpo/duplicate_share", "setpo/marginal_std", "setpo/time_s"} <= set(entry)
    # SetpoShaper's timing: a share of the whole step, from one generation round to the next
    assert "setpo/time_share" not in logged[0] and 0 < logged[1]["setpo/time_share"] < 1


def first_word(text: str) -> str | None:
    """A solution key for the test: completions that start with the same word are the same solution."""
    words = text.split()
    return words[0] if words else None


def test_the_diversity_policy_reaches_the_loss_as_the_services_bonus_and_the_controller_steers(
    tiny_model, client, spy, tmp_path
):
    policy = {
        "setpo_min_reward": 1.0,
        "setpo_key": first_word,
        "setpo_kernel": "hybrid",
        "setpo_normalize": "zscore",
        "setpo_controller": WeightController(target_ratio=0.5, ema=0.0, min_weight=1e-3, max_weight=100.0),
    }
    trainer = make_trainer(tiny_model, client, tmp_path, setpo_policy=policy, loss_type="dr_grpo")
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "setpo/weight" in entry]
    for (base, texts), trained_on, entry in zip(spy["trl"], spy["loss"], logged):
        groups = [texts[i : i + 4] for i in range(0, len(texts), 4)]
        direct = client.diversity(
            [{"texts": g, "rewards": varied_reward(g), "keys": [first_word(t) for t in g]} for g in groups],
            weight=entry["setpo/weight"],
            min_reward=1.0,
            kernel="hybrid",
            normalize="zscore",
        )
        bonus = [b for group in direct.groups for b in group.bonus]
        rewards = [r for g in groups for r in varied_reward(g)]
        assert all(b == 0 for b, r in zip(bonus, rewards) if r < 1.0)  # below min_reward: nothing added
        expected = base + torch.tensor(bonus)
        assert all(trained_on[text] == pytest.approx(expected[i].item(), abs=1e-5) for i, text in enumerate(texts))
    # lambda* of step 1 (target / measured ratio, ema 0) is the lambda step 2 applies
    assert logged[0]["setpo/weight"] == WEIGHT and logged[0]["setpo/bonus_ratio"] > 0
    assert logged[1]["setpo/weight"] == pytest.approx(WEIGHT * 0.5 / logged[0]["setpo/bonus_ratio"], rel=1e-6)


def test_embed_span_sends_the_spans_and_the_loss_sees_their_bonus(tiny_model, client, spy, tmp_path):
    """setpo_embed_span: the service embeds each completion's span (here its first word), and the loss sees TRL's
    advantage plus the bonus the service gives those spans; setpo/span_missing counts completions sent whole."""
    trainer = make_trainer(tiny_model, client, tmp_path, setpo_policy={"setpo_embed_span": r"^\s*(\S+)"})
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "setpo/span_missing" in entry]
    assert len(logged) == len(spy["trl"]) == 2
    for (base, texts), trained_on, entry in zip(spy["trl"], spy["loss"], logged):
        spans = [first_word(t) or t for t in texts]  # nothing but space: sent whole
        groups = [spans[i : i + 4] for i in range(0, len(spans), 4)]
        marginals = [s for g in client.diversity([{"texts": g} for g in groups]).groups for s in g.marginals]
        expected = base + WEIGHT * torch.tensor(marginals)
        assert all(trained_on[text] == pytest.approx(expected[i].item(), abs=1e-5) for i, text in enumerate(texts))
        assert entry["setpo/span_missing"] == sum(first_word(t) is None for t in texts)


def test_several_replicas_and_setpo_in_flight_reach_the_shaper(tiny_model, server, tmp_path):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the start needs only one replica ready
    with SetpoClient(f"{server.url},{down}") as replicas:
        trainer = make_trainer(tiny_model, replicas, tmp_path, setpo_policy={"setpo_in_flight": 2})
    assert trainer.setpo.in_flight == 2 and trainer.setpo.client.urls == [server.url, down]
    assert trainer.setpo.info is not None  # its limits, from the replica that answered


def test_a_key_kernel_without_a_key_is_refused_at_start(tiny_model, client, tmp_path):
    with pytest.raises(ValueError, match="give setpo_key"):
        make_trainer(tiny_model, client, tmp_path, setpo_policy={"setpo_kernel": "key"})


ANSWERS = ["2 + 3 = 5", "five", "it is 5", "5, since 2 + 3 = 5", "7 is prime", "2", "seven", "13 is a prime"]


def scripted_rollout(prompts, trainer):
    """TRL's rollout_func seam, as a multi-turn environment uses it: each completion is the policy's answer
    followed by the environment's feedback, which env_mask marks as not the policy's (TRL's tool_mask)."""
    tokenizer = trainer.processing_class
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for i, prompt in enumerate(prompts):
        answer = tokenizer(ANSWERS[i % len(ANSWERS)] + f" (try {i})", add_special_tokens=False)["input_ids"]
        feedback = tokenizer(f" [environment: checked {i} cases, all rows ok]", add_special_tokens=False)["input_ids"]
        out["prompt_ids"].append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        out["completion_ids"].append(answer + feedback)
        out["logprobs"].append([0.0] * (len(answer) + len(feedback)))
        out["env_mask"].append([1] * len(answer) + [0] * len(feedback))
    return out


def test_only_the_policys_tokens_are_embedded_and_the_completions_table_shows_shaped_advantages(
    tiny_model, client, spy, tmp_path
):
    trainer = make_trainer(
        tiny_model, client, tmp_path, max_steps=1, max_completion_length=64, rollout_func=scripted_rollout
    )
    trainer.train()
    (base, full_texts), trained_on = spy["trl"][0], spy["loss"][0]
    assert all("[environment:" in text for text in full_texts)
    answers = [text.split(" [environment:")[0] for text in full_texts]  # what the loss trains on (tool_mask == 1)
    groups = [answers[i : i + 4] for i in range(0, len(answers), 4)]
    marginals = torch.tensor([s for g in client.diversity([{"texts": g} for g in groups]).groups for s in g.marginals])
    expected = base + WEIGHT * marginals
    assert all(trained_on[text] == pytest.approx(expected[i].item(), abs=1e-5) for i, text in enumerate(full_texts))
    assert list(trainer._logs["advantages"]) == pytest.approx(expected.tolist(), abs=1e-5)  # TRL's completions table


@pytest.mark.parametrize("seam", ["_generate", "_generate_and_score_completions", "_calculate_rewards"])
def test_a_trl_without_the_method_setpo_overrides_is_refused(tiny_model, client, tmp_path, monkeypatch, seam):
    monkeypatch.delattr(GRPOTrainer, seam)  # as a TRL that renamed its private seam
    with pytest.raises(RuntimeError, match="would train without SetPO"):
        make_trainer(tiny_model, client, tmp_path)


def test_a_trl_outside_the_tested_range_is_said_at_start(tiny_model, client, tmp_path, monkeypatch, caplog):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with caplog.at_level("WARNING", logger="setpo_client.trl"):
        make_trainer(tiny_model, client, tmp_path)
    assert "is tested with TRL >=1.16,<1.17 (setpo-client[trl]); this is 1.17.0" in caplog.text


def test_the_trl_extra_declares_the_range_the_plugin_accepts():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    from setpo_client.integrations import trl as plugin

    extras = tomllib.loads((Path(__file__).parents[3] / "clients/python/pyproject.toml").read_text())
    required = [Requirement(r) for r in extras["project"]["optional-dependencies"]["trl"]]
    (declared,) = [requirement for requirement in required if requirement.name == "trl"]
    assert declared.specifier == SpecifierSet(plugin.TESTED_RANGE)  # one range: the extra's and the warning's
    for version in ("1.16.0", "1.16.7", "1.15.2", "1.17.0", "2.0.0"):
        assert SpecifierSet(plugin.TESTED_RANGE).contains(version) == (version in declared.specifier)


def test_the_key_is_in_no_log_printed_argument_or_tracker_config(tiny_model, tmp_path, monkeypatch, caplog, capsys):
    from setpo_server.local import LocalServer

    key = "trl-secret-key-91c0"
    with LocalServer(api_key=key) as keyed:
        monkeypatch.setenv("SETPO_API_KEY", key)  # the only way in: SetpoClient reads it
        with caplog.at_level("DEBUG"):
            trainer = make_trainer(tiny_model, SetpoClient(keyed.url, max_retries=0), tmp_path, max_steps=1)
            trainer.train()
    assert trainer.state.log_history[0]["setpo/active"] == 1  # the key worked
    seen = capsys.readouterr()
    # what TRL prints, logs, and gives its trackers (the callbacks send args.to_dict() / to_json_string())
    assert key not in seen.out + seen.err + caplog.text + trainer.args.to_json_string() + json.dumps(
        trainer.state.log_history
    )


def test_a_service_that_is_not_there_at_start_stops_the_trainer_before_training(tiny_model, tmp_path):
    # as setpo-train and veRL do: a wrong URL would otherwise train the whole run without SetPO, step by step
    # setpo_ready_timeout bounds the wait for a service still starting (default 120 s, veRL's ready_timeout)
    down = SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=0)
    started = time.monotonic()
    with pytest.raises(SetpoError, match="is not usable"):
        make_trainer(tiny_model, down, tmp_path, on_error="skip", setpo_policy={"setpo_ready_timeout": 2})
    assert time.monotonic() - started < 60  # the knob's 2 s, not the default 120 s


def test_groups_larger_than_the_service_takes_are_refused_at_start(tiny_model, tmp_path):
    from setpo_server.local import LocalServer

    with (
        LocalServer(max_group_size=3) as small,
        pytest.raises(SetpoError, match=r"groups of 4 .*lower num_generations"),
    ):
        make_trainer(tiny_model, SetpoClient(small.url, max_retries=0), tmp_path)


def went_down(trainer):
    """The service goes away after the start check: the trainer's client now points where nothing listens."""
    trainer.setpo.client = SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=1, backoff=0.05)
    return trainer


def test_service_down_with_skip_trains_on_trls_advantages_and_counts(tiny_model, client, spy, tmp_path):
    trainer = went_down(make_trainer(tiny_model, client, tmp_path, on_error="skip"))
    trainer.train()
    for (base, texts), trained_on in zip(spy["trl"], spy["loss"]):
        assert [trained_on[text] for text in texts] == base.tolist()
    fallbacks = [
        entry["setpo/fallback_steps"] for entry in trainer.state.log_history if "setpo/fallback_steps" in entry
    ]
    assert fallbacks == [1.0, 2.0]


def test_service_down_with_fail_stops_training_with_a_clear_error(tiny_model, client, tmp_path):
    trainer = went_down(make_trainer(tiny_model, client, tmp_path, on_error="fail"))
    with pytest.raises(SetpoError, match="on_error='fail'"):
        trainer.train()


def run_two_processes(tiny_model: str, url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """two_process_run under `torchrun --nproc_per_node 2` on CPU (accelerate picks gloo from the environment),
    from the repository root: the script imports the shared spy from the tests package."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    module = ["--module", "tests.integrations.trl.two_process_run", tiny_model, url, str(out), *extra]
    return subprocess.run(command + module, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[3])


def test_two_processes_score_whole_groups_and_each_applies_its_slice(tiny_model, server, client, tmp_path):
    run = run_two_processes(tiny_model, server.url, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    texts = ranks[0]["trl"][0]["texts"] + ranks[1]["trl"][0]["texts"]  # TRL's gather order: rank 0 then rank 1
    base = ranks[0]["trl"][0]["advantages"] + ranks[1]["trl"][0]["advantages"]
    groups = [texts[i : i + 4] for i in range(0, len(texts), 4)]
    assert len(texts) == 4 and len(groups) == 1  # one group of 4, two members on each process
    marginals = client.diversity([{"texts": g} for g in groups]).groups[0].marginals
    for r, rank in enumerate(ranks):
        for i, text in enumerate(rank["trl"][0]["texts"]):
            expected = base[2 * r + i] + WEIGHT * marginals[2 * r + i]
            assert rank["loss"][0][text] == pytest.approx(expected, abs=1e-5)


def test_two_processes_with_fail_and_the_service_down_all_raise_instead_of_waiting(tiny_model, server, tmp_path):
    run = run_two_processes(tiny_model, server.url, tmp_path, "fail", f"http://127.0.0.1:{free_port()}")
    assert run.returncode != 0
    for rank in (0, 1):  # rank 1 never talks to the service: it gets rank 0's error through the broadcast
        assert "cannot reach the setpo server" in (tmp_path / f"rank{rank}.error").read_text()


def test_trl_run_survives_the_service_being_killed_and_restarted(tiny_model, tmp_path):
    import signal

    import httpx
    from transformers import TrainerCallback

    from setpo_server.local import LocalServer

    server = LocalServer(port=free_port()).start()

    class KillAfterFirstStepRestartBeforeLast(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                server.stop(signal.SIGKILL)
            if state.global_step == 3:
                server.start(wait=False)
                server.wait_until(lambda: httpx.get(server.url + "/ready").status_code == 200)

    try:
        client = SetpoClient(server.url, max_retries=1, backoff=0.05, max_backoff=0.1)
        trainer = make_trainer(tiny_model, client, tmp_path, on_error="skip", max_steps=4)
        trainer.add_callback(KillAfterFirstStepRestartBeforeLast())
        trainer.train()
    finally:
        server.stop()
    logged = [e for e in trainer.state.log_history if "setpo/weight" in e]
    assert [e["setpo/weight"] for e in logged] == [WEIGHT, 0.0, 0.0, WEIGHT]  # all 4 steps trained; shaping resumed
    assert [e["setpo/fallback_steps"] for e in logged] == [0.0, 1.0, 2.0, 2.0]

"""In a local Ray cluster, the trainer actor that OpenRLHF itself builds uses SetpoExperienceMaker: shown from
inside the actor (sync PPOTrainer and the async TrainingActor), by the real `setpo-train` run through
OpenRLHF's own train() up to the first GPU step, and through OpenRLHF's SamplesGenerator with DAPO's
dynamic filtering (dropped groups are never sent)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from openrlhf.trainer.ppo_trainer import PPOTrainer, prepare_datasets
from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.utils import get_strategy
from openrlhf.utils.utils import get_tokenizer

from setpo_server.local import LocalServer
from setpo_trainer.openrlhf import data, ray_hook
from setpo_trainer.openrlhf.ray_hook import RUNTIME_ENV_HOOK
from setpo_trainer.openrlhf.rewards import path as reward_file
from tests.trainer.rollouts import (
    KINDS,
    N_SAMPLES,
    SETTINGS,
    ScriptedEngine,
    after_model_forward,
    assert_shaped,
    makers,
    recording_client,
    responses,
    rollout,
    train_args,
)

MAKER = "setpo_trainer.openrlhf.experience_maker.SetpoExperienceMaker"
GENERATE = {
    "do_sample": True,
    "max_len": 1024,
    "max_new_tokens": 64,
    "temperature": 1.0,
    "top_p": 1.0,
}  # as train_ppo_ray passes them


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    """The first GSM8K train problems as the OpenRLHF prompt file setpo_trainer's data module writes."""
    path = tmp_path_factory.mktemp("data") / "gsm8k.jsonl"
    data.main(["gsm8k", "--out", str(path)])
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:6]))
    return path


@pytest.fixture(scope="module")
def cluster():
    """A fresh local Ray cluster, started the way setpo-train makes OpenRLHF start it: RAY_RUNTIME_ENV_HOOK set."""
    os.environ["RAY_RUNTIME_ENV_HOOK"] = RUNTIME_ENV_HOOK
    ray.init(
        address="local",
        num_cpus=8,
        include_dashboard=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
    )
    yield
    ray.shutdown()
    del os.environ["RAY_RUNTIME_ENV_HOOK"]


def trainer_args(tiny_model, server, prompt_file, *flags):
    return train_args(
        "--actor.model_name_or_path",
        tiny_model,
        "--data.prompt_dataset",
        str(prompt_file),
        "--data.input_key",
        "input",
        "--data.label_key",
        "label",
        "--reward.remote_url",
        str(reward_file("math")),
        "--rollout.n_samples_per_prompt",
        str(N_SAMPLES),
        "--rollout.batch_size",
        str(len(KINDS)),
        "--rollout.micro_batch_size",
        "3",
        "--setpo.url",
        server.url,
        *flags,
    )


def test_the_trainer_actor_openrlhf_builds_shapes_its_advantages(
    cluster, tiny_model, server, client, prompt_file, problems
):
    args = trainer_args(tiny_model, server, prompt_file, *SETTINGS["grpo"])
    trainer = PPOTrainer.remote(
        tiny_model, get_strategy(args), None, None, None, None, None, **GENERATE
    )  # as train() builds it
    maker = ray.get(
        trainer.__ray_call__.remote(
            lambda self: f"{type(self.experience_maker).__module__}.{type(self.experience_maker).__name__}"
        )
    )
    assert maker == MAKER

    # The actor's own experience maker, on a real rollout, against the service
    openrlhf, _, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["grpo"])
    experiences = rollout(problems, strategy, tokenizer, openrlhf, kl_scale=0.05)
    shaped = ray.get(
        trainer.__ray_call__.remote(
            lambda self, batch: self.experience_maker.compute_advantages_and_returns(batch), experiences
        )
    )
    base = openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences))
    groups = [responses(answer, kind) for (_, answer), kind in zip(problems, KINDS)]
    marginals = [
        s for result in client.diversity([{"texts": group} for group in groups]).groups for s in result.marginals
    ]
    assert_shaped(base, shaped, marginals, 0.05)
    ray.kill(trainer)


def test_workers_that_never_import_openrlhfs_trainer_get_nothing_imported(cluster):
    """vLLM engine actors run the job's setup hook too, before Ray sets their CUDA_VISIBLE_DEVICES: it must not
    import OpenRLHF's trainer (deepspeed, flash-attn, transformers) into them, only arm the rebind."""

    @ray.remote
    class EngineLike:  # any actor that, like OpenRLHF's vLLM engines, never imports openrlhf.trainer.ppo_trainer
        def imported(self):
            heavy = ("openrlhf.trainer.ppo_trainer", "deepspeed", "setpo_trainer.openrlhf.experience_maker")
            armed = any(type(finder).__name__ == "_RebindOnImport" for finder in sys.meta_path)
            return [name for name in heavy if name in sys.modules], armed

        def import_the_trainer(self):
            from openrlhf.trainer import ppo_trainer

            return f"{ppo_trainer.RemoteExperienceMaker.__module__}.{ppo_trainer.RemoteExperienceMaker.__name__}"

    actor = EngineLike.remote()
    assert ray.get(actor.imported.remote()) == ([], True)
    assert ray.get(actor.import_the_trainer.remote()) == MAKER  # the same worker, once it imports the trainer
    ray.kill(actor)


def test_an_openrlhf_that_no_longer_builds_the_maker_by_name_is_refused():
    import types

    # PPOTrainerAsync.__init__ builds no RemoteExperienceMaker: as BasePPOTrainer would after a refactor
    moved = types.SimpleNamespace(BasePPOTrainer=PPOTrainerAsync.__ray_actor_class__, RemoteExperienceMaker=object)
    with pytest.raises(RuntimeError, match="would train without SetPO"):
        ray_hook.rebind(moved)


def test_the_async_training_actor_uses_it_too(cluster, tiny_model, server, prompt_file):
    args = trainer_args(tiny_model, server, prompt_file, *SETTINGS["grpo"], "--train.async_enable")
    trainer = PPOTrainerAsync.remote(tiny_model, get_strategy(args), None, None, None, None, None, **GENERATE)

    def training_actors_maker(self):  # runs in PPOTrainerAsync, asks its TrainingActor
        inner = self.trainer_actor.__ray_call__.remote(
            lambda actor: f"{type(actor.experience_maker).__module__}.{type(actor.experience_maker).__name__}"
        )
        return ray.get(inner)

    assert ray.get(trainer.__ray_call__.remote(training_actors_maker)) == MAKER
    ray.kill(trainer)


def test_dapo_dynamic_filtering_sends_only_the_groups_it_keeps(cluster, tiny_model, server, prompt_file):
    # all six prompts in one draw: the filter drops two groups and, with no prompts left, replaces none
    args = trainer_args(tiny_model, server, prompt_file, *SETTINGS["dapo"], "--rollout.batch_size", "6")
    strategy = get_strategy(args)
    tokenizer = get_tokenizer(tiny_model, None, "left", strategy)
    rows = [json.loads(line) for line in prompt_file.read_text().splitlines()]
    kinds = ["mixed", "right", "mixed", "wrong", "duplicate", "mixed"]  # all right / all wrong: DAPO drops them
    script = {row["input"]: responses(row["label"], kind) for row, kind in zip(rows, kinds)}
    engine = ray.remote(ScriptedEngine).remote(script)

    prompts, _, _ = prepare_datasets(strategy, tokenizer)  # OpenRLHF's own loader of the prompt file
    generator = SamplesGenerator(
        strategy=strategy, prompts_dataloader=prompts, eval_dataloader=None, tokenizer=tokenizer, vllm_engines=[engine]
    )
    samples, _, consumed, _ = generator.generate_samples(**GENERATE)
    assert consumed == 6 and len(samples) == 4 * N_SAMPLES

    _, setpo, _, _ = makers(tiny_model, server.url, *SETTINGS["dapo"])
    setpo.setpo.client, wire = recording_client(server.url)
    setpo.compute_advantages_and_returns(after_model_forward(setpo.split_rollout_samples(samples)))
    kept = sorted(
        map(sorted, (responses(row["label"], kind) for row, kind in zip(rows, kinds) if kind not in ("right", "wrong")))
    )
    assert len(wire.sent) == 1 and sorted(sorted(group["texts"]) for group in wire.sent[0]["groups"]) == kept


@pytest.mark.parametrize("keep", ["on", "off"])
def test_under_dapo_the_scoped_form_keeps_the_all_correct_groups_it_exists_for(
    cluster, tiny_model, server, prompt_file, keep
):
    """Issue 41, item 2: with --setpo.min_reward, OpenRLHF's real filter keeps the all-right group (where the
    scoped bonus acts) under --setpo.keep_groups on, still drops the all-wrong one, and setpo/kept_by_bonus counts
    it; off, DAPO drops both, as before, and the scoped form scores nothing."""
    scoped = [
        *SETTINGS["dapo"],
        "--setpo.min_reward",
        "1.0",
        "--setpo.normalize",
        "zscore",
        "--setpo.keep_groups",
        keep,
    ]
    args = trainer_args(tiny_model, server, prompt_file, *scoped, "--rollout.batch_size", "6")
    assert list(args.algo.dynamic_filtering_range) == ([0.0, float("inf")] if keep == "on" else [0.0, 1.0])
    strategy = get_strategy(args)
    tokenizer = get_tokenizer(tiny_model, None, "left", strategy)
    rows = [json.loads(line) for line in prompt_file.read_text().splitlines()]
    kinds = ["mixed", "right", "mixed", "wrong", "duplicate", "mixed"]
    engine = ray.remote(ScriptedEngine).remote(
        {row["input"]: responses(row["label"], k) for row, k in zip(rows, kinds)}
    )
    prompts, _, _ = prepare_datasets(strategy, tokenizer)
    generator = SamplesGenerator(
        strategy=strategy, prompts_dataloader=prompts, eval_dataloader=None, tokenizer=tokenizer, vllm_engines=[engine]
    )
    samples, _, _, _ = generator.generate_samples(**GENERATE)
    dropped = ("wrong",) if keep == "on" else ("right", "wrong")
    assert len(samples) == (6 - len(dropped)) * N_SAMPLES

    _, setpo, _, _ = makers(tiny_model, server.url, *scoped)
    shaped = setpo.compute_advantages_and_returns(after_model_forward(setpo.split_rollout_samples(samples)))
    kept_by_bonus = {float(value) for experience in shaped for value in experience.info.get("setpo/kept_by_bonus", [])}
    assert kept_by_bonus == ({1.0} if keep == "on" else set())
    # the mixed groups have 2 correct responses of 4: too few in scope; only the all-right group can be scored
    scored = {float(value) for experience in shaped for value in experience.info["setpo/scored_groups"]}
    assert scored == ({1.0} if keep == "on" else {0.0})


def test_setpo_train_runs_openrlhfs_train_and_its_trainer_actor_reports_setpo(tiny_model, prompt_file, tmp_path):
    """The whole path: setpo-train -> OpenRLHF's train() -> its ray.init (our hook) -> the PPOTrainer actor it
    builds. On CPU the run must stop at the first GPU step (the policy model actor); by then the trainer actor
    has built its experience maker and said so in its own log, which Ray prefixes with the actor's name.
    Both secrets come from the environment: neither is in the output (OpenRLHF prints its arguments), in W&B's
    files (offline: the run config it would upload) or in the Ray session's logs (runtime envs included)."""
    setpo_key, wandb_key = "setpo-secret-7d1e0a", "wandb-secret-0f9c33aa"
    with LocalServer(api_key=setpo_key) as keyed:
        command = [
            str(Path(sys.executable).with_name("setpo-train")),
            "--actor.model_name_or_path",
            tiny_model,
            "--actor.num_gpus_per_node",
            "1",
            "--ref.num_gpus_per_node",
            "1",
            "--algo.kl.init_coef",
            "0",
            "--data.prompt_dataset",
            str(prompt_file),
            "--data.input_key",
            "input",
            "--data.label_key",
            "label",
            "--reward.remote_url",
            str(reward_file("math")),
            "--algo.advantage.estimator",
            "group_norm",
            "--rollout.n_samples_per_prompt",
            "4",
            "--rollout.batch_size",
            "2",
            "--train.batch_size",
            "8",
            "--setpo.url",
            keyed.url,
            "--setpo.weight",
            "0.1",
            "--ckpt.output_dir",
            str(tmp_path / "ckpt"),
            "--logger.wandb.key",
            "env",
            "--logger.wandb.project",
            "setpo-test",
        ]
        # a new local cluster that pretends to have a GPU, so OpenRLHF's GPU actors get scheduled and fail there
        env = {
            **os.environ,
            "RAY_ADDRESS": "local",
            "RAY_OVERRIDE_RESOURCES": '{"GPU": 1, "CPU": 4}',
            "SETPO_API_KEY": setpo_key,
            "WANDB_API_KEY": wandb_key,
            "WANDB_MODE": "offline",
            "WANDB_DIR": str(tmp_path),
        }
        env.pop("RAY_RUNTIME_ENV_HOOK", None)
        run = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=420)
    output = run.stdout + run.stderr
    assert run.returncode != 0  # no GPU
    assert "PolicyModelActor.init_model_from_pretrained" in output, output[-3000:]
    trainer_lines = [line for line in output.splitlines() if "(PPOTrainer pid=" in line]
    assert any("SetPO experience maker active (lambda=0.1" in line for line in trainer_lines), output[-3000:]
    # W&B (offline) got OpenRLHF's arguments as the run's config: its log holds them, with the placeholders only
    (tracked,) = [path.read_text() for path in tmp_path.glob("wandb/offline-run-*/logs/debug.log")]
    assert "'setpo': namespace(" in tracked and "key='env'" in tracked and "api_key=None" in tracked
    written = [
        path for path in [*tmp_path.rglob("*"), *Path("/tmp/ray/session_latest/logs").rglob("*")] if path.is_file()
    ]
    for secret in (setpo_key, wandb_key):
        assert secret not in output
        assert not [str(path) for path in written if secret in path.read_text(errors="ignore")]

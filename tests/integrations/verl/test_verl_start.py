"""Start-up: veRL's real v1 trainer, built from veRL's own Hydra config, refuses to start with SetPO enabled
when SetPO could not work, before any worker starts; the key never reaches the config veRL prints and tracks."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import get_trainer_cls

from setpo_client import SetpoError
from setpo_client.integrations.verl.settings import setpo_settings, shaper_for
from setpo_client.integrations.verl.start import TESTED_RANGE, check_start
from setpo_server.local import LocalServer, free_port

from .conftest import ROOT_VENV_PYTHON

KEY = "verl-secret-key-5f2b9c"


def verl_config(*overrides):
    """veRL's own ppo_trainer config, as `python -m verl.trainer.main_ppo <overrides>` composes it."""
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=3", *overrides],
        )


def setpo(url, *more):
    return ["+algorithm.setpo.enable=true", f"+algorithm.setpo.url={url}", "+algorithm.setpo.ready_timeout=2", *more]


@pytest.fixture(scope="module")
def keyed_server():
    with LocalServer(command=[str(ROOT_VENV_PYTHON), "-m", "setpo_server.cli"], api_key=KEY) as running:
        yield running


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["actor_rollout_ref.rollout.n=2"], r"rollout.n >= 3"),
        (["algorithm.adv_estimator=gae"], r"group advantage estimator"),
        (["+algorithm.setpo.api_key=abc"], r"api_key is refused"),
        (["~algorithm.setpo.url"], r"needs \+algorithm.setpo.url=<setpo service URL>"),
    ],
    ids=["n<3", "not-a-group-estimator", "key-in-config", "no-url"],
)
def test_the_real_v1_trainer_refuses_settings_setpo_cannot_work_with(server, overrides, match):
    config = verl_config(*setpo(server.url), *overrides)
    with pytest.raises(ValueError, match=match):
        get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def test_the_real_v1_trainer_refuses_a_service_that_is_not_there_or_refuses_the_key(keyed_server, monkeypatch):
    trainer_class = get_trainer_cls("sync")
    with pytest.raises(SetpoError, match="not ready"):
        trainer_class(config=verl_config(*setpo(f"http://127.0.0.1:{free_port()}")))
    monkeypatch.setenv("SETPO_API_KEY", "the-old-key")
    with pytest.raises(SetpoError, match="401"):
        trainer_class(config=verl_config(*setpo(keyed_server.url, "+algorithm.setpo.weight=0.11")))


def test_a_trainer_whose_advantage_step_bypasses_the_plug_in_is_refused(server):
    class CustomTrainer(get_trainer_cls("sync")):  # a user's trainer with its own advantage step
        def _compute_advantage(self, batch, metrics):
            return batch

    with pytest.raises(RuntimeError, match="train without SetPO"):
        CustomTrainer(config=verl_config(*setpo(server.url)))


def test_a_good_start_logs_the_limits_and_the_key_appears_in_no_printed_config_or_log(
    keyed_server, monkeypatch, caplog, capsys
):
    monkeypatch.setenv("SETPO_API_KEY", KEY)
    config = verl_config(*setpo(keyed_server.url, "+algorithm.setpo.weight=0.12"))
    with caplog.at_level(logging.DEBUG):
        check_start(config, get_trainer_cls("sync"))
        print(OmegaConf.to_container(config, resolve=True))  # what veRL's TaskRunner prints and its trackers get
    assert any("SetPO on: lambda=0.12" in record.getMessage() for record in caplog.records)
    assert KEY not in capsys.readouterr().out + caplog.text


def test_a_plug_in_that_cannot_install_stops_a_run_that_enables_setpo():
    # veRL moved the method the plug-in wraps (as a later version may): with SetPO on the command line the
    # run must stop; without it, veRL runs on and only a warning says the plug-in is unavailable
    script = (
        "import importlib, sys\n"
        "import verl\n"
        "from verl.trainer.ppo.v1 import trainer_base\n"
        "del trainer_base.PPOTrainer._compute_advantage\n"
        "sys.argv[1:] = sys.argv[1:]\n"
        "importlib.import_module('setpo_client.integrations.verl')\n"
        "print('trained on')\n"
    )
    env = {
        **os.environ,
        "VERL_USE_EXTERNAL_PLUGINS": "none",
    }  # the plug-in is then loaded by the script, after the move
    on = subprocess.run(
        [sys.executable, "-c", script, "+algorithm.setpo.enable=true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert on.returncode != 0 and "SetPO is enabled" in on.stderr and "trained on" not in on.stdout
    off = subprocess.run(
        [sys.executable, "-c", script, "trainer.total_epochs=1"], env=env, capture_output=True, text=True, timeout=300
    )
    assert off.returncode == 0 and "trained on" in off.stdout and "could not install itself" in off.stderr


def test_a_verl_outside_the_tested_range_is_said_at_start(server, monkeypatch, caplog):
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with caplog.at_level(logging.WARNING, logger="setpo_client.verl"):
        check_start(verl_config(*setpo(server.url)), get_trainer_cls("sync"))
    assert "is tested with veRL >=0.9,<0.10 (setpo-client[verl]); this is 0.10.0" in caplog.text


def test_the_verl_extra_declares_the_range_the_plugin_accepts():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    extras = tomllib.loads((Path(__file__).parents[3] / "clients/python/pyproject.toml").read_text())
    required = [Requirement(r) for r in extras["project"]["optional-dependencies"]["verl"]]
    (declared,) = [requirement for requirement in required if requirement.name == "verl"]
    # one range: the extra's and the warning's
    assert declared.specifier == SpecifierSet(TESTED_RANGE)
    for version in ("0.9.0", "0.9.1", "0.9.5", "0.8.3", "0.10.0"):
        assert SpecifierSet(TESTED_RANGE).contains(version) == (version in declared.specifier)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["+algorithm.setpo.kernel=hybrid"], r"algorithm.setpo.kernel=hybrid compares solution keys"),
        (
            ["+algorithm.setpo.kernel=key", "+algorithm.setpo.key=countdown"],
            r"algorithm.setpo.key countdown: .*'countdown'",
        ),
        (
            ["+algorithm.setpo.kernel=key", "+algorithm.setpo.key=no_such_pkg:key"],
            r"algorithm.setpo.key no_such_pkg:key: .*cannot",
        ),
        (
            ["+algorithm.setpo.key=countdown_expression"],
            r"algorithm.setpo.key is used by \+algorithm.setpo.kernel=hybrid or key",
        ),
        (["+algorithm.setpo.kernel=cosine", "+algorithm.setpo.key=countdown_expression"], r"kernel must be one of"),
        (["+algorithm.setpo.normalize=std"], r"normalize must be one of"),
        (["+algorithm.setpo.min_reward=nan"], r"min_reward must be a finite number"),
        (["+algorithm.setpo.min_reward=high"], r"algorithm.setpo.min_reward must be a number"),
        (
            ["+algorithm.setpo.min_weight=0.1", "+algorithm.setpo.warmup_steps=5"],
            r"min_weight, .*warmup_steps .*target_ratio",
        ),
        (
            ["+algorithm.setpo.target_ratio=0.3", "+algorithm.setpo.weight_ema=1.5"],
            r"algorithm.setpo.weight_ema must be",
        ),
        (
            ["+algorithm.setpo.target_ratio=0.3", "+algorithm.setpo.warmup_steps=2.5"],
            r"warmup_steps must be an integer",
        ),
        (["+algorithm.setpo.target_ratio=-1"], r"target_ratio must be a finite number > 0"),
        (["+algorithm.setpo.target_ratio=0.3", "+algorithm.setpo.weight=0"], r"target_ratio steers lambda from"),
        (["+algorithm.setpo.target_ration=0.3"], r"algorithm.setpo.target_ration is not a SetPO setting"),
        (["+algorithm.setpo.advantage=max_rl"], r"\+algorithm.setpo.advantage must be one of .*maxrl.*, got 'max_rl'"),
        (
            ["+algorithm.setpo.combine=re-share"],
            r"\+algorithm.setpo.combine must be one of add, reshare, got 're-share'",
        ),
        (
            ["+algorithm.setpo.combine=reshare"],
            r"\+algorithm.setpo.combine=reshare .* \+algorithm.setpo.normalize=zscore",
        ),
        (["+algorithm.setpo.positive_weight=0"], r"\+algorithm.setpo.positive_weight must be a finite number > 0"),
        (["+algorithm.setpo.positive_weight=high"], r"\+algorithm.setpo.positive_weight must be a number"),
    ],
    ids=[
        "hybrid-without-key",
        "unknown-key-name",
        "key-module-missing",
        "key-with-embedding-kernel",
        "unknown-kernel",
        "unknown-normalize",
        "nan-min-reward",
        "text-min-reward",
        "controller-knobs-without-target",
        "ema-out-of-range",
        "fractional-warmup",
        "negative-target",
        "target-with-weight-0",
        "misspelt-setting",
        "misspelt-advantage",
        "misspelt-combine",
        "reshare-without-zscore",
        "positive-weight-0",
        "text-positive-weight",
    ],
)
def test_the_real_v1_trainer_refuses_a_diversity_policy_that_would_not_do_what_it_says(server, overrides, match):
    config = verl_config(*setpo(server.url), *overrides)
    with pytest.raises(ValueError, match=match):
        get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def test_a_full_diversity_policy_composes_from_the_command_line_and_is_logged_at_start(server, caplog):
    policy = [
        "+algorithm.setpo.min_reward=1.0",
        "+algorithm.setpo.key=setpo_client.keys:countdown_expression",  # module:function through Hydra's grammar
        "+algorithm.setpo.kernel=hybrid",
        "+algorithm.setpo.normalize=zscore",
        "+algorithm.setpo.target_ratio=0.3",
        "+algorithm.setpo.min_weight=0.01",
        "+algorithm.setpo.max_weight=2.0",
        "+algorithm.setpo.weight_ema=0.8",
        "+algorithm.setpo.warmup_steps=10",
        "+algorithm.setpo.freeze_after=200",
    ]
    config = verl_config(*setpo(server.url, "+algorithm.setpo.weight=0.13", *policy))
    with caplog.at_level(logging.INFO, logger="setpo_client.verl"):
        check_start(config, get_trainer_cls("sync"))
    shaper = shaper_for(setpo_settings(config.algorithm))
    controller = shaper.controller
    assert (shaper.min_reward, shaper.key("<answer>2*(5+3)</answer>"), shaper.kernel, shaper.normalize) == (
        1.0,
        "countdown:mul(2,add(3,5))",
        "hybrid",
        "zscore",
    )
    assert (controller.target_ratio, controller.min_weight, controller.max_weight, controller.ema) == (
        0.3,
        0.01,
        2.0,
        0.8,
    )
    assert (controller.warmup_steps, controller.freeze_after, shaper.weight) == (10, 200, 0.13)
    assert "min_reward=1.0 key=setpo_client.keys:countdown_expression kernel=hybrid normalize=zscore" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.agent.default_agent_loop=my_loop"], True),
        (["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.agent.agent_loop_config_path=loops.yaml"], True),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.agent.default_agent_loop=my_loop"], False),
        (["algorithm.adv_estimator=rloo"], False),  # veRL's own loops: one output a session
    ],
)
def test_a_custom_agent_loop_under_a_per_output_estimator_is_warned_with_both_numbers(
    server, caplog, overrides, warned
):
    """Under rloo and the other per-output estimators a group holds rollout.n x the outputs of a session, which
    veRL's config does not give: start() can prove only rollout.n, so the start says what else can happen."""
    config = verl_config(*overrides, *setpo(server.url))
    with caplog.at_level(logging.INFO, logger="setpo_client.verl"):
        check_start(config, get_trainer_cls("sync"))
    said = "a group holds actor_rollout_ref.rollout.n=3 x the outputs a session returns; the service takes at most"
    assert (said in caplog.text) == warned


def test_embed_span_composes_from_the_command_line_through_hydras_grammar(server, caplog):
    span = "+algorithm.setpo.embed_span='<answer>(.*?)</answer>'"  # quoted: Hydra's grammar has ( ) and ?
    config = verl_config(*setpo(server.url, "+algorithm.setpo.min_reward=1.0", span))
    with caplog.at_level(logging.INFO, logger="setpo_client.verl"):
        check_start(config, get_trainer_cls("sync"))
    assert shaper_for(setpo_settings(config.algorithm)).embed_span.pattern == "<answer>(.*?)</answer>"
    assert "embed_span=<answer>(.*?)</answer>" in caplog.text
    keyed = verl_config(
        *setpo(server.url, span, "+algorithm.setpo.kernel=key", "+algorithm.setpo.key=countdown_expression")
    )
    with pytest.raises(
        ValueError, match=r"\+algorithm.setpo.embed_span chooses what is embedded; \+algorithm.setpo.kernel=key"
    ):
        get_trainer_cls(keyed.trainer.v1.trainer_mode)(config=keyed)


def test_several_replicas_and_in_flight_compose_from_the_command_line_and_a_bad_in_flight_is_refused():
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]  # nothing is asked of them: shaper_for only builds
    both = ",".join(urls)
    for spelled in (f"'{both}'", f"[{both}]"):  # quoted (a bare comma is a Hydra sweep), or Hydra's list
        config = verl_config(*setpo(spelled, "+algorithm.setpo.in_flight=4"))
        shaper = shaper_for(setpo_settings(config.algorithm))
        assert shaper.in_flight == 4 and shaper.client.urls == urls
    assert shaper_for({"enable": True, "url": both}).in_flight is None  # SetpoShaper's default: one per replica
    for bad in ("four", "0", "1.5"):
        config = verl_config(*setpo(f"'{both}'", f"+algorithm.setpo.in_flight={bad}"))
        with pytest.raises(ValueError, match=r"\+algorithm\.setpo\.in_flight must be"):
            shaper_for(setpo_settings(config.algorithm))


def test_veRLs_legacy_trainers_are_refused_at_start_naming_use_v1(server):
    # veRL 0.9 deprecates its legacy trainer (trainer.use_v1=false) and the plug-in hooks only the v1 one: a legacy
    # run with SetPO on would train without it. Refused before the settings are read (tokenizer was its setting).
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = verl_config("trainer.use_v1=false", *setpo(server.url), "+algorithm.setpo.tokenizer=/models/qwen")
    for trainer_class in (RayPPOTrainer, SeparateRayPPOTrainer):
        with pytest.raises(RuntimeError, match=r"not veRL's v1 trainer.*Set trainer\.use_v1=True"):
            trainer_class(config=config, tokenizer=None, role_worker_mapping={}, resource_pool_manager=None)


def response_to_nested_moves(monkeypatch):
    from verl.workers.utils import padding

    monkeypatch.delattr(padding, "response_to_nested")


def the_padding_tag_is_renamed(monkeypatch):
    from verl.trainer.ppo import padding_utils

    real = padding_utils.construct_minimal_padding_template

    def renamed(*args, **kwargs):
        sample, tag = real(*args, **kwargs)
        tag["synthetic"] = tag.pop("is_padding")
        return sample, tag

    monkeypatch.setattr(padding_utils, "construct_minimal_padding_template", renamed)


def grpo_finds_a_sessions_final_output_another_way(monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base, utils

    def by_tag(data, batch_keys, adv_estimator, **kwargs):  # a release that reads sessions from tags, not keys
        return utils.compute_advantage(data, adv_estimator=adv_estimator, **kwargs)

    monkeypatch.setattr(trainer_base, "compute_advantage_for_multi_trajectories", by_tag)


def grpo_reads_keys_of_another_form(monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base

    real = trainer_base.compute_advantage_for_multi_trajectories

    def four_parts(data, batch_keys, adv_estimator, **kwargs):  # a release that keys each turn of a session too
        for key in batch_keys:
            assert len(key.rsplit("_", 3)) == 4, f"Unexpected key format: {key}"
        return real(data, batch_keys, adv_estimator, **kwargs)

    monkeypatch.setattr(trainer_base, "compute_advantage_for_multi_trajectories", four_parts)


def grpo_ranks_a_session_by_its_first_output(monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base

    real = trainer_base.compute_advantage_for_multi_trajectories

    def first(data, batch_keys, adv_estimator, **kwargs):  # output indices counted down: the first one is final
        flipped = [f"{key.rsplit('_', 1)[0]}_{-int(key.rsplit('_', 1)[1])}" for key in batch_keys]
        return real(data, flipped, adv_estimator, **kwargs)

    monkeypatch.setattr(trainer_base, "compute_advantage_for_multi_trajectories", first)


@pytest.mark.parametrize(
    "change,match",
    [
        (grpo_finds_a_sessions_final_output_another_way, r"\{uid\}_\{session_id\}_\{index\}"),
        (grpo_reads_keys_of_another_form, r"GRPO step failed on a multi-output session.*Unexpected key format"),
        (grpo_ranks_a_session_by_its_first_output, r"\{uid\}_\{session_id\}_\{index\}"),
        (response_to_nested_moves, r"verl.workers.utils.padding.response_to_nested"),
        (the_padding_tag_is_renamed, r"is_padding"),
    ],
    ids=[
        "grpo-session-reading",
        "grpo-key-format",
        "grpo-final-output",
        "response_to_nested-moved",
        "padding-tag-renamed",
    ],
)
def test_a_verl_whose_internals_the_plug_in_relies_on_moved_is_refused_at_start(server, monkeypatch, change, match):
    change(monkeypatch)  # what a later veRL release may do
    with pytest.raises(RuntimeError, match=match):
        get_trainer_cls("sync")(config=verl_config(*setpo(server.url)))

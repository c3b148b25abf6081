"""Start-up: veRL's real v1 trainer, built from veRL's own Hydra config, refuses to start with SetPO enabled
when SetPO could not work, before any worker starts; the key never reaches the config veRL prints and tracks."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import get_trainer_cls

from setpo_client import SetpoError
from setpo_client.integrations.verl import check_start
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
    ],
    ids=["n<3", "not-a-group-estimator", "key-in-config"],
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
    assert "tested with veRL 0.9.x; this is 0.10.0" in caplog.text

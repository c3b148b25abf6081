"""setpo-train's command line: OpenRLHF's flags unchanged plus --setpo.*, and every mistake stopped before
Ray or a GPU is touched; the recipes' flags pass OpenRLHF's own checks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.utils import get_strategy
from openrlhf.utils.utils import get_tokenizer

from setpo_server.local import LocalServer, free_port
from setpo_trainer.openrlhf import cli, ray_hook
from setpo_trainer.openrlhf.experience_maker import SetpoExperienceMaker
from tests.trainer.conftest import PLACEHOLDERS
from tests.trainer.rollouts import DIVERSITY_POLICY, SETTINGS, makers, train_args

RECIPES = Path(__file__).parents[2] / "services" / "trainer" / "recipes"
BIN = Path(sys.executable).parent


def base_flags(tiny_model: str, url: str) -> list[str]:
    return [
        "--actor.model_name_or_path",
        tiny_model,
        "--algo.advantage.estimator",
        "group_norm",
        "--rollout.n_samples_per_prompt",
        "4",
        "--rollout.batch_size",
        "8",
        "--setpo.url",
        url,
    ]


def error_of(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args(argv)
    assert stopped.value.code not in (0, None)
    return str(stopped.value.code) + capsys.readouterr().err


def test_help_lists_every_openrlhf_flag_and_ours(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.parse_args(["--help"])
    assert stopped.value.code == 0
    shown = capsys.readouterr().out
    openrlhf_flags = [flag for action in cli.openrlhf_parser()._actions for flag in action.option_strings]
    assert len(openrlhf_flags) > 150 and all(flag in shown for flag in openrlhf_flags)
    for ours in (
        "--setpo.url",
        "--setpo.weight",
        "--setpo.api_key",
        "--setpo.timeout",
        "--setpo.max_retries",
        "--setpo.in_flight",
        "--setpo.on_error",
        "--setpo.embed",
        "--setpo.max_chars",
        "--setpo.check_only",
        "--setpo.ready_timeout",
        "--setpo.min_reward",
        "--setpo.key",
        "--setpo.kernel",
        "--setpo.normalize",
        "--setpo.target_ratio",
        "--setpo.min_weight",
        "--setpo.max_weight",
        "--setpo.weight_ema",
        "--setpo.warmup_steps",
        "--setpo.freeze_after",
        "--setpo.advantage",
        "--setpo.positive_weight",
        "--setpo.combine",
    ):
        assert ours in shown


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--setpo.weight", "-1"], "argument --setpo.weight: must be >= 0, got -1"),
        (["--setpo.weight", "nan"], "argument --setpo.weight: must be >= 0, got nan"),
        (["--setpo.timeout", "0"], "argument --setpo.timeout: must be > 0"),
        (["--setpo.max_retries", "-2"], "argument --setpo.max_retries: must be >= 0"),
        (["--setpo.max_chars", "0"], "argument --setpo.max_chars: must be > 0"),
        (["--setpo.on_error", "retry"], "argument --setpo.on_error: invalid choice: 'retry'"),
        (["--setpo.embed", "prompt"], "argument --setpo.embed: invalid choice: 'prompt'"),
        (["--setpo.wieght", "0.1"], "unrecognized arguments: --setpo.wieght"),
        (
            ["--actor.policy_loss_type", "grpo"],
            "argument --actor.policy_loss_type: invalid choice: 'grpo'",
        ),  # OpenRLHF's own check
        (["--algo.advantage.estimator", "gae"], "SetPO needs a group advantage estimator"),
        (["--rollout.n_samples_per_prompt", "2"], "needs --rollout.n_samples_per_prompt >= 3"),
        (["--setpo.max_chars", "200000"], "the service takes texts of at most 100000 characters"),
        (["--setpo.url", "http://setpo:80o0"], "--setpo.url: setpo service URL 'http://setpo:80o0': Invalid port"),
    ],
)
def test_bad_values_fail_with_a_message_naming_them(flags, message, capsys, tiny_model, server):
    assert message in error_of(capsys, base_flags(tiny_model, server.url) + flags)


def test_diversity_policy_flags_reach_the_trainer_args_through_openrlhfs_hierarchize(tiny_model, server):
    paper = train_args(*base_flags(tiny_model, server.url)).setpo
    assert (paper.min_reward, paper.key, paper.kernel, paper.normalize, paper.target_ratio) == (
        None,
        None,
        "embedding",
        "none",
        None,
    )  # the paper's form: the whole group, embeddings, raw marginals, a fixed lambda
    assert (paper.min_weight, paper.max_weight, paper.weight_ema, paper.warmup_steps, paper.freeze_after) == (
        1e-3,
        10.0,
        0.9,
        0,
        None,
    )  # WeightController's own defaults
    scoped = train_args(*base_flags(tiny_model, server.url), *DIVERSITY_POLICY).setpo
    assert vars(scoped) == vars(paper) | {
        "min_reward": 1.0,
        "key": "countdown_expression",
        "kernel": "hybrid",
        "normalize": "zscore",
        "target_ratio": 0.3,
        "min_weight": 0.01,
        "max_weight": 2.0,
        "weight_ema": 0.5,
        "warmup_steps": 3,
        "freeze_after": 100,
    }


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--setpo.key", "no_such_key"], "--setpo.key no_such_key: key function 'no_such_key': give one of"),
        (["--setpo.key", "os:no_such_function"], "--setpo.key os:no_such_function: key function"),
        (["--setpo.key", "os:sep"], "--setpo.key os:sep: key function 'os:sep' is not callable"),
        (["--setpo.kernel", "hybrid"], "--setpo.kernel=hybrid compares solution keys: give --setpo.key"),
        (["--setpo.kernel", "key"], "--setpo.kernel=key compares solution keys: give --setpo.key"),
        (["--setpo.key", "countdown_expression"], "--setpo.key is used by --setpo.kernel=hybrid or key"),
        (["--setpo.kernel", "cosine"], "argument --setpo.kernel: invalid choice: 'cosine'"),
        (["--setpo.normalize", "l2"], "argument --setpo.normalize: invalid choice: 'l2'"),
        (["--setpo.min_reward", "nan"], "--setpo.min_reward must be a finite number, got nan"),
        (["--setpo.min_reward", "inf"], "--setpo.min_reward must be a finite number, got inf"),
        (["--setpo.target_ratio", "0"], "argument --setpo.target_ratio: must be > 0, got 0"),
        (["--setpo.target_ratio", "-0.3"], "argument --setpo.target_ratio: must be > 0, got -0.3"),
        (["--setpo.target_ratio", "nan"], "argument --setpo.target_ratio: must be > 0, got nan"),
        (["--setpo.target_ratio", "inf"], "argument --setpo.target_ratio: must be finite, got inf"),
        (["--setpo.target_ratio", "0.3", "--setpo.min_weight", "0"], "argument --setpo.min_weight: must be > 0"),
        (["--setpo.target_ratio", "0.3", "--setpo.max_weight", "-1"], "argument --setpo.max_weight: must be > 0"),
        (
            ["--setpo.target_ratio", "0.3", "--setpo.min_weight", "2", "--setpo.max_weight", "1"],
            "--setpo.min_weight 2.0 is above --setpo.max_weight 1.0",
        ),
        (["--setpo.target_ratio", "0.3", "--setpo.weight_ema", "1"], "--setpo.weight_ema must be in [0, 1), got 1.0"),
        (["--setpo.target_ratio", "0.3", "--setpo.weight_ema", "-0.1"], "--setpo.weight_ema must be in [0, 1)"),
        (["--setpo.target_ratio", "0.3", "--setpo.warmup_steps", "-1"], "argument --setpo.warmup_steps: must be >= 0"),
        (["--setpo.target_ratio", "0.3", "--setpo.freeze_after", "-1"], "argument --setpo.freeze_after: must be >= 0"),
        (["--setpo.target_ratio", "0.3", "--setpo.warmup_steps", "1.5"], "argument --setpo.warmup_steps: invalid"),
        (
            ["--setpo.max_weight", "2", "--setpo.warmup_steps", "5"],
            "--setpo.max_weight, --setpo.warmup_steps steer lambda: they need --setpo.target_ratio",
        ),
        (
            ["--setpo.target_ratio", "0.3", "--setpo.weight", "0"],
            "--setpo.target_ratio steers lambda from --setpo.weight, the first step's lambda: it must be > 0",
        ),
        (["--setpo.timeout", "inf"], "argument --setpo.timeout: must be finite, got inf"),
        (["--setpo.advantage", "grpo"], "argument --setpo.advantage: invalid choice: 'grpo'"),
        (["--setpo.positive_weight", "0"], "argument --setpo.positive_weight: must be > 0, got 0"),
        (["--setpo.combine", "reshare"], "--setpo.combine=reshare weighs members by 1 + lambda * z-scored marginal"),
        (
            ["--setpo.advantage", "maxrl", "--setpo.weight", "0", "--algo.advantage.estimator", "reinforce"],
            "--setpo.advantage maxrl replaces a group estimator's advantage, on groups of a prompt's samples: set "
            "--algo.advantage.estimator to one of group_norm, dr_grpo, rloo, reinforce_baseline (got reinforce)",
        ),
    ],
)
def test_bad_diversity_policy_values_are_refused_naming_their_flag(flags, message, capsys, tiny_model, server):
    assert message in error_of(capsys, base_flags(tiny_model, server.url) + flags)


def test_no_service_is_a_clear_error_before_ray_starts(capsys, tiny_model, monkeypatch):
    monkeypatch.delenv("SETPO_URL", raising=False)
    assert "--setpo.weight > 0 needs the service: pass --setpo.url" in error_of(capsys, base_flags(tiny_model, "")[:-2])
    down = f"http://127.0.0.1:{free_port()}"
    error = error_of(capsys, base_flags(tiny_model, down) + ["--setpo.ready_timeout", "1"])
    assert f"the SetPO service at {down} is not usable" in error and "--setpo.weight 0" in error
    assert not ray.is_initialized()
    # lambda = 0 is plain OpenRLHF, or OpenRLHF on a base the experience maker computes: no service needed
    assert cli.parse_args(base_flags(tiny_model, down) + ["--setpo.weight", "0"])
    assert cli.parse_args(base_flags(tiny_model, down) + ["--setpo.weight", "0", "--setpo.advantage", "maxrl"])


def test_key_and_limits_are_checked_against_the_service(capsys, tiny_model, monkeypatch):
    with LocalServer(api_key="right-key", max_groups=2, max_group_size=3) as guarded:
        monkeypatch.setenv("SETPO_API_KEY", "wrong-key")
        error = error_of(capsys, base_flags(tiny_model, guarded.url))
        assert "not usable" in error and "missing or wrong API key" in error
        monkeypatch.setenv("SETPO_API_KEY", "right-key")
        # groups of 4 the service never scores: refused; 4 groups a step for 2 a request: split by SetpoShaper, fine
        error = error_of(capsys, base_flags(tiny_model, guarded.url))
        assert "groups of 4 responses" in error and "SETPO_MAX_GROUP_SIZE" in error
        assert cli.parse_args(
            base_flags(tiny_model, guarded.url) + ["--rollout.n_samples_per_prompt", "3", "--rollout.batch_size", "4"]
        )
    # the Ray job's runtime env gets SetPO's setup hook and no secret (Ray logs runtime envs and lists them)
    assert ray_hook.add_worker_setup({"env_vars": {"A": "1"}}) == {
        "env_vars": {"A": "1"},
        "worker_process_setup_hook": ray_hook.SETUP_HOOK,
    }


@pytest.mark.parametrize("min_reward", ["1.0", "0.5"])
def test_keep_groups_lifts_dapos_top_whatever_min_reward(capsys, tiny_model, server, min_reward):
    """An all-correct group's mean is the rewards' top: with min_reward at it or below it (0.5 with 0/1 rewards),
    DAPO's filter (low < mean < high) would drop the groups the scoped form exists for; the top is lifted (OpenRLHF's
    real filter then keeps them: test_ray_trainer.py)."""
    dapo = ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1"]
    args = train_args(*base_flags(tiny_model, server.url), *dapo, "--setpo.min_reward", min_reward)
    assert list(args.algo.dynamic_filtering_range) == [0.0, float("inf")]
    assert "--algo.dynamic_filtering_range 0.0 1.0 -> 0.0 inf" in capsys.readouterr().out


def test_under_reshare_keep_groups_follows_the_base_equal_rewards_have_a_push_to_reshare_under(
    capsys, tiny_model, server
):
    """combine=reshare only re-shares a positive advantage: a group of equal rewards has one under w_reinforce alone
    (all correct: +positive_weight each), so there keep_groups stays on by default; under the framework's or MaxRL's
    base it would keep groups that train on nothing: off by default, and refused when asked for."""
    dapo = ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1"]
    reshare = ["--setpo.min_reward", "1.0", "--setpo.normalize", "zscore", "--setpo.combine", "reshare"]
    flags = [*base_flags(tiny_model, server.url), *dapo, *reshare]
    assert list(train_args(*flags, "--setpo.advantage", "maxrl").algo.dynamic_filtering_range) == [0.0, 1.0]
    lifted = train_args(*flags, "--setpo.advantage", "w_reinforce").algo.dynamic_filtering_range
    assert list(lifted) == [0.0, float("inf")]
    capsys.readouterr()
    error = error_of(capsys, [*flags, "--setpo.advantage", "maxrl", "--setpo.keep_groups", "on"])
    assert "--setpo.keep_groups keeps groups of equal rewards" in error and "--setpo.combine=reshare" in error


def test_a_trainer_worker_without_the_key_the_start_checked_stops_at_its_start(tiny_model, server, monkeypatch):
    """Ray workers get the environment their `ray start` had, not the driver's: a start check that passed with the
    driver's SETPO_API_KEY says nothing of theirs. A worker without it that the service refuses stops at once,
    saying where to set it (not a whole run at lambda 0); one the service does not ask a key of goes on."""

    def trainer_side(url: str) -> None:  # setpo-train's checks with the key, then the trainer actor without it
        monkeypatch.setenv("SETPO_API_KEY", "right-key")
        args = train_args(*base_flags(tiny_model, url))
        monkeypatch.delenv("SETPO_API_KEY")
        strategy = get_strategy(args)
        tokenizer = get_tokenizer(tiny_model, None, "left", strategy)
        SetpoExperienceMaker(None, None, None, None, FixedKLController(0.0), strategy, tokenizer)

    with LocalServer(api_key="right-key") as guarded, pytest.raises(RuntimeError, match="`ray start`'s environment"):
        trainer_side(guarded.url)
    trainer_side(server.url)  # no key asked: nothing to stop for


def test_in_flight_and_several_replicas_pass_the_checks_and_reach_the_experience_maker(capsys, tiny_model, server):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the start needs only one replica ready
    replicas = f"{server.url},{down}"
    assert cli.parse_args(base_flags(tiny_model, replicas) + ["--setpo.in_flight", "3"])
    assert f"at {replicas}" in capsys.readouterr().out  # the limits of the replica that answered
    assert train_args(*base_flags(tiny_model, server.url)).setpo.in_flight is None  # SetpoShaper's default
    _, maker, _, _ = makers(tiny_model, replicas, *SETTINGS["grpo"], "--setpo.in_flight", "3")
    assert maker.setpo.in_flight == 3 and maker.setpo.client.urls == [server.url, down]
    for bad, message in (("0", "must be > 0, got 0"), ("-2", "must be > 0, got -2"), ("1.5", "invalid")):
        flags = base_flags(tiny_model, server.url) + ["--setpo.in_flight", bad]
        assert f"argument --setpo.in_flight: {message}" in error_of(capsys, flags)
    twice = base_flags(tiny_model, f"{server.url},{server.url}")
    assert "--setpo.url: setpo service URL(s)" in error_of(capsys, twice)


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--setpo.api_key", "right-key"], "--setpo.api_key is refused"),
        (["--logger.wandb.key", "wandb-secret"], "--logger.wandb.key <key> is refused"),
    ],
    ids=["setpo-key", "wandb-key"],
)
def test_a_secret_on_the_command_line_is_refused(capsys, tiny_model, server, flags, match):
    error = error_of(capsys, base_flags(tiny_model, server.url) + flags)
    assert match in error and "right-key" not in error and "wandb-secret" not in error


def test_check_only_runs_openrlhfs_own_checks_and_stops_before_ray(capsys, tiny_model, server, monkeypatch):
    monkeypatch.setenv("RAY_RUNTIME_ENV_HOOK", ray_hook.RUNTIME_ENV_HOOK)
    cli.main(base_flags(tiny_model, server.url) + ["--setpo.check_only"])
    assert "the arguments check out" in capsys.readouterr().out and not ray.is_initialized()
    with pytest.raises(
        AssertionError, match="remote_rm_url or agent_func_path must be specified when using dynamic filtering"
    ):
        cli.main(base_flags(tiny_model, server.url) + ["--setpo.check_only", "--algo.dynamic_filtering_enable"])


def test_a_ray_runtime_env_hook_already_set_is_chained(tiny_model, server, monkeypatch):
    monkeypatch.setenv("RAY_RUNTIME_ENV_HOOK", "tests.trainer.rollouts.site_runtime_env_hook")
    monkeypatch.delenv(ray_hook.CHAINED_HOOK_VARIABLE, raising=False)
    cli.main(base_flags(tiny_model, server.url) + ["--setpo.check_only"])
    assert os.environ["RAY_RUNTIME_ENV_HOOK"] == ray_hook.RUNTIME_ENV_HOOK
    # the site's hook runs first, then ours adds the setup hook
    assert ray_hook.add_worker_setup({"env_vars": {"A": "1"}}) == {
        "env_vars": {"A": "1", "SITE_HOOK": "ran"},
        "worker_process_setup_hook": ray_hook.SETUP_HOOK,
    }
    with pytest.raises(RuntimeError, match="already has a worker_process_setup_hook"):
        ray_hook.add_worker_setup({"worker_process_setup_hook": "mine.setup"})


def test_under_uv_run_the_job_still_gets_the_setup_hook_and_uvs_environment(tiny_model, server, tmp_path):
    """Ray, when the driver runs under `uv run`, calls its own uv hook *instead of* RAY_RUNTIME_ENV_HOOK: setpo-train
    trained plain OpenRLHF there, silently. The real uv and Ray: the job gets SetPO's setup hook and uv's interpreter."""
    driver = tmp_path / "driver.py"  # setpo-train's setup (checks only), then OpenRLHF's ray.init, under `uv run`
    driver.write_text(
        """
import json, sys, ray
from setpo_trainer.openrlhf import cli
cli.main(json.loads(sys.argv[1]))
ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})  # as openrlhf.cli.train_ppo_ray.train
print("RUNTIME_ENV", json.dumps(ray.get_runtime_context().runtime_env))
ray.shutdown()
"""
    )
    flags = json.dumps(base_flags(tiny_model, server.url) + ["--setpo.check_only"])
    env = {**os.environ, "RAY_ADDRESS": "local", "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    env.pop("RAY_RUNTIME_ENV_HOOK", None)
    uv_run = [str(BIN / "uv"), "run", "--no-project", "--offline", "--python", sys.executable, "--"]
    run = subprocess.run(
        [*uv_run, sys.executable, str(driver), flags],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "RUNTIME_ENV " in run.stdout, run.stderr[-3000:]
    runtime_env = json.loads(run.stdout.split("RUNTIME_ENV ", 1)[1].splitlines()[0])
    assert runtime_env["worker_process_setup_hook"] == ray_hook.SETUP_HOOK
    assert runtime_env["py_executable"].startswith(" ".join(uv_run[:2]))  # Ray's uv propagation, kept
    assert runtime_env["env_vars"]["TOKENIZERS_PARALLELISM"] == "true"


def test_without_vllm_setpo_train_says_what_to_install_and_still_answers_help_and_version():
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"].replace(PLACEHOLDERS, "")}

    def setpo_train(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "setpo-train"), *argv], env=env, capture_output=True, text=True, timeout=300)

    run = setpo_train("--setpo.check_only")
    assert run.returncode == 1 and "cannot import OpenRLHF's trainer (No module named 'vllm')" in run.stderr
    run = setpo_train("--help")  # SetPO's flags, and what to install for OpenRLHF's
    assert run.returncode == 0 and "--setpo.weight" in run.stdout
    assert "cannot import OpenRLHF's trainer (No module named 'vllm')" in " ".join(run.stdout.split())
    run = setpo_train("--version")
    assert run.returncode == 0 and run.stdout.startswith("setpo-train ") and "(openrlhf 0.11.2)" in run.stdout


RECIPE_ENV = {
    "grpo_gsm8k.sh": {},
    "gspo_gsm8k.sh": {},
    "dapo_gsm8k.sh": {},
    "math_hard_32b.sh": {},
    "countdown_grpo.sh": {"ROLLOUTS": "7", "KL": "0.005"},
}


def recipe_under_bash(name: str, env: dict, *args: str, path: str = str(BIN)) -> subprocess.CompletedProcess:
    """The recipe under bash with `path` (this venv's setpo-train and python) first on PATH; None removes a variable."""
    env = {**os.environ, "PATH": f"{path}{os.pathsep}{os.environ['PATH']}", **env}
    env = {key: value for key, value in env.items() if value is not None}
    return subprocess.run(["bash", str(RECIPES / name), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def run_recipe(tmp_path, monkeypatch, capsys):
    """The recipe under bash up to its closing `exec setpo-train ...`, whose arguments a stand-in on PATH records;
    then setpo-train's own main on them here, in the recipe's environment: the same checks, without a process that
    imports OpenRLHF's trainer again (its cost: docs/development.md). The real binary: test_a_recipe_execs_setpo_train."""
    stand_in, recorded = tmp_path / "stand-in", tmp_path / "setpo-train-argv"
    stand_in.mkdir()
    (stand_in / "setpo-train").write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "{recorded}"\n')
    (stand_in / "setpo-train").chmod(0o755)

    def run(name: str, env: dict, *args: str) -> subprocess.CompletedProcess:
        recorded.unlink(missing_ok=True)
        bash = recipe_under_bash(name, env, *args, path=f"{stand_in}{os.pathsep}{BIN}")
        if bash.returncode != 0 or not recorded.exists():  # the recipe stopped before setpo-train
            return bash
        capsys.readouterr()
        with monkeypatch.context() as patch:  # the recipe's environment, and what main sets in it, undone after
            for key, value in {**env, "RAY_RUNTIME_ENV_HOOK": None, ray_hook.CHAINED_HOOK_VARIABLE: None}.items():
                if value is None:
                    patch.delenv(key, raising=False)
                else:
                    patch.setenv(key, value)
            code: object = None
            try:
                cli.main(recorded.read_text().split("\0")[:-1])
            except SystemExit as stopped:
                code = stopped.code
        out, err = capsys.readouterr()
        if isinstance(code, int) or code is None:  # as Python exits: None is 0, an int the status, else printed and 1
            return subprocess.CompletedProcess(bash.args, code or 0, bash.stdout + out, bash.stderr + err)
        return subprocess.CompletedProcess(bash.args, 1, bash.stdout + out, f"{bash.stderr}{err}{code}\n")

    return run


def test_a_recipe_execs_setpo_train(tiny_model, server, tmp_path):
    """The one recipe run through the real setpo-train process: the others record its arguments (run_recipe)."""
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    run = recipe_under_bash("grpo_gsm8k.sh", env, "--setpo.check_only")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"at {server.url}" in run.stdout and RECOMMENDED_KEYLESS in run.stdout
    assert "the arguments check out" in run.stdout


def test_every_recipe_is_there():
    assert sorted(path.name for path in RECIPES.glob("*.sh") if path.name != "common.sh") == sorted(RECIPE_ENV)


@pytest.mark.parametrize("recipe", RECIPE_ENV)
def test_recipe_flags_pass_openrlhfs_and_setpos_checks(recipe, tiny_model, server, tmp_path, run_recipe):
    env = {
        "MODEL_PATH": tiny_model,
        "DATA_PATH": str(tmp_path / "prompts.jsonl"),
        "SETPO_URL": server.url,
        "SAVE_PATH": str(tmp_path),
        **RECIPE_ENV[recipe],
    }
    run = run_recipe(recipe, env, "--setpo.check_only")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "the arguments check out" in run.stdout and f"at {server.url}" in run.stdout
    # the paper's form unless the environment asks for more; Countdown has a solution key: experiment v2's form;
    # GRPO on GSM8K has none: experiment v3's keyless form
    recommended = {"countdown_grpo.sh": RECOMMENDED_COUNTDOWN, "grpo_gsm8k.sh": RECOMMENDED_KEYLESS}
    assert recommended.get(recipe, PAPER_FORM) in run.stdout

    run = run_recipe(recipe, {**env, "SETPO_URL": None})
    assert run.returncode == 2 and f"{recipe[:-3]}: set SETPO_URL" in run.stderr


PAPER_FORM = (
    "setpo-train: diversity policy: min_reward=None key=None kernel=embedding normalize=none embed_span=None "
    "advantage=framework positive_weight=0.1 combine=add "
    "target_ratio=None min_weight=0.001 max_weight=10.0 weight_ema=0.9 warmup_steps=0 freeze_after=None"
)
RECOMMENDED_COUNTDOWN = (
    "setpo-train: diversity policy: min_reward=1.0 key=countdown_expression kernel=hybrid normalize=zscore embed_span=None "
    "advantage=framework positive_weight=0.1 combine=add "
    "target_ratio=0.5 min_weight=0.001 max_weight=10.0 weight_ema=0.9 warmup_steps=0 freeze_after=None"
)
RECOMMENDED_KEYLESS = (
    "setpo-train: diversity policy: min_reward=1.0 key=None kernel=embedding normalize=zscore embed_span=None "
    "advantage=framework positive_weight=0.1 combine=add "
    "target_ratio=0.7 min_weight=0.001 max_weight=10.0 weight_ema=0.9 warmup_steps=0 freeze_after=None"
)
SCOPED_FORM = {
    "SETPO_MIN_REWARD": "1.0",
    "SETPO_KEY": "countdown_expression",
    "SETPO_KERNEL": "hybrid",
    "SETPO_NORMALIZE": "zscore",
    "SETPO_TARGET_RATIO": "0.3",
    "SETPO_MIN_WEIGHT": "0.01",
    "SETPO_MAX_WEIGHT": "2",
    "SETPO_WEIGHT_EMA": "0.5",
    "SETPO_WARMUP_STEPS": "3",
    "SETPO_FREEZE_AFTER": "100",
}


@pytest.mark.parametrize("recipe", RECIPE_ENV)
def test_recipes_take_the_diversity_policy_from_the_environment(recipe, tiny_model, server, tmp_path, run_recipe):
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    run = run_recipe(recipe, {**env, **RECIPE_ENV[recipe], **SCOPED_FORM}, "--setpo.check_only")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (
        "setpo-train: diversity policy: min_reward=1.0 key=countdown_expression kernel=hybrid normalize=zscore embed_span=None "
        "advantage=framework positive_weight=0.1 combine=add "
        "target_ratio=0.3 min_weight=0.01 max_weight=2.0 weight_ema=0.5 warmup_steps=3 freeze_after=100"
    ) in run.stdout
    assert "the arguments check out" in run.stdout


def test_recipes_take_the_base_and_its_combination_from_the_environment(tiny_model, server, tmp_path, run_recipe):
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    base = {"SETPO_ADVANTAGE": "w_reinforce", "SETPO_POSITIVE_WEIGHT": "0.2", "SETPO_COMBINE": "reshare"}
    run = run_recipe("grpo_gsm8k.sh", {**env, **base, "SETPO_NORMALIZE": "zscore"}, "--setpo.check_only")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "normalize=zscore embed_span=None advantage=w_reinforce positive_weight=0.2 combine=reshare" in run.stdout


def test_an_empty_variable_passes_no_flag_and_an_argument_wins(tiny_model, server, tmp_path, run_recipe):
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    policy = {"SETPO_KERNEL": "", "SETPO_NORMALIZE": "zscore"}  # an empty kernel would be an invalid choice
    policy |= {"SETPO_FORM": "paper"}
    run = run_recipe("grpo_gsm8k.sh", {**env, **policy}, "--setpo.normalize", "none", "--setpo.check_only")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert PAPER_FORM in run.stdout


def test_a_recipes_diversity_policy_is_checked_like_its_flags(tiny_model, server, tmp_path, run_recipe):
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    run = run_recipe("grpo_gsm8k.sh", {**env, "SETPO_KERNEL": "hybrid"})
    assert run.returncode == 2 and "--setpo.kernel=hybrid compares solution keys: give --setpo.key" in run.stderr


def test_recipes_take_in_flight_and_several_replicas_from_the_environment(tiny_model, server, tmp_path, run_recipe):
    replicas = f"{server.url},http://127.0.0.1:{free_port()}"  # the second not there: one ready is enough
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": replicas}
    run = run_recipe("grpo_gsm8k.sh", {**env, "SETPO_IN_FLIGHT": "2"}, "--setpo.check_only")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"at {replicas}" in run.stdout and "the arguments check out" in run.stdout
    run = run_recipe("grpo_gsm8k.sh", {**env, "SETPO_IN_FLIGHT": "0"})  # passed as the flag: checked as the flag
    assert run.returncode == 2 and "argument --setpo.in_flight: must be > 0, got 0" in run.stderr


def test_the_gsm8k_recipe_keeps_the_papers_form_one_setting_away(tiny_model, server, tmp_path, run_recipe):
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    run = run_recipe("grpo_gsm8k.sh", {**env, "SETPO_FORM": "paper"}, "--setpo.check_only")
    assert run.returncode == 0 and PAPER_FORM in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    run = run_recipe("grpo_gsm8k.sh", {**env, "SETPO_FORM": "keyed"})
    assert run.returncode == 2 and "SETPO_FORM must be recommended, paper or coverage, got 'keyed'" in run.stderr


def test_the_gsm8k_recipes_coverage_form_is_maxrl_without_a_bonus(tiny_model, server, tmp_path, run_recipe):
    """SETPO_FORM=coverage: experiment v4's tested form for reach that setpo-train can run (replay is TRL's only)."""
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    run = run_recipe("grpo_gsm8k.sh", {**env, "SETPO_FORM": "coverage"}, "--setpo.check_only")
    assert run.returncode == 0 and "the arguments check out" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    argv = (tmp_path / "setpo-train-argv").read_text().split("\0")[:-1]
    given = {flag: argv[i + 1] for i, flag in enumerate(argv) if flag in ("--setpo.advantage", "--setpo.weight")}
    assert argv.count("--setpo.weight") == 1 and given == {"--setpo.advantage": "maxrl", "--setpo.weight": "0"}


def test_the_countdown_recipe_keeps_the_papers_form_one_setting_away(tiny_model, server, tmp_path, run_recipe):
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    env |= RECIPE_ENV["countdown_grpo.sh"]
    run = run_recipe("countdown_grpo.sh", {**env, "SETPO_FORM": "paper"}, "--setpo.check_only")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert PAPER_FORM in run.stdout
    run = run_recipe("countdown_grpo.sh", {**env, "SETPO_TARGET_RATIO": "0.4"}, "--setpo.check_only")
    assert "kernel=hybrid normalize=zscore embed_span=None" in run.stdout and " target_ratio=0.4 " in run.stdout
    run = run_recipe("countdown_grpo.sh", {**env, "SETPO_FORM": "scoped"})
    assert run.returncode == 2 and "SETPO_FORM must be recommended or paper, got 'scoped'" in run.stderr


def test_countdown_recipe_needs_its_grid_values(tiny_model, server, tmp_path, run_recipe):
    env = {"MODEL_PATH": tiny_model, "DATA_PATH": str(tmp_path / "p.jsonl"), "SETPO_URL": server.url}
    assert "set ROLLOUTS" in run_recipe("countdown_grpo.sh", {**env, "KL": "0.001"}).stderr
    run = run_recipe("countdown_grpo.sh", {**env, "KL": "0.001", "ROLLOUTS": "2"})
    assert run.returncode == 2 and "ROLLOUTS must be a whole number >= 3" in run.stderr


def test_recipes_pass_shellcheck():
    recipes = sorted(str(path) for path in RECIPES.glob("*.sh"))
    run = subprocess.run(
        [str(BIN / "shellcheck"), "--external-sources", *recipes], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout

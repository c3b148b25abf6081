"""setpo-train: OpenRLHF's `train_ppo_ray`, every flag unchanged, plus SetPO at the advantage step.

    setpo-train <any `python -m openrlhf.cli.train_ppo_ray` flags> --setpo.url http://setpo:8000 --setpo.weight 0.05

Several replicas of the service: --setpo.url http://a:8000,http://b:8000 (or SETPO_URL so spelled), as OpenRLHF
spells --reward.remote_url; a step's requests fan out over them, --setpo.in_flight at once (default: one each).

How it plugs in, without a copy of OpenRLHF's code:
1. Flags. OpenRLHF builds its parser inside the __main__ block of `openrlhf.cli.train_ppo_ray`. We run that
   module as `python -m` would and take the parser when the block asks it to parse; the --setpo.* group is
   added to it, in OpenRLHF's dotted style, so OpenRLHF's own `hierarchize` gives `args.setpo.weight` and
   the settings travel to the trainer actor inside `strategy.args`.
2. Checks. Bad values, a secret on the command line, an OpenRLHF whose trainer moved, a service that is not
   there, a wrong key, or groups the service would refuse stop here, before Ray starts or any GPU is touched.
3. Ray. RAY_RUNTIME_ENV_HOOK (chained after one already set, or after Ray's uv hook under `uv run`) makes
   OpenRLHF's own `ray.init` install our worker setup hook (ray_hook.py), so the trainer actor that OpenRLHF
   builds uses SetpoExperienceMaker.
4. OpenRLHF's __main__ block then runs on the parsed arguments: its own checks, then `train(args)`, which starts
   with `ray.init`. --setpo.check_only runs the same block with its `train` name bound to a function that stops.
"""

import argparse
import importlib.metadata
import math
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

from setpo_client import SetpoClient, SetpoError
from setpo_client.policy import (
    ADVANTAGES,
    COMBINATIONS,
    CONTROLLER_SETTINGS,
    KERNELS,
    NORMALIZATIONS,
    diversity_policy,
    keeps_groups,
)
from setpo_client.shaping import SetpoShaper
from setpo_trainer.openrlhf.flags import POLICY, spell
from setpo_trainer.openrlhf.ray_hook import CHAINED_HOOK_VARIABLE, RUNTIME_ENV_HOOK, UV_RUN_HOOK

OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"
# Estimators that compare a prompt's samples with each other: SetPO's bonus is defined on those groups.
GROUP_ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")
TESTED_OPENRLHF = "0.11."
# WeightController's knobs: refused without --setpo.target_ratio, which they steer
CONTROLLER_FLAGS = tuple(f"setpo.{name}" for name in CONTROLLER_SETTINGS)
# OpenRLHF turns W&B on when --logger.wandb.key is set; with this value W&B reads WANDB_API_KEY itself
WANDB_FROM_ENVIRONMENT = "env"


class _ParserReady(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


class _ChecksPassed(Exception):
    """OpenRLHF's __main__ block called train(args): every one of its checks passed (--setpo.check_only)."""


def _stop_before_ray(args: Any) -> None:
    """Stands for OpenRLHF's train(args), whose first act is ray.init, under --setpo.check_only."""
    raise _ChecksPassed


def run_openrlhf_main(
    answer: Callable[[argparse.ArgumentParser], argparse.Namespace], train: Callable[[Any], None] | None = None
) -> None:
    """Runs train_ppo_ray's __main__ block as `python -m` would; its one parse_args() call gets `answer(parser)`.
    parse_args is ours only for that one call: anything parsing later in this process parses normally.
    With `train`, the block's closing `train(args)` calls it instead of OpenRLHF's train: the block looks the name
    up in the namespace runpy runs the module in (the globals of the code that calls parse_args), where the
    module's top level has defined it by then."""
    original = argparse.ArgumentParser.parse_args

    def answer_once(parser, *args, **kwargs):
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        if train is not None:
            namespace = sys._getframe(1).f_globals
            spec = namespace.get("__spec__")
            if getattr(spec, "name", None) != OPENRLHF_MAIN or not callable(namespace.get("train")):
                raise RuntimeError(f"{OPENRLHF_MAIN} parses its arguments elsewhere: is this OpenRLHF 0.11.2?")
            namespace["train"] = train
        return answer(parser)

    argparse.ArgumentParser.parse_args = answer_once  # type: ignore[method-assign,assignment]
    try:
        runpy.run_module(OPENRLHF_MAIN, run_name="__main__")
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def openrlhf_parser() -> argparse.ArgumentParser:
    """The parser `train_ppo_ray` builds, taken at the moment its __main__ block calls parse_args()."""

    def hand_over(parser: argparse.ArgumentParser):
        raise _ParserReady(parser)

    try:
        run_openrlhf_main(hand_over)
    except _ParserReady as ready:
        return ready.parser
    raise RuntimeError(f"{OPENRLHF_MAIN} never parsed its arguments: is this OpenRLHF 0.11.2?")


def positive(kind: type) -> Callable[[str], Any]:
    """argparse type: a finite number of this kind, > 0."""

    def parse(text: str):
        value = kind(text)
        if not value > 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        if value == math.inf:
            raise argparse.ArgumentTypeError(f"must be finite, got {text}")
        return value

    return parse


def non_negative(kind: type) -> Callable[[str], Any]:
    """argparse type: a finite number of this kind, >= 0."""

    def parse(text: str):
        value = kind(text)
        if not value >= 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        if value == math.inf:
            raise argparse.ArgumentTypeError(f"must be finite, got {text}")
        return value

    return parse


# Every --setpo.* flag, in OpenRLHF's dotted style: its argparse keywords (the parser, --help and the checks read it).
FLAGS: dict[str, dict[str, Any]] = {
    "url": {
        "metavar": "URL",
        "help": "the setpo service (default: $SETPO_URL); several replicas comma-separated, as --reward.remote_url "
        "takes several: http://a:8000,http://b:8000",
    },
    "weight": {
        "metavar": "LAMBDA",
        "type": non_negative(float),
        "default": 0.05,
        "help": "lambda, the paper's marginal weight; 0: no bonus",
    },
    "api_key": {
        "metavar": "KEY",
        "help": "refused: set SETPO_API_KEY in the environment (a key on a command line leaks)",
    },
    "timeout": {
        "metavar": "SECONDS",
        "type": positive(float),
        "default": 60.0,
        "help": "seconds to wait for one answer of the service",
    },
    "max_retries": {
        "metavar": "N",
        "type": non_negative(int),
        "default": 5,
        "help": "retries with backoff when the service is unreachable or busy",
    },
    "in_flight": {
        "metavar": "N",
        "type": positive(int),
        "help": "a step's requests in flight at once, over the service's replicas (default: one per replica)",
    },
    "on_error": {
        "choices": ["skip", "fail"],
        "default": "skip",
        "help": "service still failing after the retries: skip = train the step with lambda = 0 and count it "
        "(setpo/fallback_steps); fail = stop with the error",
    },
    "keep_groups": {
        "choices": ["on", "off"],
        "help": "with --algo.dynamic_filtering_enable and --setpo.min_reward: keep the groups whose every response "
        "reaches min_reward (all correct), which the filter's range would drop and where the scoped bonus acts, by "
        "lifting the range's top to infinity (setpo/kept_by_bonus counts them); default: on with --setpo.min_reward",
    },
    "embed": {
        "choices": ["response", "prompt_response"],
        "default": "response",
        "help": "what is embedded: the response tokens only, or the whole trajectory (prompt + response)",
    },
    "max_chars": {
        "metavar": "CHARS",
        "type": positive(int),
        "help": "characters of each text sent (the beginning is kept); default: what the service keeps of a text, "
        "which it would cut to anyway. Texts are also cut, by UTF-8 bytes, to the service's SETPO_MAX_TEXT_CHARS "
        "and request body limit",
    },
    # the diversity policy (contract v1.1; docs/diversity.md says how to choose it); the defaults: the paper's form
    "min_reward": {
        "metavar": "REWARD",
        "type": float,
        "help": "score only the responses whose reward (OpenRLHF's, after its length penalties) reaches it, among "
        "themselves; the others get bonus 0, and so does a group with fewer than 3 (default: the whole group)",
    },
    "key": {
        "metavar": "NAME",
        "help": "solution key function for --setpo.kernel hybrid or key: a name (countdown_expression) or "
        "package.module:function, text -> key or None",
    },
    "kernel": {
        "choices": KERNELS,
        "default": "embedding",
        "help": "embedding: cosine of the embeddings (the paper); hybrid: equal keys count as identical, the rest "
        "by embedding; key: equal keys 1, else 0, nothing embedded",
    },
    "normalize": {
        "choices": NORMALIZATIONS,
        "default": "none",
        "help": "none: the raw marginals (the paper); zscore: standardised over the scored responses of each group",
    },
    "embed_span": {
        "metavar": "REGEX",
        "help": "embed only this part of each text: the last match of the regular expression (its group, if it has "
        "one), e.g. '<answer>(.*?)</answer>'; a text without a match is embedded whole (default: the whole text)",
    },
    # the base the bonus combines with, and how (docs/training-openrlhf.md, "Bases that keep coverage")
    "advantage": {
        "choices": ADVANTAGES,
        "default": "framework",
        "help": "framework: OpenRLHF's estimator's advantage; maxrl: (r - p) / p, p the group's success rate; "
        "w_reinforce: +positive_weight for a correct response, -1 for a wrong one. maxrl and w_reinforce take 0/1 "
        "rewards and replace the group estimator's advantage",
    },
    "positive_weight": {
        "metavar": "LAMBDA",
        "type": positive(float),
        "default": 0.1,
        "help": "with --setpo.advantage w_reinforce: a correct response's advantage (W-REINFORCE's lambda)",
    },
    "combine": {
        "choices": COMBINATIONS,
        "default": "add",
        "help": "add: advantage + bonus (the paper); reshare: the bonus re-shares each group's positive advantages "
        "among its members, their total unchanged, the others' kept (needs --setpo.normalize zscore)",
    },
    "target_ratio": {
        "metavar": "RATIO",
        "type": positive(float),
        "help": "steer lambda so that RMS(bonus) / RMS(advantage) over a step is this; --setpo.weight is then the "
        "first step's lambda (default: lambda fixed at --setpo.weight)",
    },
    "min_weight": {
        "metavar": "LAMBDA",
        "type": positive(float),
        "default": 1e-3,
        "help": "with --setpo.target_ratio: the smallest lambda",
    },
    "max_weight": {
        "metavar": "LAMBDA",
        "type": positive(float),
        "default": 10.0,
        "help": "with --setpo.target_ratio: the largest lambda",
    },
    "weight_ema": {
        "metavar": "EMA",
        "type": float,
        "default": 0.9,
        "help": "with --setpo.target_ratio: weight of the past in lambda's moving average, in [0, 1)",
    },
    "warmup_steps": {
        "metavar": "STEPS",
        "type": non_negative(int),
        "default": 0,
        "help": "with --setpo.target_ratio: steps over which the target ramps up linearly from target / STEPS",
    },
    "freeze_after": {
        "metavar": "STEPS",
        "type": non_negative(int),
        "help": "with --setpo.target_ratio: lambda stops moving after this many steps (default: never)",
    },
    "check_only": {
        "action": "store_true",
        "help": "check everything up to starting Ray (OpenRLHF's own argument checks, the service) and exit",
    },
    "ready_timeout": {
        "metavar": "SECONDS",
        "type": positive(float),
        "default": 120.0,
        "help": "seconds to wait at start for the service to be ready",
    },
}
POLICY_FLAGS = tuple(f"setpo.{name}" for name in POLICY) + ("setpo.target_ratio", *CONTROLLER_FLAGS)


def add_setpo_arguments(parser: argparse.ArgumentParser) -> None:
    setpo = parser.add_argument_group("SetPO", "SetPO's bonus after OpenRLHF's group advantages (setpo-train)")
    for name, options in FLAGS.items():
        setpo.add_argument(f"--setpo.{name}", **options)
    parser.set_defaults(**{"setpo.url": os.environ.get("SETPO_URL")})  # read when the parser is built, not imported


def check_setpo_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Everything that can be known before training starts; each failure says what to change."""
    options = vars(args)
    weight, url, n = options["setpo.weight"], options["setpo.url"], options["rollout.n_samples_per_prompt"]
    # OpenRLHF prints its arguments, sends them to W&B as the run's config, and `ps` shows a command line:
    # secrets come from the environment only.
    if options["setpo.api_key"] is not None:
        parser.error(
            "--setpo.api_key is refused: a key on a command line is visible in `ps`, in OpenRLHF's printed "
            "arguments and in W&B's run config. Set SETPO_API_KEY in the environment instead."
        )
    wandb_key = options["logger.wandb.key"]
    if wandb_key not in (None, WANDB_FROM_ENVIRONMENT):
        parser.error(
            f"--logger.wandb.key <key> is refused (printed by OpenRLHF, uploaded in W&B's run config, visible in "
            f"`ps`): set WANDB_API_KEY in the environment and pass --logger.wandb.key {WANDB_FROM_ENVIRONMENT}."
        )
    if wandb_key == WANDB_FROM_ENVIRONMENT and not os.environ.get("WANDB_API_KEY"):
        parser.error(f"--logger.wandb.key {WANDB_FROM_ENVIRONMENT} needs WANDB_API_KEY in the environment")
    try:
        policy = diversity_policy(policy_settings(parser, options), spell)
    except ValueError as exc:
        parser.error(str(exc))
    estimator = options["algo.advantage.estimator"]
    if policy["advantage"] != "framework" and estimator not in GROUP_ESTIMATORS:  # the shaper's base replaces it
        parser.error(
            f"{spell('advantage')} {policy['advantage']} replaces a group estimator's advantage, on groups of a "
            f"prompt's samples: set {spell('estimator')} to one of {', '.join(GROUP_ESTIMATORS)} (got {estimator})"
        )
    if weight == 0:
        if policy["advantage"] != "framework":
            check_openrlhf()  # the base is computed in the experience maker: no bonus, no service
        return  # otherwise plain OpenRLHF, no service needed
    low, high = options["algo.dynamic_filtering_range"]
    keep, min_reward = options["setpo.keep_groups"], options["setpo.min_reward"]
    if keep == "on" and min_reward is None:
        parser.error("--setpo.keep_groups on keeps the groups all of whose responses reach --setpo.min_reward: set it")
    try:
        keep = keeps_groups(
            None if keep is None else keep == "on", min_reward, policy["advantage"], policy["combine"], spell
        )
    except ValueError as exc:
        parser.error(str(exc))
    if keep and options["algo.dynamic_filtering_enable"] and not math.isinf(high):
        # OpenRLHF keeps a group only if low < its mean reward < high, inside its sampling loop (no seam to hook): an
        # all-correct group's mean is the rewards' top, which the range's top is (0 1) or is below, whatever min_reward
        # (0.5 with 0/1 rewards too), so it would be dropped before SetPO sees it
        options["algo.dynamic_filtering_range"] = [low, math.inf]
        print(
            f"setpo-train: --setpo.keep_groups on: --algo.dynamic_filtering_range {low} {high} -> {low} inf, so "
            "that groups whose every response reaches --setpo.min_reward are kept and shaped (setpo/kept_by_bonus); "
            "groups below the range are still dropped",
            flush=True,
        )
    check_openrlhf()
    if not url:
        parser.error("--setpo.weight > 0 needs the service: pass --setpo.url (or set SETPO_URL), or --setpo.weight 0")
    try:
        client = SetpoClient(url, timeout=options["setpo.timeout"], max_retries=1)
    except ValueError as exc:  # a replica given twice, a URL that is not one
        parser.error(f"--setpo.url: {exc}")
    shaper = SetpoShaper(
        client, weight, max_chars=options["setpo.max_chars"], in_flight=options["setpo.in_flight"], **policy
    )
    try:  # what every plug-in proves at start; /info needs the key: a wrong one fails here
        info = shaper.start(n, estimator, GROUP_ESTIMATORS, spell, options["setpo.ready_timeout"])
    except ValueError as exc:
        parser.error(str(exc))
    except SetpoError as exc:
        sys.exit(f"setpo-train: {exc}\nWith setpo-train: fix --setpo.url / SETPO_API_KEY, or pass --setpo.weight 0.")
    finally:
        client.close()
    # whether that check had a key, never the key: a Ray worker gets the environment its `ray start` had, not ours
    options["setpo.driver_key"] = bool(os.environ.get("SETPO_API_KEY"))
    print(
        f"setpo-train: SetPO lambda={weight} with {info.model} at {url} (max {info.max_tokens} tokens; at most "
        f"{info.limits.max_groups} groups and {info.limits.max_body_bytes} bytes a request)",
        flush=True,
    )
    said = " ".join(f"{flag.removeprefix('setpo.')}={options[flag]}" for flag in POLICY_FLAGS)
    print(f"setpo-train: diversity policy: {said}", flush=True)


def policy_settings(parser: argparse.ArgumentParser, options: dict) -> dict[str, Any]:
    """The --setpo.* diversity policy under SetPO's names; a controller flag left at its default counts as unset,
    so that setpo_client.policy refuses only the ones given without --setpo.target_ratio."""
    settings = {flag.removeprefix("setpo."): options[flag] for flag in ("setpo.weight", *POLICY_FLAGS)}
    for flag in CONTROLLER_FLAGS:
        if options[flag] == parser.get_default(flag):
            settings[flag.removeprefix("setpo.")] = None
    return settings


def openrlhf_version() -> str:
    try:
        return importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def check_openrlhf() -> None:
    """The OpenRLHF this process would run still builds its experience maker where ray_hook rebinds it."""
    from openrlhf.trainer import ppo_trainer

    version = openrlhf_version()
    if not version.startswith(TESTED_OPENRLHF):
        print(
            f"setpo-train: warning: tested with openrlhf {TESTED_OPENRLHF}x, this is {version}",
            file=sys.stderr,
            flush=True,
        )
    if "RemoteExperienceMaker" not in ppo_trainer.BasePPOTrainer.__init__.__code__.co_names:
        sys.exit(
            f"setpo-train: openrlhf {version} no longer builds RemoteExperienceMaker in BasePPOTrainer.__init__: "
            "SetPO cannot plug in. Use openrlhf==0.11.2."
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """OpenRLHF's flags and ours, parsed and checked (flat names, as OpenRLHF's parser returns them).
    --version and --help answer without OpenRLHF (help then lists our flags and says what to install)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--version" in argv:
        print(f"setpo-train {importlib.metadata.version('setpo-trainer')} (openrlhf {openrlhf_version()})")
        sys.exit(0)
    try:
        parser = openrlhf_parser()
    except ImportError as exc:
        missing = (
            f"setpo-train: cannot import OpenRLHF's trainer ({exc}). It needs openrlhf==0.11.2 with its GPU "
            "packages (vllm, flash-attn): pip install 'openrlhf[vllm]==0.11.2' 'setpo-trainer[openrlhf]'."
        )
        if not {"-h", "--help"} & set(argv):
            sys.exit(missing)
        parser = argparse.ArgumentParser(prog="setpo-train", epilog=f"OpenRLHF's own flags are not listed: {missing}")
        add_setpo_arguments(parser)
        parser.print_help()
        sys.exit(0)
    parser.prog = "setpo-train"
    parser.description = (
        "OpenRLHF's train_ppo_ray (all its flags, unchanged) with SetPO's diversity bonus; see --setpo.*"
    )
    add_setpo_arguments(parser)
    args = parser.parse_args(argv)
    check_setpo_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from ray._private import ray_constants
    from ray._private.runtime_env.uv_runtime_env_hook import _get_uv_run_cmdline

    existing = os.environ.get("RAY_RUNTIME_ENV_HOOK")
    if ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV and _get_uv_run_cmdline():
        # under `uv run` Ray calls its uv hook *instead of* RAY_RUNTIME_ENV_HOOK, so OpenRLHF trained without SetPO:
        # as Ray's own comment advises, that shortcut is off and ours calls the uv hook (alone, as Ray would)
        ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
        existing = UV_RUN_HOOK
    if existing and existing != RUNTIME_ENV_HOOK:  # chained: ours calls it first (ray_hook.add_worker_setup)
        os.environ[CHAINED_HOOK_VARIABLE] = existing
    os.environ["RAY_RUNTIME_ENV_HOOK"] = RUNTIME_ENV_HOOK
    if not vars(args)["setpo.check_only"]:
        run_openrlhf_main(lambda parser: args)  # OpenRLHF's own checks, then its train(args)
        return
    # OpenRLHF checks its arguments between parsing and its closing train(args), which starts with ray.init: the
    # block runs as above, up to that call.
    try:
        run_openrlhf_main(lambda parser: args, train=_stop_before_ray)
    except _ChecksPassed:
        print("setpo-train: the arguments check out (OpenRLHF's and SetPO's); not starting Ray (--setpo.check_only)")
        return
    raise RuntimeError(f"{OPENRLHF_MAIN} finished without calling train(args): is this OpenRLHF 0.11.2?")


if __name__ == "__main__":
    main()

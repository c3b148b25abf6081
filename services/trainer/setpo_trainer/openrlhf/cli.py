"""setpo-train: OpenRLHF's `train_ppo_ray`, every flag unchanged, plus SetPO at the advantage step.

    setpo-train <any `python -m openrlhf.cli.train_ppo_ray` flags> --setpo.url http://setpo:8000 --setpo.weight 0.05

How it plugs in, without a copy of OpenRLHF's code:
1. Flags. OpenRLHF builds its parser inside the __main__ block of `openrlhf.cli.train_ppo_ray`. We run that
   module as `python -m` would and take the parser when the block asks it to parse; the --setpo.* group is
   added to it, in OpenRLHF's dotted style, so OpenRLHF's own `hierarchize` gives `args.setpo.weight` and
   the settings travel to the trainer actor inside `strategy.args`.
2. Checks. Bad values, a service that is not there, a wrong key, or groups the service would refuse stop
   here, before Ray starts or any GPU is touched.
3. Ray. RAY_RUNTIME_ENV_HOOK makes OpenRLHF's own `ray.init` install our worker setup hook (ray_hook.py), so
   the trainer actor that OpenRLHF builds uses SetpoExperienceMaker.
4. OpenRLHF's __main__ block then runs on the parsed arguments: its own checks, then `train(args)`.
"""

import argparse
import contextlib
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any
from unittest import mock

from setpo_client import SetpoClient, SetpoError

from setpo_trainer.openrlhf.ray_hook import RUNTIME_ENV_HOOK

OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"
# Estimators that compare a prompt's samples with each other: SetPO's bonus is defined on those groups.
GROUP_ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")


class _ParserReady(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


class _RayWouldStart(Exception):
    pass


def run_openrlhf_main(answer: Callable[[argparse.ArgumentParser], argparse.Namespace]) -> None:
    """Runs train_ppo_ray's __main__ block as `python -m` would; its one parse_args() call gets `answer(parser)`.
    parse_args is ours only for that one call: anything parsing later in this process parses normally."""
    original = argparse.ArgumentParser.parse_args

    def answer_once(parser, *args, **kwargs):
        argparse.ArgumentParser.parse_args = original
        return answer(parser)

    argparse.ArgumentParser.parse_args = answer_once
    try:
        runpy.run_module(OPENRLHF_MAIN, run_name="__main__")
    finally:
        argparse.ArgumentParser.parse_args = original


def openrlhf_parser() -> argparse.ArgumentParser:
    """The parser `train_ppo_ray` builds, taken at the moment its __main__ block calls parse_args()."""

    def hand_over(parser: argparse.ArgumentParser):
        raise _ParserReady(parser)

    try:
        run_openrlhf_main(hand_over)
    except _ParserReady as ready:
        return ready.parser
    except ImportError as exc:
        sys.exit(
            f"setpo-train: cannot import OpenRLHF's trainer ({exc}). It needs openrlhf==0.11.2 with its GPU "
            "packages (vllm, flash-attn): pip install 'openrlhf[vllm]==0.11.2' 'setpo-trainer[openrlhf]'."
        )
    raise RuntimeError(f"{OPENRLHF_MAIN} never parsed its arguments: is this OpenRLHF 0.11.2?")


def positive(kind: type) -> Callable[[str], Any]:
    """argparse type: a number of this kind, > 0."""

    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def non_negative(kind: type) -> Callable[[str], Any]:
    """argparse type: a number of this kind, >= 0."""

    def parse(text: str):
        value = kind(text)
        if not value >= 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    return parse


def add_setpo_arguments(parser: argparse.ArgumentParser) -> None:
    setpo = parser.add_argument_group("SetPO", "A^_i = A_i + lambda * s_i after OpenRLHF's group advantages (setpo-train)")
    setpo.add_argument("--setpo.url", metavar="URL", default=os.environ.get("SETPO_URL"), help="the setpo service (default: $SETPO_URL)")
    setpo.add_argument("--setpo.weight", metavar="LAMBDA", type=non_negative(float), default=0.05, help="lambda, the paper's marginal weight; 0 turns SetPO off")
    setpo.add_argument("--setpo.api_key", metavar="KEY", default=None, help="the service's key (default: $SETPO_API_KEY); never logged")
    setpo.add_argument("--setpo.timeout", metavar="SECONDS", type=positive(float), default=60.0, help="seconds to wait for one answer of the service")
    setpo.add_argument("--setpo.max_retries", metavar="N", type=non_negative(int), default=5, help="retries with backoff when the service is unreachable or busy")
    setpo.add_argument("--setpo.on_error", choices=["skip", "fail"], default="skip",
                       help="service still failing after the retries: skip = train the step with lambda = 0 and count it "
                       "(setpo/fallback_steps); fail = stop with the error")
    setpo.add_argument("--setpo.embed", choices=["response", "prompt_response"], default="response",
                       help="what is embedded: the response tokens only, or the whole trajectory (prompt + response)")
    setpo.add_argument("--setpo.max_chars", metavar="CHARS", type=positive(int), default=None,
                       help="characters of each text sent (the beginning is kept); default: 8 x the service model's "
                       "max tokens, which the service would cut to anyway")
    setpo.add_argument("--setpo.check_only", action="store_true",
                       help="check everything up to starting Ray (OpenRLHF's own argument checks, the service) and exit")
    setpo.add_argument("--setpo.ready_timeout", metavar="SECONDS", type=positive(float), default=120.0, help="seconds to wait at start for the service to be ready")


def check_setpo_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Everything that can be known before training starts; each failure says what to change."""
    options = vars(args)
    weight, url, n = options["setpo.weight"], options["setpo.url"], options["rollout.n_samples_per_prompt"]
    # The key leaves the arguments (OpenRLHF prints them and sends them to W&B) for the environment, which the
    # client reads and ray_hook forwards to the Ray workers.
    if options["setpo.api_key"]:
        os.environ["SETPO_API_KEY"] = options["setpo.api_key"]
        options["setpo.api_key"] = None
    if weight == 0:
        return  # SetPO off: plain OpenRLHF, no service needed
    estimator = options["algo.advantage.estimator"]
    if estimator not in GROUP_ESTIMATORS:
        parser.error(f"--setpo.weight > 0 needs a group advantage estimator ({', '.join(GROUP_ESTIMATORS)}); "
                     f"got --algo.advantage.estimator {estimator}")
    if n < 3:
        parser.error(f"--setpo.weight > 0 needs --rollout.n_samples_per_prompt >= 3 (leave-one-out marginals); got {n}")
    if not url:
        parser.error("--setpo.weight > 0 needs the service: pass --setpo.url (or set SETPO_URL), or --setpo.weight 0")

    with SetpoClient(url, timeout=options["setpo.timeout"], max_retries=1) as client:
        try:
            client.wait_until_ready(timeout=options["setpo.ready_timeout"])
            info = client.info()  # needs the key: a wrong one fails here, not at the first step
        except SetpoError as exc:
            sys.exit(f"setpo-train: the SetPO service at {url} is not usable: {exc}\nStart it (setpo-server), fix "
                     "--setpo.url / --setpo.api_key, or train without SetPO with --setpo.weight 0.")
    groups = options["rollout.batch_size"]
    if groups > info.limits.max_groups or n > info.limits.max_group_size:
        sys.exit(f"setpo-train: a step sends {groups} groups of {n} responses; the service at {url} takes at most "
                 f"{info.limits.max_groups} groups of {info.limits.max_group_size}. Raise SETPO_MAX_GROUPS / "
                 "SETPO_MAX_GROUP_SIZE on the service, or lower --rollout.batch_size.")
    # Every text of a step is in one request body: cap the texts so the longest possible step still fits.
    texts = groups * n
    if options["setpo.max_chars"] is None:  # the service cuts at max_tokens anyway; 8 chars a token is ample
        options["setpo.max_chars"] = min(8 * info.max_tokens, info.limits.max_text_chars, info.limits.max_body_bytes // (2 * texts))
    elif options["setpo.max_chars"] > info.limits.max_text_chars or texts * options["setpo.max_chars"] > info.limits.max_body_bytes:
        parser.error(f"--setpo.max_chars {options['setpo.max_chars']}: the service takes texts of at most "
                     f"{info.limits.max_text_chars} characters and {info.limits.max_body_bytes} bytes a request "
                     f"({texts} texts a step); lower it, or raise SETPO_MAX_TEXT_CHARS / SETPO_MAX_BODY_BYTES")
    print(f"setpo-train: SetPO lambda={weight} with {info.model} at {url} (max {info.max_tokens} tokens, "
          f"texts cut to {options['setpo.max_chars']} characters)", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """OpenRLHF's flags and ours, parsed and checked (flat names, as OpenRLHF's parser returns them)."""
    parser = openrlhf_parser()
    parser.prog = "setpo-train"
    parser.description = "OpenRLHF's train_ppo_ray (all its flags, unchanged) with SetPO's diversity bonus; see --setpo.*"
    add_setpo_arguments(parser)
    args = parser.parse_args(argv)
    check_setpo_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if os.environ.get("RAY_RUNTIME_ENV_HOOK", RUNTIME_ENV_HOOK) != RUNTIME_ENV_HOOK:
        sys.exit(f"setpo-train: RAY_RUNTIME_ENV_HOOK is already set ({os.environ['RAY_RUNTIME_ENV_HOOK']}); SetPO "
                 f"needs its own ({RUNTIME_ENV_HOOK}). Unset it, or call ours from yours.")
    os.environ["RAY_RUNTIME_ENV_HOOK"] = RUNTIME_ENV_HOOK
    if not vars(args)["setpo.check_only"]:
        run_openrlhf_main(lambda parser: args)  # OpenRLHF's own checks, then its train(args)
        return
    # OpenRLHF checks its arguments between parsing and train(); train() starts with ray.init.
    with mock.patch("ray.init", side_effect=_RayWouldStart), contextlib.suppress(_RayWouldStart):
        run_openrlhf_main(lambda parser: args)
        raise RuntimeError(f"{OPENRLHF_MAIN} finished without starting Ray: is this OpenRLHF 0.11.2?")
    print("setpo-train: the arguments check out (OpenRLHF's and SetPO's); not starting Ray (--setpo.check_only)")


if __name__ == "__main__":
    main()

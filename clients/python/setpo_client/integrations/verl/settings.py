"""The run's `+algorithm.setpo.*` block: read, checked by name, and made the process's SetpoShaper.
The settings and what each does: docs/trl-and-verl.md#verl."""

from typing import Any

from setpo_client.client import SetpoClient
from setpo_client.policy import CONTROLLER_SETTINGS, diversity_policy
from setpo_client.policy import keeps_groups as policy_keeps_groups
from setpo_client.shaping import SetpoShaper

POLICY_SETTINGS = (
    "min_reward",
    "key",
    "kernel",
    "normalize",
    "embed_span",
    "target_ratio",
    *CONTROLLER_SETTINGS,
    "advantage",
    "positive_weight",
    "combine",
)
SETTINGS = (
    "enable",
    "url",
    "weight",
    "on_error",
    "timeout",
    "in_flight",
    "keep_groups",
    "ready_timeout",
    "max_chars",
    *POLICY_SETTINGS,
)
_shapers: dict[tuple, SetpoShaper] = {}


def enabled(algorithm_config) -> bool:
    """Whether the run's config switches SetPO on (+algorithm.setpo.enable=true)."""
    block = (algorithm_config.get("setpo") if algorithm_config is not None else None) or {}
    return bool(block.get("enable", False))


def setpo_settings(algorithm_config) -> dict | None:
    """The `algorithm.setpo` block when SetPO is enabled, else None."""
    if not enabled(algorithm_config):
        return None
    block = algorithm_config.get("setpo")
    if "api_key" in block:
        raise ValueError(
            "+algorithm.setpo.api_key is refused: veRL prints its config and sends it to its trackers. "
            "Set SETPO_API_KEY in the environment of the run instead."
        )
    if not block.get("url"):
        raise ValueError("algorithm.setpo.enable=true needs +algorithm.setpo.url=<setpo service URL>")
    unknown = [name for name in block if name not in SETTINGS]
    if unknown:  # a misspelt setting would otherwise train the paper's form without a word
        raise ValueError(
            f"algorithm.setpo.{unknown[0]} is not a SetPO setting; the settings are: {', '.join(SETTINGS)}"
        )
    return dict(block)


def number(settings: dict, name: str, default: float | None = None, kind: type = float) -> Any:
    """algorithm.setpo.<name> as a number (Hydra parses `0.3` and `3`; anything else is refused by its name)."""
    value = settings.get(name, default)
    if value is None:
        return None
    wrong_kind = not isinstance(value, int) if kind is int else not isinstance(value, int | float)
    if isinstance(value, bool) or wrong_kind:
        raise ValueError(f"{spell(name)} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def spell(name: str) -> str:
    """A SetPO setting as a veRL command line writes it, for refusals (setpo_client.policy, SetpoShaper.start)."""
    own = {"group_size": "actor_rollout_ref.rollout.n", "estimator": "algorithm.adv_estimator"}
    return own.get(name, f"+algorithm.setpo.{name}")


def keeps_groups(settings: dict) -> bool:
    """+algorithm.setpo.keep_groups: DAPO's filter keeps the groups the bonus sets apart (setpo_client.policy)."""
    value = settings.get("keep_groups")
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{spell('keep_groups')} must be true or false, got {value!r}")
    advantage, combine = settings.get("advantage") or "framework", settings.get("combine") or "add"
    return policy_keeps_groups(value, settings.get("min_reward"), advantage, combine, spell)


def shaper_for(settings: dict) -> SetpoShaper:
    """One shaper per configuration and process, so fallback steps, step times and the weight controller's state
    carry across the run's steps. The diversity policy is checked by setpo_client.policy, as every plug-in's is;
    here Hydra's values are only made numbers."""
    name = tuple(sorted((k, str(v)) for k, v in settings.items()))
    if name not in _shapers:
        numbers = ("min_reward", "target_ratio", "min_weight", "max_weight", "positive_weight")
        named = {knob: number(settings, knob) for knob in numbers}
        named |= {knob: number(settings, knob, None, int) for knob in ("warmup_steps", "freeze_after")}
        named |= {"weight": number(settings, "weight", 0.05), "weight_ema": number(settings, "weight_ema")}
        named |= {
            knob: settings.get(knob) for knob in ("key", "kernel", "normalize", "embed_span", "advantage", "combine")
        }
        policy = diversity_policy(named, spell)
        in_flight = number(settings, "in_flight", None, int)
        if in_flight is not None and in_flight < 1:  # SetpoShaper refuses it too, but not by its name on veRL's line
            raise ValueError(f"{spell('in_flight')} must be >= 1 (requests in flight at once), got {in_flight}")
        url = settings["url"]  # a str; or a list, as Hydra advises for a value with a comma ([a,b]): the replicas
        url = url if isinstance(url, str) else ",".join(str(each) for each in url)
        client = SetpoClient(url, timeout=number(settings, "timeout", 60.0))  # key: $SETPO_API_KEY
        try:
            _shapers[name] = SetpoShaper(
                client,
                named["weight"],
                settings.get("on_error", "skip"),
                number(settings, "max_chars", None, int),
                in_flight=in_flight,
                **policy,
            )
        except ValueError as exc:  # SetpoShaper's messages use the settings' own names (on_error, weight)
            raise ValueError(f"algorithm.setpo: {exc}") from exc
    return _shapers[name]

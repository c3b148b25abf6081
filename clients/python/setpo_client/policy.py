"""The diversity policy from a plug-in's settings, checked in one place for every plug-in (docs/diversity.md).

Each plug-in names the settings its own way (--setpo.key for setpo-train, +algorithm.setpo.key for veRL,
setpo_key for TRL, --key for the bandit); it passes them here under SetPO's names with `spell`, the function
from a name to its spelling, so that a refusal names what its user has to change.

    policy = diversity_policy({"weight": 0.1, "min_reward": 1.0, "key": "countdown_expression", "kernel": "hybrid",
                               "target_ratio": 0.3}, spell=lambda name: f"--setpo.{name}")
    shaper = SetpoShaper(client, 0.1, **policy)
"""

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, get_args

from setpo_client.keys import load_key
from setpo_client.types import Advantage, Combine, Kernel, Normalize
from setpo_client.weight import WeightController

KERNELS, NORMALIZATIONS, ADVANTAGES, COMBINATIONS = (get_args(kind) for kind in (Kernel, Normalize, Advantage, Combine))
# WeightController's knobs: they steer lambda, so they mean nothing without target_ratio
CONTROLLER_SETTINGS = ("min_weight", "max_weight", "weight_ema", "warmup_steps", "freeze_after")


def diversity_policy(settings: Mapping[str, Any], spell: Callable[[str], str] = str) -> dict[str, Any]:
    """SetpoShaper's policy arguments (min_reward, key, kernel, normalize, embed_span, controller, advantage,
    positive_weight, combine) from settings named weight, min_reward, key (a key function or its name), kernel,
    normalize, embed_span, target_ratio, CONTROLLER_SETTINGS, advantage, positive_weight and combine; absent or None:
    the paper's form on the framework's advantage and WeightController's defaults. A value SetpoShaper or WeightController would not
    take is refused (ValueError), and so is one that would be silently unused: a key the kernel ignores, a
    controller knob without target_ratio, a controller asked to steer a lambda of 0."""
    kernel, key, min_reward = settings.get("kernel") or "embedding", settings.get("key"), settings.get("min_reward")
    normalize, embed_span = settings.get("normalize") or "none", settings.get("embed_span") or None
    advantage, combine = settings.get("advantage") or "framework", settings.get("combine") or "add"
    positive_weight = 0.1 if settings.get("positive_weight") is None else settings["positive_weight"]
    check_form(kernel, normalize, min_reward, embed_span, advantage, combine, positive_weight, spell)
    if isinstance(key, str):
        try:
            key = load_key(key)  # loaded now: a typo stops the start
        except ValueError as exc:
            raise ValueError(f"{spell('key')} {key}: {exc}") from exc
    if key is None and kernel != "embedding":
        raise ValueError(
            f"{spell('kernel')}={kernel} compares solution keys: give {spell('key')} (e.g. countdown_expression)"
        )
    if key is not None and kernel == "embedding":
        raise ValueError(f"{spell('key')} is used by {spell('kernel')}=hybrid or key only: set one, or drop the key")
    return {
        "min_reward": min_reward,
        "key": key,
        "kernel": kernel,
        "normalize": normalize,
        "embed_span": embed_span,
        "controller": weight_controller(settings, spell),
        "advantage": advantage,
        "positive_weight": positive_weight,
        "combine": combine,
    }


def check_form(
    kernel: str,
    normalize: str,
    min_reward: float | None,
    embed_span: str | None,
    advantage: str,
    combine: str,
    positive_weight: float,
    spell: Callable[[str], str] = str,
) -> None:
    """The values SetpoShaper takes for these (it calls this too); a refusal names each as `spell` does. embed_span,
    the part of each response embedded: a regular expression with at most one group (its last match is embedded),
    unused under kernel=key, which embeds nothing. Re-sharing turns the bonus into weights 1 + lambda * z, so it needs
    z-scored marginals; positive_weight is W-REINFORCE's lambda."""
    if kernel not in KERNELS:
        raise ValueError(f"{spell('kernel')} must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"{spell('normalize')} must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    if min_reward is not None and not math.isfinite(min_reward):
        raise ValueError(f"{spell('min_reward')} must be a finite number, got {min_reward}")
    if embed_span is not None:
        try:
            groups = re.compile(embed_span).groups
        except re.error as exc:
            raise ValueError(f"{spell('embed_span')} {embed_span!r} is not a regular expression: {exc}") from exc
        if groups > 1:
            raise ValueError(
                f"{spell('embed_span')} {embed_span!r} has {groups} groups: give at most one (what is embedded)"
            )
        if kernel == "key":
            raise ValueError(
                f"{spell('embed_span')} chooses what is embedded; {spell('kernel')}=key embeds nothing: drop one"
            )
    if advantage not in ADVANTAGES:
        raise ValueError(f"{spell('advantage')} must be one of {', '.join(ADVANTAGES)}, got {advantage!r}")
    if combine not in COMBINATIONS:
        raise ValueError(f"{spell('combine')} must be one of {', '.join(COMBINATIONS)}, got {combine!r}")
    if combine == "reshare" and normalize != "zscore":
        raise ValueError(
            f"{spell('combine')}=reshare weighs members by 1 + lambda * z-scored marginal: set {spell('normalize')}=zscore"
        )
    if not (math.isfinite(positive_weight) and positive_weight > 0):
        raise ValueError(f"{spell('positive_weight')} must be a finite number > 0, got {positive_weight}")


def pushes_equal_rewards(advantage: str, combine: str) -> bool:
    """Whether a group of equal rewards gets a push to set its members apart by: lambda * s_i itself under
    combine=add; under reshare, the base's positive advantage, which such a group has under w_reinforce alone (all
    correct: +positive_weight each; 0 under the framework's and MaxRL's)."""
    return combine == "add" or advantage == "w_reinforce"


def keeps_groups(
    keep: bool | None, min_reward: float | None, advantage: str, combine: str, spell: Callable[[str], str] = str
) -> bool:
    """keep_groups: DAPO's dynamic sampling keeps the groups of equal rewards the bonus sets apart; by default with
    a scope (min_reward) where such a group has a push, and refused where it has none (it would train on nothing)."""
    pushed = pushes_equal_rewards(advantage, combine)
    if keep is None:
        return min_reward is not None and pushed
    if keep and not pushed:
        raise ValueError(
            f"{spell('keep_groups')} keeps groups of equal rewards for their bonus, but {spell('combine')}=reshare only "
            f"re-shares a positive advantage, which {spell('advantage')}={advantage} gives such a group none of: "
            f"drop {spell('keep_groups')}, or use {spell('advantage')}=w_reinforce"
        )
    return keep


def check_steerable(weight: float, spell: Callable[[str], str] = str) -> None:
    """A WeightController steers lambda from the first step's: from 0 it would raise it to min_weight, SetPO on
    where the weight says off (SetpoShaper calls this too)."""
    if weight <= 0:
        raise ValueError(
            f"{spell('target_ratio')} steers lambda from {spell('weight')}, the first step's lambda: it must be > 0 "
            "(for a run without SetPO, drop the target ratio)"
        )


def weight_controller(settings: Mapping[str, Any], spell: Callable[[str], str]) -> WeightController | None:
    knobs = {name: settings[name] for name in CONTROLLER_SETTINGS if settings.get(name) is not None}
    if settings.get("target_ratio") is None:
        if knobs:
            steering = ", ".join(spell(name) for name in knobs)
            raise ValueError(f"{steering} steer lambda: they need {spell('target_ratio')}")
        return None
    check_steerable(settings.get("weight") or 0.0, spell)
    low, high = knobs.get("min_weight", 1e-3), knobs.get("max_weight", 10.0)
    if low > high:
        raise ValueError(f"{spell('min_weight')} {low} is above {spell('max_weight')} {high}")
    ema = knobs.pop("weight_ema", 0.9)
    if not 0 <= ema < 1:  # WeightController calls it `ema`: say it with the setting's name
        raise ValueError(f"{spell('weight_ema')} must be in [0, 1), got {ema}")
    try:
        return WeightController(settings["target_ratio"], ema=ema, **knobs)
    except ValueError as exc:
        raise ValueError(f"{spell('target_ratio')} and its bounds: {exc}") from exc

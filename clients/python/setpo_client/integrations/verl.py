"""SetPO for veRL 0.9: Â_i = A_i + lambda * s_i on every response token, after veRL's own advantage step.

Installed as a veRL entry-point plugin (group "verl.plugins", so `import verl` loads it in every process once
`setpo-client[verl]` is installed) and switched on per run from the Hydra config, the way veRL users
configure everything else:

    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ... \\
        +algorithm.setpo.enable=true +algorithm.setpo.url=http://setpo:8000 +algorithm.setpo.weight=0.05 \\
        [+algorithm.setpo.on_error=skip] [+algorithm.setpo.timeout=60] [+algorithm.setpo.max_chars=8000]

Several replicas of the service: "+algorithm.setpo.url='http://a:8000,http://b:8000'" (quoted: unquoted, Hydra
reads a comma as a sweep; or as a list, +algorithm.setpo.url=[http://a:8000,http://b:8000]); a step's requests
fan out over them, +algorithm.setpo.in_flight=4 at once (default: one per replica).

Diversity among correct solutions (contract v1.1; docs/diversity.md says how to choose), SetpoShaper's policy
under veRL's names: +algorithm.setpo.min_reward=1.0 scores only the responses whose reward (veRL's token-level
scores summed over the response, as its GRPO sums them) reaches it; key=countdown_expression (or
package.module:function) a solution key function; kernel=embedding|hybrid|key; normalize=none|zscore;
embed_span='<answer>(.*?)</answer>' embeds only the last match of that regular expression of each response; and
target_ratio=0.3 steers lambda (weight is then the first step's) so that RMS(bonus) / RMS(advantage) is that,
with min_weight, max_weight, weight_ema, warmup_steps, freeze_after. A setting that would go unused (a key with
the embedding kernel, a controller knob without target_ratio, a misspelt name) stops the run at start.

The service's key comes only from $SETPO_API_KEY (veRL prints its resolved config and sends it to its
trackers: a key in the config would be in both); +algorithm.setpo.api_key is refused.

GSPO (actor.policy_loss.loss_mode=gspo) and DAPO (clip-higher, algorithm.filter_groups) keep veRL's GRPO
advantage step, so SetPO applies to them; groups are the responses that share veRL's `uid`. DAPO's dynamic
sampling drops every group whose rewards are all equal before that step, among them the all-correct groups the
scoped form (min_reward) exists for. With +algorithm.setpo.keep_groups=true (the default when min_reward is set)
the v1 filter, `ReplayBuffer._dapo_filtered_keys` (wrapped; the sync and async samplers share it), keeps a group
whose shaped advantages would still differ (setpo_client.shaping.would_shape: >= 3 members in scope that the
kernel tells apart); it then trains on the bonus alone, counted as setpo/kept_by_bonus. Identical answers and
all-wrong groups are dropped as before. A custom sampler (trainer.v1.sampler.custom_sampler) filters its own way,
and the v0 trainer has no filter at all: veRL 0.9.1's RayPPOTrainer ignores algorithm.filter_groups (only
verl-recipe's RayDAPOTrainer filters, inline in its fit(), which no plug-in can hook).

veRL 0.9.1 has two trainers and the plug-in wraps each at its advantage step:
- v1 (default, trainer.use_v1=true): `PPOTrainer._compute_advantage` (v1/trainer_base.py) runs unchanged; then the responses
  and advantages of the step are read from veRL's TransferQueue, shaped, and written back. A member is what
  veRL's estimator counts as one sample: under "grpo", as veRL's v1 GRPO does, a session (rows keyed
  {uid}_{session}_{index} by multi-output agent loops) is one member of its group: its final output is
  embedded and its bonus broadcast to all its rows; under the others (rloo, grpo_vectorized, ...), whose
  baselines count every output, each row is a member. Synthetic padding rows
  (tag is_padding) are left out; rows that rollout correction rejected (response mask all 0) keep bonus 0
  and are not sent. The texts are read before veRL's step, whose rollout correction may zero single tokens
  of response_mask: the policy's answer is embedded whole, and the bonus lands only on the tokens veRL trains.
  The step's setpo/* metrics go into veRL's own metrics dict. With trainer.v1.<mode>.parameter_sync_step k > 1
  (separate_async's default 4) a training step runs the advantage step k times and veRL's MetricsAggregator
  reduces each metric by its name: the plug-in adds SetPO's to its rules, so per-pass counts and time_s are summed,
  running totals (fallback_steps, unscored_groups_total) and weight are the last pass's, the rest averaged by
  samples. The weight controller steps once a pass: warmup_steps and freeze_after count advantage passes.
- v0 (trainer.use_v1=false): `compute_advantage` (the function the legacy trainer calls) runs unchanged,
  then the batch is shaped; metrics are merged into veRL's data metrics of the step. The response_mask
  before rollout correction is kept by wrapping `compute_rollout_correction_and_add_to_batch`.
A row's text is the policy's own turns (tool and environment output left out), one turn a line.

Off the critical path, on both trainers: the reward is known before veRL's old-log-prob pass, and the first of its
passes before the advantage step (`_compute_old_log_prob`, `_compute_ref_log_prob`, `_compute_values`, wrapped)
submits the step's scoring (submit_v1, submit_v0: the members the advantage step would send); the passes hide it,
and the advantage step collects it (setpo/wait_s: what the trainer blocked). The answer is applied only if the
batch's rows are the submitted ones and the groups it would send now equal those sent (rollout correction, inside
the advantage step, may reject a row whole); else the step is scored there and the early one dropped
(setpo/dropped_steps). With a sequence-level rollout rejection, which rejects rows most steps, nothing is submitted
early (rejects_rows).
Groups SetpoShaper cannot score (fewer than 3 scorable sessions, e.g. a failed session in sync mode; more than
the service takes) get bonus 0 and are counted; under a per-output estimator, a group of more outputs than the
service takes is first fitted to one member a session, its final output (setpo/fitted_groups); service failures follow on_error (SetpoShaper's one policy).

At start, before any worker: the trainer's class really calls our advantage step and logs our metrics, the veRL
internals we rely on are in place (check_trainer), veRL's version is the tested one, rollout.n >= 3, the
estimator is a group estimator, and the service is ready, accepts the key and says its limits (`PPOTrainer.__init__` / `RayPPOTrainer.__init__` wrapped). A plug-in that cannot install itself
while the command line enables SetPO stops the run instead of training without it.
"""

import contextlib
import functools
import inspect
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import torch
from packaging.specifiers import SpecifierSet

from setpo_client.client import SetpoClient
from setpo_client.errors import SetpoError
from setpo_client.policy import CONTROLLER_SETTINGS, diversity_policy
from setpo_client.shaping import PendingStep, SetpoShaper, largest_group, would_shape

log = logging.getLogger("setpo_client.verl")
# veRL versions whose advantage steps this plug-in was tested against: the `verl` extra's range (tests/integrations/verl
# checks they agree)
TESTED_RANGE = ">=0.9,<0.10"
# estimators that compare a prompt's samples with each other: SetPO's bonus is defined on those groups
GROUP_ESTIMATORS = (
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
    "gdpo",
)
POLICY_SETTINGS = ("min_reward", "key", "kernel", "normalize", "embed_span", "target_ratio", *CONTROLLER_SETTINGS)
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
    "tokenizer",
    *POLICY_SETTINGS,
)
# A v1 training step runs its advantage step parameter_sync_step (k) times, and veRL's MetricsAggregator reduces
# each metric of the k passes by a rule its name picks (a weighted mean unless "sum", "total", "min", "max"... is in
# it): SetPO's per-pass counts and time add up to the step's, its running totals and lambda are the last pass's.
SUMMED_METRICS = (
    "setpo/unscored_groups",
    "setpo/small_scope_groups",
    "setpo/bad_groups",
    "setpo/scored_groups",
    "setpo/cut_texts",
    "setpo/requests",
    "setpo/chunk_retries",
    "setpo/span_missing",
    "setpo/time_s",
    "setpo/wait_s",
    "setpo/kept_by_bonus",
    "setpo/fitted_groups",
)
LAST_METRICS = ("setpo/fallback_steps", "setpo/dropped_steps", "setpo/unscored_groups_total", "setpo/weight")
_shapers: dict[tuple, SetpoShaper] = {}
GENERATED_MASK = "setpo_generated_mask"  # v0: response_mask before rollout correction, from correction to advantage
# veRL's passes between the reward and the advantage step, on both trainers: the first of them that runs starts the
# step's scoring (submit_v0, submit_v1), so that they hide SetPO's time
EARLY_PASSES = ("_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values")


@dataclass
class Submitted:
    """A step whose scoring started before veRL's log-prob passes: its scoring in flight, the rows it was read from
    (v1: partition and keys; v0: uids, with the responses and mask its texts were decoded from) and each row's text."""

    pending: PendingStep
    rows: tuple
    texts: list[str | None]
    tensors: tuple = ()


_submitted: dict[SetpoShaper, Submitted] = {}  # at most one a shaper, as the shaper has at most one step in flight


def setpo_settings(algorithm_config) -> dict | None:
    """The `algorithm.setpo` block when SetPO is enabled, else None."""
    block = algorithm_config.get("setpo") if algorithm_config is not None else None
    if not block or not block.get("enable", False):
        return None
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


def shaper_for(settings: dict) -> SetpoShaper:
    """One shaper per configuration and process, so fallback steps, step times and the weight controller's state
    carry across the run's steps. The diversity policy is checked by setpo_client.policy, as every plug-in's is;
    here Hydra's values are only made numbers."""
    name = tuple(sorted((k, str(v)) for k, v in settings.items()))
    if name not in _shapers:
        named = {knob: number(settings, knob) for knob in ("min_reward", "target_ratio", "min_weight", "max_weight")}
        named |= {knob: number(settings, knob, None, int) for knob in ("warmup_steps", "freeze_after")}
        named |= {"weight": number(settings, "weight", 0.05), "weight_ema": number(settings, "weight_ema")}
        named |= {knob: settings.get(knob) for knob in ("key", "kernel", "normalize", "embed_span")}
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


def keeps_groups(settings: dict) -> bool:
    """+algorithm.setpo.keep_groups: DAPO's filter keeps the groups the bonus sets apart (default: with a scope)."""
    value = settings.get("keep_groups", settings.get("min_reward") is not None)
    if not isinstance(value, bool):
        raise ValueError(f"{spell('keep_groups')} must be true or false, got {value!r}")
    return value


def check_start(config, trainer_class) -> None:
    """Everything that can be known before any worker starts; each failure says what to change."""
    settings = setpo_settings(config.algorithm)
    if settings is None:
        return
    import verl

    check_trainer(trainer_class)
    keep = keeps_groups(settings)
    if not SpecifierSet(TESTED_RANGE).contains(verl.__version__, prereleases=True):
        log.warning(
            "SetPO's veRL plug-in is tested with veRL %s (setpo-client[verl]); this is %s",
            TESTED_RANGE,
            verl.__version__,
        )
    n, estimator = config.actor_rollout_ref.rollout.n, str(config.algorithm.adv_estimator)
    ready_timeout = float(settings.get("ready_timeout", 120.0))
    info = shaper_for(settings).start(n, estimator, GROUP_ESTIMATORS, spell, ready_timeout)
    log.info(
        "SetPO on: lambda=%s with %s at %s (groups of %d; the service takes %d groups of at most %d a request, %d bytes)",
        settings.get("weight", 0.05),
        info.model,
        settings["url"],
        n,
        info.limits.max_groups,
        info.limits.max_group_size,
        info.limits.max_body_bytes,
    )
    log.info("SetPO diversity policy: %s", " ".join(f"{name}={settings.get(name)}" for name in POLICY_SETTINGS))
    if (config.algorithm.get("filter_groups") or {}).get("enable", False):
        if not config.trainer.get("use_v1", True):
            log.warning(
                "SetPO: veRL's v0 trainer (trainer.use_v1=false) ignores algorithm.filter_groups; a trainer that "
                "filters in its own fit() (verl-recipe's RayDAPOTrainer) does so before the advantage step, where "
                "SetPO cannot keep groups (keep_groups works on the v1 trainer)"
            )
        else:
            log.info(
                "SetPO: DAPO's filter_groups %s the groups SetPO's bonus sets apart (keep_groups)",
                "keeps" if keep else "drops",
            )
    v1 = config.trainer.get("v1") or {}
    passes = (v1.get(v1.get("trainer_mode", "sync")) or {}).get("parameter_sync_step", 1)
    if config.trainer.get("use_v1", True) and passes > 1 and settings.get("target_ratio") is not None:
        log.warning(
            "SetPO: parameter_sync_step=%d runs the advantage step %d times a training step; the weight controller "
            "steps once a pass, so warmup_steps and freeze_after count passes (%d a training step)",
            passes,
            passes,
            passes,
        )
    agent = config.actor_rollout_ref.rollout.get("agent") or {}
    built_in = agent.get("default_agent_loop", "single_turn_agent") in ("single_turn_agent", "tool_agent")
    if estimator != "grpo" and (agent.get("agent_loop_config_path") or not built_in):
        # veRL's own loops give one output a session; a user's may give several, each a member under every
        # estimator but grpo, and veRL's config does not say how many: only the run can (shape_transfer_queue fits
        # a group the service cannot take, counted)
        log.warning(
            "SetPO: with a custom agent loop and %s=%s a group holds %s=%d x the outputs a session returns; the "
            "service takes at most %d members a group. A group above that is fitted: one member a session, its "
            "final output, as veRL's GRPO counts them (setpo/fitted_groups); raise SETPO_MAX_GROUP_SIZE (and "
            "SETPO_MAX_REQUEST_ROWS) on the service to score every output",
            spell("estimator"),
            estimator,
            spell("group_size"),
            n,
            largest_group(info.limits),
        )


def check_trainer(trainer_class) -> None:
    """What the plug-in relies on in veRL, checked before any worker starts: a veRL release (or a trainer class)
    that moves one stops the run here, naming it, instead of training without SetPO or without its metrics."""
    from verl.trainer.ppo import padding_utils
    from verl.trainer.ppo.v1 import utils as v1_utils
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    def refuse(what: str) -> NoReturn:
        raise RuntimeError(f"SetPO is enabled but {what}. Use veRL's own trainers (veRL 0.9.x), or disable SetPO.")

    step = getattr(trainer_class, "_compute_advantage", None)
    if step is None:  # a legacy-style trainer calls module functions, by the names its classes' modules bound
        for cls in trainer_class.__mro__[:-1]:
            bound = vars(sys.modules[cls.__module__])
            for name, effect in (
                ("compute_advantage", "train without SetPO"),
                ("compute_data_metrics", "log no setpo/* metrics"),
                ("compute_rollout_correction_and_add_to_batch", "embed texts with the rejected tokens cut out"),
            ):
                if name in bound and not getattr(bound[name], "setpo_wrapped", False):
                    refuse(
                        f"{trainer_class.__name__} calls {cls.__module__}.{name}, not the plug-in's: it would {effect}"
                    )
        return
    if not getattr(step, "setpo_wrapped", False):
        refuse(
            f"{trainer_class.__name__}'s advantage step is not the plug-in's: this trainer would train without SetPO"
        )
    if not all(getattr(cls._dapo_filtered_keys, "setpo_wrapped", False) for cls in (ReplayBuffer, ReplayBufferAsync)):
        refuse(
            "veRL's ReplayBuffer._dapo_filtered_keys is not the plug-in's: DAPO's filter would drop what SetPO keeps"
        )
    if not getattr(v1_utils.MetricsAggregator._init_aggregation_rules, "setpo_wrapped", False):
        refuse("veRL's MetricsAggregator is not the plug-in's: with parameter_sync_step > 1 it would misreduce setpo/*")
    # veRL's v1 step calls the compute_advantage v1/utils bound before the plug-in wrapped it; bound to the
    # wrapper (or looked up at call time), SetPO would shape inside veRL's step and again after it
    captured = vars(v1_utils).get("compute_advantage")
    if captured is None or getattr(captured, "setpo_wrapped", False):
        refuse("verl.trainer.ppo.v1.utils.compute_advantage is not veRL's own function bound at import")
    # the agent loop names a session's outputs {uid}_{session_id}_{i}; veRL's GRPO, and the plug-in after it
    # (shape_transfer_queue), find a session's final output by splitting that key. Both happen inside functions,
    # so their source is what can be checked: a release that keys rows another way stops the run here
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    writes = inspect.getsource(AgentLoopWorkerTQ._agent_loop_postprocess)
    reads = inspect.getsource(v1_utils.compute_advantage_for_multi_trajectories)
    if 'f"{uid}_{session_id}_{i}"' not in writes or 'key.rsplit("_", 2)' not in reads:
        refuse(
            "veRL's agent loop and GRPO no longer key a session's outputs {uid}_{session_id}_{index} "
            "(verl.trainer.ppo.v1.agent_loop_tq, v1/utils.compute_advantage_for_multi_trajectories)"
        )
    try:
        from verl.workers.utils.padding import response_to_nested  # noqa: F401  (writes the shaped advantages back)
    except ImportError:
        refuse("verl.workers.utils.padding.response_to_nested, which writes the shaped advantages back, is gone")
    _, tag = padding_utils.construct_minimal_padding_template({}, {}, 0)  # how veRL marks its padding rows
    if tag.get("is_padding") is not True:
        refuse(f"veRL's padding rows no longer carry the tag is_padding (their tag: {sorted(tag)})")


def shape_sessions(
    texts: list[str | None],
    uids: Sequence,
    sessions: Sequence[tuple | None],
    rewards: Sequence[float],
    advantages: Sequence[float],
    shaper: SetpoShaper,
    started: float,
    early: Submitted | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """lambda * s_i for every row (B,) and the step's setpo/* metrics. sessions[row] = (session, output index) or
    None for a row that is not part of any group (padding). A session's member of its uid's group is its final
    output (highest index; texts[row] None: not scorable), with that output's reward and advantage, as veRL's
    GRPO takes them; the session's bonus goes to all its rows. rewards, advantages: one number a row. early: this
    batch's scoring, submitted before veRL's log-prob passes; its answer is used only if what it sent is exactly
    what would be sent now, else the step is scored here (the early one dropped, counted as setpo/dropped_steps)."""
    finals, members = session_groups(uids, sessions)
    groups, scores = member_lists(members, texts, rewards)
    per_member = [[advantages[row] for row in group] for group in members]
    if early is not None and (early.pending.groups, early.pending.rewards) == (groups, scores):
        step = early.pending.result(per_member, since=started)  # the plug-in's reads at collect blocked too
    else:
        if early is not None:  # a row rejected whole by rollout correction since: the answer is not this step's
            log.warning("SetPO: the step's members changed after its scoring started (rollout correction); re-scored")
        step = shaper.score(groups, rewards=scores, advantages=per_member, started=started)
    of_final = {row: value for group, values in zip(members, step.bonus) for row, value in zip(group, values)}
    bonus = torch.tensor([of_final[finals[session[0]]] if session is not None else 0.0 for session in sessions])  # (B,)
    return bonus, step.metrics


def member_lists(members: list[list[int]], texts: Sequence, rewards: Sequence[float]) -> tuple[list, list]:
    """The groups' texts and rewards, as SetpoShaper takes them: members are the groups' rows (session_groups)."""
    return [[texts[row] for row in group] for group in members], [
        [float(rewards[row]) for row in group] for group in members
    ]


def rejects_rows(algorithm_config) -> bool:
    """Whether veRL's rollout correction may reject whole rows inside the advantage step (a sequence-level
    rollout_rs in decoupled mode): those steps are scored at the advantage step, since an answer started earlier
    would almost always be for members that no longer exist. Token-level rejection rejects a row whole only if it
    rejects every token of it: that rare step is caught at collect (shape_sessions) and re-scored."""
    correction = algorithm_config.get("rollout_correction") or {}
    options = str(correction.get("rollout_rs") or "").split(",")
    return not correction.get("bypass_mode", False) and any(option.strip().startswith("seq") for option in options)


def early_settings(trainer) -> dict | None:
    """The settings of a trainer whose steps are scored early (before veRL's log-prob passes), or None: SetPO off,
    or veRL may reject whole rows before the advantage step (rejects_rows)."""
    algorithm = trainer.config.get("algorithm")
    settings = setpo_settings(algorithm)
    return None if settings is None or rejects_rows(algorithm) else settings


def submitted_for(shaper: SetpoShaper, rows: tuple, tensors: tuple = ()) -> Submitted | None:
    """The step submitted for these rows and not yet collected (v0: decoded from these tensors), or None."""
    early = _submitted.get(shaper)
    if early is None or early.pending is not shaper.pending or early.rows != rows:
        return None
    return early if all(torch.equal(a, b) for a, b in zip(early.tensors, tensors)) else None


def take_submitted(shaper: SetpoShaper, rows: tuple, tensors: tuple = ()) -> Submitted | None:
    """At the advantage step: the step submitted early for this very batch, taken out, or None. One submitted for
    other rows is never applied: score() drops it when it submits this batch's (setpo/dropped_steps)."""
    early = submitted_for(shaper, rows, tensors)
    stale = _submitted.pop(shaper, None)
    if early is None and stale is not None and stale.pending is shaper.pending:
        log.warning("SetPO: the scoring started before veRL's log-prob passes was for other rows; scoring this batch")
    return early


def row_sessions(keys: Sequence[str], tags: Sequence[dict], estimator: str) -> list[tuple | None]:
    """Each row's (member, output index), the member being what veRL's estimator counts as one sample: under "grpo"
    veRL's v1 step folds a multi-output session into its final output (utils.compute_advantage_for_multi_trajectories,
    reading the agent loop's key {uid}_{session}_{index}), so a session is one member; every other estimator (rloo,
    grpo_vectorized, ...) compares every output, so each row is. None for veRL's padding rows."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    sessions: list[tuple | None] = []
    for key, tag in zip(keys, tags):
        if tag.get("is_padding", False):
            sessions.append(None)
        elif estimator == AdvantageEstimator.GRPO:
            uid, session, index = key.rsplit("_", 2)
            sessions.append((f"{uid}_{session}", int(index)))
        else:
            sessions.append((key, 0))
    return sessions


def session_groups(uids: Sequence, sessions: Sequence[tuple | None]) -> tuple[dict, list[list[int]]]:
    """(member -> its final row (highest output index), the groups: per uid, its members' final rows in order of
    first appearance)."""
    finals: dict = {}
    for row, session in enumerate(sessions):
        if session is not None and (session[0] not in finals or sessions[finals[session[0]]][1] < session[1]):
            finals[session[0]] = row
    groups: dict = {}
    for row in finals.values():
        groups.setdefault(uids[row], []).append(row)
    return finals, list(groups.values())


def policy_texts(tokenizer, responses, generated_masks, trained_masks) -> list[str | None]:
    """What the policy wrote in each row: its turns (runs of its own tokens; tool and environment output between
    them left out) decoded one by one and joined a line apart, as a chat shows them, not run together. The
    generated mask is response_mask as the rollout made it: rollout correction later zeroes single rejected
    tokens, which must not punch holes in the text. None for a row veRL does not train at all (trained mask all
    0: rejected whole) or with no token of the policy."""
    texts: list[str | None] = []
    for ids, generated, trained in zip(responses, generated_masks, trained_masks):
        edges = torch.nn.functional.pad(generated.bool().int(), (1, 1)).diff()  # (T+1,) +1: a turn starts, -1: ends
        starts, ends = (edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()
        turns = [tokenizer.decode(ids[start:end], skip_special_tokens=True) for start, end in zip(starts, ends)]
        texts.append("\n".join(turn for turn in turns if turn) if trained.any() and starts else None)
    return texts


def row_rewards_and_advantages(scores: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor):
    """Each row's reward, veRL's token-level scores summed over the response (what its GRPO sums; the scores, not
    the rewards, so a KL penalty in the reward does not put a correct answer below min_reward), and its
    advantage, the mean over the tokens veRL trains (one value on them for every group estimator; 0 for none).
    scores, advantages, mask: (B, T)."""
    trained = mask.to(advantages.dtype)
    per_row = (advantages * trained).sum(-1) / trained.sum(-1).clamp(min=1)  # (B,)
    return scores.sum(-1).tolist(), per_row.tolist()


def shape_batch(data, generated_mask, tokenizer, shaper: SetpoShaper, started: float, early: Submitted | None = None):
    """v0: add lambda * s_i to every trained response token of a DataProto whose advantages veRL has just
    computed. Needs batch["responses"], batch["response_mask"] (what veRL trains), batch["token_level_scores"],
    batch["advantages"] and non_tensor_batch["uid"]; generated_mask (B, T): response_mask before rollout
    correction. early: this batch's scoring, started before veRL's log-prob passes (submit_v0), whose texts
    are this batch's."""
    mask = data.batch["response_mask"]  # (B, T)
    if early is None:
        texts = policy_texts(tokenizer, data.batch["responses"], generated_mask, mask)
    else:  # decoded at submit from the same responses and rollout mask; a row veRL no longer trains is not sent
        texts = [text if trained.any() else None for text, trained in zip(early.texts, mask)]
    rewards, advantages = row_rewards_and_advantages(data.batch["token_level_scores"], data.batch["advantages"], mask)
    rows = range(len(texts))
    bonus, metrics = shape_sessions(
        texts,
        data.non_tensor_batch["uid"].tolist(),
        [(row, 0) for row in rows],
        rewards,
        advantages,
        shaper,
        started,
        early,
    )
    data.batch["advantages"] = (
        data.batch["advantages"] + bonus.to(mask.device, data.batch["advantages"].dtype)[:, None] * mask
    )
    return data, metrics


def submit_v0(trainer, data) -> None:
    """v0, before veRL's first pass between the reward and the advantage step: the step's scoring starts, its
    members as shape_batch will take them (each row, its text as the rollout wrote it, its reward the summed
    rm_scores, which veRL makes the token-level scores). Once a step: the later passes find it submitted."""
    settings = early_settings(trainer)
    if settings is None or "rm_scores" not in data.batch:  # no reward yet (a trainer of its own): scored late
        return
    started, shaper = time.perf_counter(), shaper_for(settings)
    uids = data.non_tensor_batch["uid"].tolist()
    responses, mask = data.batch["responses"], data.batch["response_mask"]  # (B, T): nothing rejected yet
    if submitted_for(shaper, tuple(uids), (responses, mask)) is not None:
        return
    texts = policy_texts(_tokenizer(settings), responses, mask, mask)
    _, members = session_groups(uids, [(row, 0) for row in range(len(uids))])
    groups, rewards = member_lists(members, texts, data.batch["rm_scores"].sum(-1).tolist())
    pending = shaper.submit(groups, rewards=rewards, started=started)
    _submitted[shaper] = Submitted(pending, tuple(uids), texts, (responses, mask))


def generated_texts(batch, tokenizer) -> tuple[list[str | None], list]:
    """v1, before veRL's advantage step (whose rollout correction rewrites response_mask): what the policy wrote in
    each row, and each row's generated mask; None where the policy wrote nothing."""
    import transfer_queue as tq

    fields = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses", "response_mask"]
    )
    masks = fields["response_mask"].unbind()
    return policy_texts(tokenizer, fields["responses"].unbind(), masks, masks), masks


def transfer_queue_sessions(batch, uids: list, estimator: str, shaper: SetpoShaper, started: float) -> tuple[list, int]:
    """v1: each row's member of its group (row_sessions) and the groups fitted: a group of more outputs than the
    service takes (a loop's multi-output sessions under a per-output estimator) is fitted as veRL's GRPO takes it,
    one member a session (rollout.n of them: start() proved those fit). Limits not known (forgotten after a failed
    step, or a replica taken back since) are asked within what is left of the step's one budget, which began at
    `started` (time.perf_counter()): the step's scoring then has the rest, so a service still down holds veRL one
    budget a step, not more."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    tags = batch.tags or [{}] * len(batch.keys)
    sessions = row_sessions(batch.keys, tags, estimator)
    deadline = shaper.deadline(started)
    if not shaper.info_known() and shaper.weight > 0 and (deadline is None or deadline > time.monotonic()):
        with contextlib.suppress(SetpoError):  # a failure here meets the step's scoring, under the fault policy
            shaper.info = shaper.learn_info(deadline)
    largest = largest_group(shaper.info.limits) if shaper.info is not None else None
    outputs = Counter(uid for uid, session in zip(uids, sessions) if session is not None)
    fitted = {uid for uid, count in outputs.items() if largest is not None and count > largest}
    if fitted:
        as_grpo = row_sessions(batch.keys, tags, AdvantageEstimator.GRPO)
        sessions = [
            as_grpo[row] if uid in fitted else session for row, (uid, session) in enumerate(zip(uids, sessions))
        ]
    return sessions, len(fitted)


def listed(values) -> list:
    """A TransferQueue field of strings (uid) as a list."""
    return np.array(values.tolist() if hasattr(values, "tolist") else list(values), dtype=object).tolist()


def submit_v1(trainer, batch) -> None:
    """v1, before veRL's first pass between the reward and the advantage step: the step's scoring starts, its
    members as shape_transfer_queue will take them. Once a step: the later passes find it submitted."""
    import transfer_queue as tq

    settings, rows = early_settings(trainer), (batch.partition_id, tuple(batch.keys))
    if settings is None or submitted_for(shaper_for(settings), rows) is not None:
        return
    started, shaper = time.perf_counter(), shaper_for(settings)
    fields = tq.kv_batch_get(
        keys=batch.keys,
        partition_id=batch.partition_id,
        select_fields=["uid", "responses", "response_mask", "rm_scores"],
    )
    masks = fields["response_mask"].unbind()  # as the rollout made it: nothing rejected yet
    texts = policy_texts(trainer.tokenizer, fields["responses"].unbind(), masks, masks)
    uids = listed(fields["uid"])
    sessions, _ = transfer_queue_sessions(batch, uids, trainer.config.algorithm.adv_estimator, shaper, started)
    _, members = session_groups(uids, sessions)
    groups, rewards = member_lists(members, texts, fields["rm_scores"].to_padded_tensor(0.0).sum(-1).tolist())
    pending = shaper.submit(groups, rewards=rewards, started=started)
    _submitted[shaper] = Submitted(pending, rows, texts)


def shape_transfer_queue(
    batch, texts: list[str | None], estimator: str, shaper: SetpoShaper, started: float, early: Submitted | None = None
) -> dict[str, float]:
    """v1: read the step's fresh advantages from TransferQueue, shape, write back. texts: generated_texts() (or
    early's, the same rows'). A member of a prompt's group is what veRL's estimator counts as one sample
    (row_sessions)."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    fields = tq.kv_batch_get(
        keys=batch.keys,
        partition_id=batch.partition_id,
        select_fields=["uid", "response_mask", "rm_scores", "advantages"],
    )
    nested_mask = fields["response_mask"]  # after rollout correction: what veRL trains; a rejected row is all 0
    texts = [text if trained.any() else None for text, trained in zip(texts, nested_mask.unbind())]
    uids = listed(fields["uid"])
    # the step's budget began at its submit when it was submitted early
    began = early.pending.started if early is not None else started
    sessions, fitted = transfer_queue_sessions(batch, uids, estimator, shaper, began)
    advantages = fields["advantages"].to_padded_tensor(0.0)  # (B, T)
    padded_mask = nested_mask.to_padded_tensor(0)  # (B, T)
    # v1's advantage step reads the reward model's rm_scores as veRL's token_level_scores
    rewards, row_advantages = row_rewards_and_advantages(
        fields["rm_scores"].to_padded_tensor(0.0), advantages, padded_mask
    )
    bonus, metrics = shape_sessions(texts, uids, sessions, rewards, row_advantages, shaper, started, early)
    metrics["setpo/fitted_groups"] = float(fitted)
    shaped = advantages + bonus.to(advantages.dtype)[:, None] * padded_mask
    tq.kv_batch_put(
        keys=batch.keys,
        partition_id=batch.partition_id,
        fields=TensorDict({"advantages": response_to_nested(shaped, nested_mask)}, batch_size=len(batch)),
    )
    return metrics


def kept_by_bonus(keys: list[str], partition_id: str, tokenizer, estimator: str, shaper: SetpoShaper) -> set[str]:
    """v1, at DAPO's filter: of the groups it drops (keys: their rows, {uid}_{session}_{index}), the uids whose
    shaped advantages would still differ (would_shape). Members as the advantage step takes them (row_sessions);
    reward: rm_scores summed."""
    import transfer_queue as tq

    if not keys:
        return set()
    fields = tq.kv_batch_get(
        keys=keys, partition_id=partition_id, select_fields=["responses", "response_mask", "rm_scores"]
    )
    masks = fields["response_mask"].unbind()
    texts = policy_texts(tokenizer, fields["responses"].unbind(), masks, masks)
    rewards = [float(scores.sum()) for scores in fields["rm_scores"].unbind()]
    uids = [key.rsplit("_", 2)[0] for key in keys]
    _, groups = session_groups(uids, row_sessions(keys, [{}] * len(keys), estimator))
    return {
        uids[rows[0]]
        for rows in groups
        if would_shape(shaper, [texts[row] for row in rows], [rewards[row] for row in rows])
    }


def install() -> None:
    """Wrap veRL's advantage steps and trainer constructors (idempotent). Called when `import verl` loads this plug-in."""
    from verl.trainer.ppo import ray_trainer, rollout_corr_helper
    from verl.trainer.ppo.v1 import replay_buffer, trainer_base
    from verl.trainer.ppo.v1 import utils as v1_utils

    if getattr(ray_trainer.compute_advantage, "setpo_wrapped", False):
        return
    original_rules = v1_utils.MetricsAggregator._init_aggregation_rules
    original_function = ray_trainer.compute_advantage
    original_correction = rollout_corr_helper.compute_rollout_correction_and_add_to_batch
    original_metrics = ray_trainer.compute_data_metrics
    original_method = trainer_base.PPOTrainer._compute_advantage
    original_v1_init = trainer_base.PPOTrainer.__init__
    original_v0_init = ray_trainer.RayPPOTrainer.__init__
    original_build_buffer = trainer_base.PPOTrainer._build_replay_buffer
    original_filter = replay_buffer.ReplayBuffer._dapo_filtered_keys

    def compute_rollout_correction_and_add_to_batch(batch, *args, **kwargs):
        # v0 trainers correct just before compute_advantage, rewriting response_mask: keep the rollout's, in the
        # batch so that it follows the rows, until compute_advantage takes it out
        generated = batch.batch["response_mask"]
        batch, metrics = original_correction(batch, *args, **kwargs)
        batch.batch[GENERATED_MASK] = generated
        return batch, metrics

    def compute_advantage(data, *args, config=None, **kwargs):
        generated = data.batch.pop(GENERATED_MASK, None)  # out before veRL sees the batch, SetPO on or off
        data = original_function(data, *args, config=config, **kwargs)
        settings = setpo_settings(config)
        if settings is None:
            return data
        started = time.perf_counter()
        generated = generated if generated is not None else data.batch["response_mask"]  # nothing was rejected
        tokenizer, shaper = _tokenizer(settings), shaper_for(settings)
        uids = tuple(data.non_tensor_batch["uid"].tolist())
        early = take_submitted(shaper, uids, (data.batch["responses"], generated))
        data, data.meta_info["setpo_metrics"] = shape_batch(data, generated, tokenizer, shaper, started, early)
        return data

    def compute_data_metrics(batch, *args, **kwargs):
        return {**original_metrics(batch, *args, **kwargs), **batch.meta_info.get("setpo_metrics", {})}

    def _compute_advantage(self, batch, metrics: dict):
        settings = setpo_settings(self.config.algorithm)
        if settings is None:
            return original_method(self, batch, metrics)
        decoding_started, shaper = time.perf_counter(), shaper_for(settings)
        early = take_submitted(shaper, (batch.partition_id, tuple(batch.keys)))  # submit_v1's, for these rows
        # before veRL's step: its rollout correction masks tokens
        texts = early.texts if early is not None else generated_texts(batch, self.tokenizer)[0]
        decoding = time.perf_counter() - decoding_started
        batch = original_method(self, batch, metrics)
        started = time.perf_counter() - decoding  # setpo/time_s: the plug-in's own work, not veRL's step between
        estimator = self.config.algorithm.adv_estimator
        metrics.update(shape_transfer_queue(batch, texts, estimator, shaper, started, early))
        if keeps_groups(settings) and (self.config.algorithm.get("filter_groups") or {}).get("enable", False):
            # the groups DAPO's filter kept since the last pass (they were kept before the step sampled them)
            metrics["setpo/kept_by_bonus"] = float(vars(self.replay_buffer).pop("setpo_kept_by_bonus", 0))
        return batch

    def _build_replay_buffer(self):
        buffer = original_build_buffer(self)
        buffer.setpo_trainer = self  # the filter reads the trainer's config, and its tokenizer (made later)
        return buffer

    def _dapo_filtered_keys(self, partition_id: str):
        uids, counts = original_filter(self, partition_id)
        trainer = getattr(self, "setpo_trainer", None)  # None: a buffer the trainer did not build
        settings = None if trainer is None or not uids else setpo_settings(trainer.config.algorithm)
        if trainer is None or settings is None or not keeps_groups(settings):
            return uids, counts
        # veRL re-returns its cached verdicts every poll: decide each group once
        dropped = vars(self).setdefault("setpo_dropped", {}).setdefault(partition_id, set())
        dropped &= uids
        shaper = shaper_for(settings)
        fresh = uids - dropped
        keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in fresh]
        try:
            kept = kept_by_bonus(keys, partition_id, trainer.tokenizer, trainer.config.algorithm.adv_estimator, shaper)
        except Exception as exc:  # a key function that raises: on_error decides, as for a step's scoring
            if shaper.on_error == "fail":
                raise
            log.error("SetPO: could not tell which filtered groups to keep (%r); DAPO drops them", exc)
            kept = set()
        dropped |= fresh - kept
        cache = self._dapo_classification_cache[partition_id]
        for uid in kept:
            counts[cache[uid]] -= 1
            cache[uid] = None  # an ordinary sampleable group to veRL from now on
        self.setpo_kept_by_bonus = getattr(self, "setpo_kept_by_bonus", 0) + len(kept)
        return uids - kept, +counts

    def _init_aggregation_rules(self) -> dict[str, list[str]]:
        rules = original_rules(self)
        return {
            **rules,
            "sum": [*rules.get("sum", []), *SUMMED_METRICS],
            "last": [*rules.get("last", []), *LAST_METRICS],
        }

    def v1_init(self, config, *args, **kwargs):
        check_start(config, type(self))  # before the trainer builds anything: init() starts the workers
        original_v1_init(self, config, *args, **kwargs)

    def v0_init(self, config, *args, **kwargs):
        check_start(config, type(self))
        original_v0_init(self, config, *args, **kwargs)

    wrappers: tuple[Any, ...] = (
        compute_advantage,
        compute_data_metrics,
        _compute_advantage,
        v1_init,
        v0_init,
        compute_rollout_correction_and_add_to_batch,
        _init_aggregation_rules,
        _build_replay_buffer,
        _dapo_filtered_keys,
    )
    for wrapper in wrappers:
        wrapper.setpo_wrapped = True
    for trainer_class, submit in ((ray_trainer.RayPPOTrainer, submit_v0), (trainer_base.PPOTrainer, submit_v1)):
        for name in EARLY_PASSES:
            setattr(trainer_class, name, submitting_first(getattr(trainer_class, name), submit))
    ray_trainer.compute_advantage = compute_advantage
    rollout_corr_helper.compute_rollout_correction_and_add_to_batch = compute_rollout_correction_and_add_to_batch
    ray_trainer.compute_data_metrics = compute_data_metrics
    trainer_base.PPOTrainer._compute_advantage = _compute_advantage
    trainer_base.PPOTrainer.__init__ = v1_init
    ray_trainer.RayPPOTrainer.__init__ = v0_init
    v1_utils.MetricsAggregator._init_aggregation_rules = _init_aggregation_rules
    trainer_base.PPOTrainer._build_replay_buffer = _build_replay_buffer
    replay_buffer.ReplayBuffer._dapo_filtered_keys = _dapo_filtered_keys


def submitting_first(method, submit: Callable):
    """veRL's pass `method` (old log-probs, reference, values), which the step's scoring starts before: submit(trainer,
    batch) starts it once a step, at the first of these passes that runs, and the passes then hide it."""

    @functools.wraps(method)
    def wrapper(self, batch, *args, **kwargs):
        submit(self, batch)
        return method(self, batch, *args, **kwargs)

    wrapper.setpo_wrapped = True  # type: ignore[attr-defined]
    return wrapper


_tokenizers: dict[str, object] = {}


def _tokenizer(settings: dict):
    """v0's compute_advantage gets no tokenizer: name it with +algorithm.setpo.tokenizer=<model path>."""
    path = settings.get("tokenizer")
    if not path:
        raise ValueError(
            "with trainer.use_v1=false, SetPO needs +algorithm.setpo.tokenizer='${actor_rollout_ref.model.path}'"
        )
    if path not in _tokenizers:
        from transformers import AutoTokenizer

        _tokenizers[path] = AutoTokenizer.from_pretrained(path)
    return _tokenizers[path]


def enabled_on_command_line(argv: Sequence[str]) -> bool:
    """Whether the run's Hydra overrides switch SetPO on: the only config there is while veRL loads plug-ins."""
    return any(arg.lstrip("+").lower() in ("algorithm.setpo.enable=true", "algorithm.setpo.enable=1") for arg in argv)


try:  # loaded by veRL's plug-in discovery, which hides import errors at debug level: say it ourselves
    install()
except Exception as exc:
    if enabled_on_command_line(sys.argv):  # SystemExit passes veRL's `except Exception`: the run stops here
        log.error("setpo veRL plug-in could not install itself", exc_info=True)
        raise SystemExit(
            f"SetPO is enabled (+algorithm.setpo.enable=true) but its veRL plug-in could not install itself: {exc!r}. "
            "Fix the installation (setpo-client[verl] with veRL 0.9.x) or disable SetPO."
        ) from exc
    log.warning(
        "setpo veRL plug-in could not install itself; SetPO is unavailable in this process (%r)", exc, exc_info=True
    )

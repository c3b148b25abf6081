"""Every call the veRL plug-in makes into SetpoShaper's step, in one place: the step's scoring submitted early,
taken back at the advantage step only if it is still this batch's, shaped (or scored there), and the service's
limits asked within the step's budget. The early submit and its checks: docs/trl-and-verl.md#off-the-critical-path-verl."""

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from setpo_client.errors import SetpoError
from setpo_client.shaping import PendingStep, SetpoShaper, largest_group

from .rows import member_lists, session_groups

log = logging.getLogger("setpo_client.verl")


@dataclass
class Submitted:
    """A step whose scoring started before veRL's log-prob passes: its scoring in flight, the rows it was read from
    (TransferQueue partition and keys) and each row's text."""

    pending: PendingStep
    rows: tuple
    texts: list[str | None]


_submitted: dict[SetpoShaper, Submitted] = {}  # at most one a shaper, as the shaper has at most one step in flight


def submit(shaper: SetpoShaper, rows: tuple, texts: list[str | None], uids, sessions, rewards, started: float) -> None:
    """The step's scoring starts, its members (session_groups) as shape() will take them."""
    _, members = session_groups(uids, sessions)
    groups, scores = member_lists(members, texts, rewards)
    _submitted[shaper] = Submitted(shaper.submit(groups, rewards=scores, started=started), rows, texts)


def submitted_for(shaper: SetpoShaper, rows: tuple) -> Submitted | None:
    """The step submitted for these rows and not yet collected, or None."""
    early = _submitted.get(shaper)
    return early if early is not None and early.pending is shaper.pending and early.rows == rows else None


def take_submitted(shaper: SetpoShaper, rows: tuple) -> Submitted | None:
    """At the advantage step: the step submitted early for this very batch, taken out, or None. One submitted for
    other rows is never applied: score() drops it when it submits this batch's (setpo/dropped_steps)."""
    early = submitted_for(shaper, rows)
    stale = _submitted.pop(shaper, None)
    if early is None and stale is not None and stale.pending is shaper.pending:
        log.warning("SetPO: the scoring started before veRL's log-prob passes was for other rows; scoring this batch")
    return early


def largest_group_now(shaper: SetpoShaper, started: float, early: Submitted | None = None) -> int | None:
    """The most members a group may have for the service to score it (None: not known). Limits not known
    (forgotten after a failed step, or a replica taken back since) are asked within what is left of the step's one
    budget, which began at `started` (time.perf_counter()), or at its submit when it was submitted early: the
    step's scoring then has the rest, so a service still down holds veRL one budget a step, not more."""
    deadline = shaper.deadline(early.pending.started if early is not None else started)
    if not shaper.info_known() and shaper.weight > 0 and (deadline is None or deadline > time.monotonic()):
        with contextlib.suppress(SetpoError):  # a failure here meets the step's scoring, under the fault policy
            shaper.info = shaper.learn_info(deadline)
    return largest_group(shaper.info.limits) if shaper.info is not None else None


def shape(
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

"""What every trainer integration (OpenRLHF, TRL, veRL, the bandit) does once per step, in one place: the diversity
policy, the base advantage and how the bonus combines with it, the step's requests (fitting.py), the one fault policy,
the weight, the step's timing and its setpo/* metrics (docs/service.md, "The Python client"; docs/diversity.md).

    shaper = SetpoShaper(SetpoClient(url), weight=0.05, on_error="skip")              # the paper's form
    shaper = SetpoShaper(SetpoClient(url), weight=0.5, min_reward=1.0, key=countdown_expression,
                         kernel="hybrid", normalize="zscore", controller=WeightController(target_ratio=0.3))
    shaper.start(group_size=8)                     # at start: groups scoreable, service ready, key accepted, limits
    shaper.submit(texts_per_group, rewards=...)    # early, as soon as the texts (and, with min_reward, rewards) exist
    step = shaper.shape(texts_per_group, rewards=..., advantages=...)   # late, where the advantages are combined
    train_on(step.advantages); logger.log(step.metrics)

A member may be None (padding, a rejected sample): not scored, bonus 0. The degrade policy: a group the service cannot
score gets bonus 0 and is counted; any other failure is the step's: on_error="skip" trains it with lambda = 0
(setpo/fallback_steps), "fail" stops training (docs/service.md, "Trainer integrations": degrading).
"""

import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from statistics import fmean, pstdev
from typing import Literal

from setpo_client.client import SetpoClient
from setpo_client.errors import SetpoError
from setpo_client.fitting import MIN_GROUP, Chunk, fit_step, largest_group, text_chars
from setpo_client.policy import check_form, check_steerable, pushes_equal_rewards
from setpo_client.types import Advantage, Combine, GroupResult, Info, Kernel, Limits, Normalize
from setpo_client.weight import WeightController

__all__ = ["MIN_GROUP", "PendingStep", "SetpoShaper", "ShapedStep", "largest_group", "text_chars", "would_shape"]
log = logging.getLogger("setpo_client")

OnError = Literal["skip", "fail"]
# a second request in flight to one replica gains nothing (docs/benchmarks.md, "How replicas scale")
IN_FLIGHT_PER_REPLICA = 1


@dataclass
class PendingStep:
    """A step submitted to SetpoShaper.submit: its members, rewards and keys (copied), counts and work in flight."""

    groups: list[list]
    scorable: list[list[int]]
    rewards: list[list[float]] | None
    keys: list[list[str | None]] | None
    counts: dict[str, int]
    weight: float
    started: float
    work: Future | None  # None: nothing to ask (weight 0, no groups)
    submit_s: float = 0.0  # the caller's time from `started` to submit's return
    work_s: float = 0.0  # the work's own time on its thread, set when it ends, answered or failed


@dataclass
class ShapedStep:
    bonus: list[list[float]]  # the service's bonus per member; 0 for unscored members, groups and fallbacks
    # each member's advantage to train on: the base (the caller's advantages, or the one `advantage` names) combined
    # with the bonus; None when the base is the framework's and the caller passed no advantages
    advantages: list[list[float]] | None
    marginals: list[list[float] | None] | None  # raw scoped s_i of each scored group's members sent; None on fallback
    metrics: dict[str, float]  # "setpo/..." names (docs/service.md, "The Python client")


class SetpoShaper:
    """Scores one training step's groups under the diversity policy, the service's limits and the degrade policy.
    max_chars caps each text further (its beginning kept, as the server keeps it); in_flight: requests in flight at
    once (default one per replica, within /info's max_concurrent_requests and max_requests_per_caller). advantage:
    'framework' (the caller's advantages), or 'maxrl' / 'w_reinforce' from the step's pass/fail rewards
    (positive_weight: W-REINFORCE's lambda); combine: 'add' (A + bonus, the paper's) or 'reshare' (the bonus re-shares
    the base's positive push; normalize='zscore')."""

    def __init__(
        self,
        client: SetpoClient,
        weight: float,
        on_error: OnError = "skip",
        max_chars: int | None = None,
        *,
        min_reward: float | None = None,
        key: Callable[[str], str | None] | None = None,
        kernel: Kernel = "embedding",
        normalize: Normalize = "none",
        controller: WeightController | None = None,
        step_timeout: float | None = None,
        embed_span: str | None = None,
        in_flight: int | None = None,
        advantage: Advantage = "framework",
        positive_weight: float = 0.1,
        combine: Combine = "add",
    ):
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight (lambda) must be a finite number >= 0, got {weight}")
        if on_error not in ("skip", "fail"):
            raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
        check_form(kernel, normalize, min_reward, embed_span, advantage, combine, positive_weight)
        if advantage != "framework" or combine != "add":
            import setpo_core.advantages  # noqa: F401  (their math: a missing setpo-core fails here, not at a step)
        if in_flight is not None and in_flight < 1:
            raise ValueError(f"in_flight must be >= 1 (requests in flight at once), got {in_flight}")
        if controller is not None:
            check_steerable(weight)
            controller.start(weight)
            weight = controller.weight
        self.client, self.weight, self.on_error, self.max_chars = client, weight, on_error, max_chars
        self.min_reward, self.key, self.kernel, self.normalize = min_reward, key, kernel, normalize
        self.controller, self.in_flight = controller, in_flight
        self.advantage, self.positive_weight, self.combine = advantage, positive_weight, combine
        self.embed_span = None if embed_span is None else re.compile(embed_span, re.DOTALL)
        # one budget for a step's requests, retries and waits included (default: the client's timeout)
        timeout = client.timeout if isinstance(client.timeout, int | float) else client.timeout.read
        self.step_timeout = step_timeout if step_timeout is not None else timeout
        self.info: Info | None = None  # learned at the first step (or check()); forgotten after a failure
        self.info_changes = 0  # the client's replica_changes when self.info was asked (info_known)
        self.fallback_steps = 0
        self.unscored_groups = 0
        self.dropped_steps = 0  # submitted, never collected
        self.pending: PendingStep | None = None  # the step submitted and not yet collected: at most one
        self.previous_start: float | None = None  # the previous step's start: one training step ago

    def start(
        self,
        group_size: int,
        estimator: str | None = None,
        supported: Collection[str] = (),
        spell: Callable[[str], str] = str,
        ready_timeout: float = 120.0,
    ) -> Info:
        """What every plug-in proves before any worker starts: its groups can be scored (group_size >= 3), by an
        estimator SetPO supports (when the framework has a choice), and check() passes with limits that take groups
        of group_size and texts of max_chars. ValueError for the plug-in's settings, SetpoError for the service;
        each names what to change as the plug-in's user spells it (`spell`)."""
        if group_size < MIN_GROUP:
            raise ValueError(
                f"SetPO needs {spell('group_size')} >= {MIN_GROUP} (leave-one-out marginals), got {group_size}"
            )
        if estimator is not None and estimator not in supported:
            raise ValueError(
                f"SetPO needs a group advantage estimator ({', '.join(supported)}); got {spell('estimator')}={estimator}"
            )
        info = self.check(ready_timeout)
        largest = largest_group(info.limits)
        if group_size > largest:  # such a group would never be scored
            raise SetpoError(
                f"groups of {group_size} responses; the service at {self.client.base_url} takes at most {largest}. "
                f"Raise SETPO_MAX_GROUP_SIZE (and SETPO_MAX_REQUEST_ROWS, SETPO_MAX_RESPONSE_BYTES) on the service, or lower {spell('group_size')}."
            )
        if (self.max_chars or 0) > info.limits.max_text_chars:
            raise SetpoError(
                f"{spell('max_chars')} {self.max_chars}: the service takes texts of at most {info.limits.max_text_chars} "
                "characters; lower it, or raise SETPO_MAX_TEXT_CHARS on the service"
            )
        return info

    def check(self, ready_timeout: float = 120.0) -> Info:
        """At start, before any worker starts: the service is ready, accepts the key (/info needs it), speaks
        contract v1.1 and tells its limits. Raises SetpoError with what to do; integrations refuse to start on it."""
        try:
            self.client.wait_until_ready(timeout=ready_timeout)
            self.info = self.learn_info()
        except SetpoError as exc:
            raise SetpoError(
                f"the SetPO service at {self.client.base_url} is not usable: {exc}. Start it (setpo-server), "
                "fix its URL or SETPO_API_KEY, or train without SetPO (weight 0 / enable=false)."
            ) from exc
        return self.info

    def learn_info(self, deadline: float | None = None) -> Info:
        changes = self.client.replicas.replica_changes  # read first: a replica taken back meanwhile counts next time
        info = self.client.info(deadline=deadline)
        if info.contract is None or tuple(int(part) for part in info.contract.split(".")[:2]) < (1, 1):
            raise SetpoError(
                f"the service speaks contract {info.contract or '1.0'} (setpo-server {info.version}); SetpoShaper "
                "needs contract 1.1 (it reads the service's `bonus`): upgrade setpo-server"
            )
        self.info_changes = changes
        return info

    def info_known(self) -> bool:
        """Whether the /info learned still stands: learned, and no replica taken back or newly resolved since (one may
        serve another model, which strictest() refuses, or tighter limits, which the step's chunks must fit)."""
        return self.info is not None and self.info_changes == self.client.replicas.replica_changes

    def limits(self, started: float | None = None) -> Limits | None:
        """The service's limits, for a plug-in that fits its groups itself (veRL's multi-output sessions): those
        learned, or asked now within the budget of the step whose SetPO work began at `started` (time.perf_counter());
        None when they cannot be had (the step's scoring then meets the fault policy)."""
        deadline = self.deadline(time.perf_counter() if started is None else started)
        if not self.info_known() and self.weight > 0 and (deadline is None or deadline > time.monotonic()):
            with contextlib.suppress(SetpoError):
                self.info = self.learn_info(deadline)
        return None if self.info is None else self.info.limits

    def submit(
        self,
        groups: Sequence[Sequence],
        rewards: Sequence[Sequence[float]] | None = None,
        keys: Sequence[Sequence[str | None]] | None = None,
        started: float | None = None,
    ) -> PendingStep:
        """Starts scoring a step early, so that the framework's own work hides SetPO's: groups, per prompt, its
        responses as texts or embedding vectors (None: not scorable); rewards and keys the same shape (rewards needed
        with min_reward; keys default to the key function's). The requests run on a thread of their own, on a copy.
        One step at a time: an earlier step still uncollected is dropped (its thread waited for, logged,
        setpo/dropped_steps). started: when the caller's SetPO work for this step began, for setpo/time_s."""
        start = time.perf_counter() if started is None else started
        if self.min_reward is not None and rewards is None:
            raise ValueError("min_reward scores members by reward: pass the step's rewards to score()")
        if rewards is not None and self.advantage != "framework":  # refused now, not after the step's requests
            base_advantages(self.advantage, rewards, self.positive_weight)
        if self.pending is not None:
            self.drop(self.pending, "was submitted and never collected")
        members = [list(group) for group in groups]
        scores = None if rewards is None else [[float(r) for r in group] for group in rewards]
        known = None if keys is None else [list(group) for group in keys]
        scorable = [[row for row, member in enumerate(group) if member is not None] for group in members]
        counts = dict.fromkeys(("unscored", "small_scope", "bad", "cut", "requests", "retries", "span_missing"), 0)
        step = PendingStep(members, scorable, scores, known, counts, self.weight, start, None)
        if step.weight > 0 and members:
            pool = ThreadPoolExecutor(1, thread_name_prefix="setpo-step")
            step.work = pool.submit(self.work, step)
            pool.shutdown(wait=False)  # its one thread ends with the work, which the step's deadline bounds
        self.pending = step
        step.submit_s = time.perf_counter() - start
        return step

    def shape(
        self,
        groups: Sequence[Sequence],
        rewards: Sequence[Sequence[float]] | None = None,
        advantages: Sequence[Sequence[float]] | None = None,
        keys: Sequence[Sequence[str | None]] | None = None,
        started: float | None = None,
    ) -> ShapedStep:
        """The step shaped, where its advantages are combined (arguments as submit's; advantages: the framework's,
        the same shape, for the base 'framework', the controller and setpo/bonus_ratio). The one rule for "is this
        the step submitted early?": the step submitted is collected if it has the same members in the same groups,
        the same rewards where it was sent rewards and the same keys; else it is dropped (logged,
        setpo/dropped_steps) and these groups are scored now, as they are with nothing submitted (`score`).
        started: when the caller's SetPO work here began (reading its batch back, decoding), counted as blocked."""
        pending = self.pending
        if pending is not None:
            same = pending.groups == [list(group) for group in groups] and pending.keys == (
                None if keys is None else [list(group) for group in keys]
            )
            if same and (pending.rewards is None or rewards is None or numbers(pending.rewards) == numbers(rewards)):
                return self.collect(pending, advantages, started, rewards)
            self.drop(pending, "was for other members or rewards than the step shaped; scoring this step now")
        return self.collect(self.submit(groups, rewards, keys, started), advantages)

    score = shape  # submit() and shape() at once, for a caller with nothing to hide the requests behind

    def deadline(self, started: float) -> float | None:
        """When a step whose SetPO work began at `started` (time.perf_counter()) must be done, as time.monotonic()
        (None: no budget): one budget for all of it, a plug-in's own /info ask before the submit included."""
        if self.step_timeout is None:
            return None
        return time.monotonic() + self.step_timeout - (time.perf_counter() - started)

    def work(self, step: PendingStep) -> list[tuple[int, GroupResult]]:
        """A submitted step's work, on its own thread: (group index, the service's answer) for every group sent. Its
        time goes to step.work_s, and the requests it sent again to setpo/chunk_retries, whether it answers or fails."""
        began, counts, retried = time.perf_counter(), step.counts, self.client.retries
        try:
            deadline = self.deadline(step.started)
            info = self.info if self.info_known() else None
            if info is None:
                info = self.info = self.learn_info(deadline)
            payloads = self.payloads(step.groups, step.scorable, step.rewards, step.keys, counts)  # 1. what is sent
            envelope = {"weight": step.weight, "kernel": self.kernel, "normalize": self.normalize}
            if self.min_reward is not None:
                envelope["min_reward"] = self.min_reward
            in_flight = self.in_flight or IN_FLIGHT_PER_REPLICA * len(self.client.urls)
            places = [info.limits.max_concurrent_requests, info.limits.max_requests_per_caller]  # of one replica, ours
            in_flight = min(in_flight, min((n for n in places if n), default=in_flight) * len(self.client.urls))
            chunks = fit_step(payloads, info, envelope, self.max_chars, in_flight, counts)  # 2. encoded once, fitted
            return self.send_chunks(chunks, step.weight, counts, deadline, in_flight)  # 3. the service's answers
        finally:
            step.work_s = time.perf_counter() - began
            counts["retries"] = self.client.retries - retried

    def collect(
        self,
        step: PendingStep,
        advantages: Sequence[Sequence[float]] | None,
        since: float | None = None,
        rewards: Sequence[Sequence[float]] | None = None,
    ) -> ShapedStep:
        """The step submitted, answered: the fault policy, the bonus back onto the members and combined with the
        base, the controller stepped, the step timed. since: when the caller's own SetPO work before this call began
        (counted as blocked); rewards: the step's, for the base, when submit had none."""
        self.pending = None
        waiting = time.perf_counter()
        reading = 0.0 if since is None else waiting - since  # the caller's work at collect, before this call
        answered: list[tuple[int, GroupResult]] = []
        failed = False
        if step.work is not None:
            try:
                answered = step.work.result()
            except Exception as exc:
                self.fall_back(exc)  # 4. the fault policy: stop, or this step with lambda = 0
                failed = True
        blocked = time.perf_counter() - waiting

        groups, scorable, counts, weight = step.groups, step.scorable, step.counts, step.weight
        bonus = [[0.0] * len(group) for group in groups]  # 5. the service's bonus back onto the members sent
        found: list[list[float] | None] = [None] * len(groups)
        for index, result in answered:
            for row, value in zip(scorable[index], result.bonus or []):
                bonus[index][row] = value
            found[index] = result.marginals
        marginals = None if failed or weight == 0 else found  # None: nothing was asked of the service

        rewards = step.rewards if rewards is None else rewards  # 6. the base, and the bonus combined with it
        if self.advantage != "framework":
            if rewards is None:
                raise ValueError(f"advantage={self.advantage!r} is computed from the step's rewards: pass them")
            advantages = base_advantages(self.advantage, rewards, self.positive_weight)
        shaped = None if advantages is None else combined(advantages, bonus, self.combine)

        self.unscored_groups += counts["unscored"]  # 7. metrics, the controller's next lambda, the step's time
        metrics = self.step_metrics(step, advantages, bonus, answered, marginals)
        if self.controller is not None and marginals is not None:
            self.controller.update(metrics["setpo/bonus_rms"], metrics.get("setpo/advantage_rms", 0.0))
            self.weight = self.controller.weight
        now = time.perf_counter()
        after = now - waiting - blocked
        # time_s: SetPO's own work (the caller's before submit, the requests, this); wait_s: what of it blocked
        metrics["setpo/time_s"] = step.submit_s + reading + step.work_s + after
        metrics["setpo/wait_s"] = step.submit_s + reading + blocked + after
        if self.previous_start is not None:  # a whole training step: from the previous step's start to now
            metrics["setpo/time_share"] = metrics["setpo/wait_s"] / (now - self.previous_start)
        self.previous_start = step.started
        return ShapedStep(bonus, shaped, marginals, metrics)

    def drop(self, step: PendingStep, why: str) -> None:
        """A step submitted and not collected, before another is scored: its thread is waited for (bounded by its
        deadline) and its answer dropped."""
        self.pending = None
        self.dropped_steps += 1
        if step.work is not None:
            wait([step.work])
        log.warning("SetPO: a step's scoring %s; its answer is dropped (%d dropped so far)", why, self.dropped_steps)

    def payloads(
        self,
        groups: Sequence[Sequence],
        scorable: list[list[int]],
        rewards: Sequence[Sequence[float]] | None,
        keys: Sequence[Sequence[str | None]] | None,
        counts: dict[str, int],
    ) -> list[tuple[int, dict, int]]:
        """(group index, v1.1 group payload, members) for every group worth sending: a group with fewer than 3
        members reaching min_reward would be answered zeros (counted small_scope)."""
        payloads = []
        for index, rows in enumerate(scorable):
            members = [groups[index][row] for row in rows]
            if self.kernel == "key":  # nothing is embedded: the keys alone carry the group
                payload: dict = {}
            elif members and self.embed_span is not None:
                if not isinstance(members[0], str):
                    raise ValueError("embed_span chooses what of a text is embedded; this step sent embedding vectors")
                payload = {"texts": [self.span_of(member, counts) for member in members]}
            else:
                payload = {"texts" if isinstance(members[0], str) else "embeddings": members} if members else {}
            if rewards is not None:
                payload["rewards"] = [rewards[index][row] for row in rows]
                reaching = sum(r >= self.min_reward for r in payload["rewards"]) if self.min_reward is not None else 0
                if self.min_reward is not None and len(rows) >= MIN_GROUP and reaching < MIN_GROUP:
                    counts["small_scope"] += 1
                    continue
            if self.kernel != "embedding":
                payload["keys"] = [keys[index][row] for row in rows] if keys is not None else self.keys_of(members)
            payloads.append((index, payload, len(rows)))
        return payloads

    def send_chunks(
        self, chunks: list[Chunk], weight: float, counts: dict[str, int], deadline: float | None, in_flight: int
    ) -> list[tuple[int, GroupResult]]:
        """(group index, the service's answer) for every group of the chunks, sent `in_flight` at a time within the
        deadline, in the chunks' order, all of one model. A failure fails the step: the chunks not yet sent are
        cancelled, those in flight waited for (each bounded by the deadline)."""
        counting = threading.Lock()  # the chunks count as they go: a step that fails reports what it did too

        def send(chunk: Chunk) -> tuple[str, list[tuple[int, GroupResult]]]:
            answer = self.client.diversity_json(chunk.body, chunk.sizes, weight, deadline)
            with counting:
                counts["requests"] += 1
            return answer.model, list(zip(chunk.indices, answer.groups))

        with ThreadPoolExecutor(min(in_flight, len(chunks)) or 1, thread_name_prefix="setpo-chunk") as pool:
            futures = [pool.submit(send, chunk) for chunk in chunks]
            wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:
                future.cancel()  # not yet sent: never sent
            failure = next((error for f in futures if not f.cancelled() and (error := f.exception())), None)
            if failure is not None:
                raise failure
            answers = [future.result() for future in futures]
        models = sorted({model for model, _ in answers})
        if len(models) > 1:  # a replica taken back mid-step serving another model: marginals of two spaces
            raise SetpoError(f"one step's chunks were scored by different models ({', '.join(models)})")
        return [pair for _, pairs in answers for pair in pairs]

    def span_of(self, text: object, counts: dict[str, int]) -> object:
        """What of a text is embedded under embed_span: its last match's group (or the whole match); the text whole
        when nothing (or nothing but space) matches, counted. A member that is not text is left for the fitting."""
        assert self.embed_span is not None
        if not isinstance(text, str):
            return text
        matches = list(self.embed_span.finditer(text))
        span = matches[-1].group(1 if self.embed_span.groups else 0) if matches else None
        if not span or not span.strip():
            counts["span_missing"] += 1
            return text
        return span.strip()

    def keys_of(self, members: list) -> list[str | None]:
        if self.key is None:
            raise ValueError(f"kernel {self.kernel!r} needs solution keys: give the shaper a key function")
        return [self.key(member) for member in members]

    def fall_back(self, exc: Exception) -> None:
        """The fault policy: stop under 'fail'; under 'skip', count and log, and train the step with lambda = 0."""
        if self.on_error == "fail":
            log.error("SetPO scoring failed and on_error='fail': %s", exc)
            raise SetpoError(f"SetPO scoring failed and on_error='fail': {exc}") from exc
        self.fallback_steps += 1
        self.info = None  # the service may have been redeployed with other limits: ask again next step
        log.error(
            "SetPO scoring failed: %s. Training this step with lambda = 0 (fallback step %d; on_error='skip')",
            exc,
            self.fallback_steps,
            exc_info=not isinstance(exc, SetpoError),
        )

    def step_metrics(
        self,
        step: PendingStep,
        advantages: Sequence[Sequence[float]] | None,
        bonus: list[list[float]],
        scored: list[tuple[int, GroupResult]],
        marginals: list[list[float] | None] | None,
    ) -> dict[str, float]:
        """The step's setpo/* metrics (setpo/time_s, wait_s and time_share are added by collect)."""
        groups, scorable, rewards, counts = step.groups, step.scorable, step.rewards, step.counts
        members = [(index, row) for index, rows in enumerate(scorable) for row in rows]
        metrics = {
            "setpo/duplicate_share": duplicate_share(
                [[group[row] for row in rows] for group, rows in zip(groups, scorable)]
            ),
            "setpo/active": 1.0 if any(result.scored for _, result in scored) else 0.0,
            "setpo/weight": step.weight if marginals is not None else 0.0,  # the lambda this step applied
            "setpo/fallback_steps": float(self.fallback_steps),
            "setpo/dropped_steps": float(self.dropped_steps),
            "setpo/unscored_groups": float(counts["unscored"]),
            "setpo/unscored_groups_total": float(self.unscored_groups),
            "setpo/small_scope_groups": float(counts["small_scope"]),
            "setpo/bad_groups": float(counts["bad"]),
            "setpo/scored_groups": float(sum(1 for _, result in scored if result.scored)),
            "setpo/scored_share": sum(result.scored or 0 for _, result in scored) / max(1, len(members)),
            "setpo/cut_texts": float(counts["cut"]),
            "setpo/requests": float(counts["requests"]),
            "setpo/chunk_retries": float(counts["retries"]),  # the step's requests sent again
            "setpo/bonus_rms": rms([bonus[index][row] for index, row in members]),
        }
        if self.embed_span is not None:  # texts sent whole for want of a match: a format the pattern does not fit
            metrics["setpo/span_missing"] = float(counts["span_missing"])
        if advantages is not None:
            metrics["setpo/advantage_rms"] = rms([float(advantages[index][row]) for index, row in members])
            if metrics["setpo/advantage_rms"] > 0:
                metrics["setpo/bonus_ratio"] = metrics["setpo/bonus_rms"] / metrics["setpo/advantage_rms"]
        in_scope = [
            s
            for index, result in scored
            if result.scored
            for row, s in zip(scorable[index], result.marginals)
            if self.min_reward is None or (rewards is not None and rewards[index][row] >= self.min_reward)
        ]
        if in_scope:
            metrics["setpo/marginal_mean"] = fmean(in_scope)
            metrics["setpo/marginal_std"] = pstdev(in_scope)
        if scored:
            metrics["setpo/set_score_mean"] = fmean(result.set_score for _, result in scored)
            metrics["setpo/saturation"] = fmean(result.saturation for _, result in scored)
        return metrics


def base_advantages(
    advantage: Advantage, rewards: Sequence[Sequence[float]], positive_weight: float
) -> list[list[float]]:
    """Each member's advantage under a base computed from pass/fail rewards (setpo_core.advantages), groups of any
    size; a NaN reward (no reward function scored the member) gets 0 and is not counted in its group's success rate.
    ValueError for a reward that is neither 0 nor 1, naming it and the base."""
    import torch  # setpo-core's own dependency: only this path of the client needs it

    from setpo_core.advantages import maxrl_advantages, w_reinforce_advantages

    width = max((len(group) for group in rewards), default=0)
    padded = torch.zeros(len(rewards), width, dtype=torch.float64)  # (B, G)
    mask = torch.zeros(len(rewards), width, dtype=torch.bool)  # (B, G)
    for b, group in enumerate(rewards):
        row = torch.tensor([float(r) for r in group], dtype=torch.float64)
        padded[b, : len(group)], mask[b, : len(group)] = row.nan_to_num(0.0), ~row.isnan()
    try:
        values = (
            maxrl_advantages(padded, mask)
            if advantage == "maxrl"
            else w_reinforce_advantages(padded, mask, positive_weight)
        )
    except ValueError as exc:  # a reward neither 0 nor 1, named by its group and member
        raise ValueError(f"advantage={advantage!r}: {exc}") from None
    return [values[b, : len(group)].tolist() for b, group in enumerate(rewards)]


def combined(advantages: Sequence[Sequence[float]], bonus: list[list[float]], combine: Combine) -> list[list[float]]:
    """The advantages to train on: base + bonus ('add', the paper's), or the base's positive advantages re-shared by
    the bonus ('reshare', setpo_core.advantages.reshared_advantages), group by group."""
    if combine == "add":
        return [[float(a) + b for a, b in zip(group, extra)] for group, extra in zip(advantages, bonus)]
    import torch

    from setpo_core.advantages import reshared_advantages

    shaped = []
    for group, extra in zip(advantages, bonus):
        base = torch.tensor([[float(a) for a in group]], dtype=torch.float64)  # (1, G)
        shaped.append(reshared_advantages(base, torch.tensor([extra], dtype=torch.float64))[0].tolist())
    return shaped


def would_shape(shaper: SetpoShaper, texts: Sequence[str | None], rewards: Sequence[float]) -> bool:
    """Whether the bonus would set apart the members of a group of equal rewards (which DAPO drops: its shaped
    advantage is lambda * s_i alone), from the texts alone (no request; docs/trl-and-verl.md, "DAPO's dynamic
    sampling"). Members with one text (span), or one key under the key kernel, are a cluster: a marginal depends on
    its cluster's size and, for the embedding kernel, on the cosines between clusters, which differ with 3 or more of
    them; clusters all of one size give equal marginals, as does one key shared by all under the hybrid kernel."""
    floor = shaper.min_reward
    scope = [text for text, reward in zip(texts, rewards) if text is not None and (floor is None or reward >= floor)]
    if shaper.weight <= 0 or len(scope) < MIN_GROUP or not pushes_equal_rewards(shaper.advantage, shaper.combine):
        return False
    compared: list = scope
    if shaper.kernel != "embedding":
        keys = shaper.keys_of(scope)
        if shaper.kernel == "key":  # a member without a key is a solution of its own
            compared = [key if key is not None else (row,) for row, key in enumerate(keys)]
        elif keys[0] is not None and keys.count(keys[0]) == len(keys):
            return False
    if shaper.embed_span is not None:  # never with the key kernel (check_form)
        compared = [shaper.span_of(text, {"span_missing": 0}) for text in scope]
    sizes = {compared.count(member) for member in compared}
    return len(sizes) > 1 or (shaper.kernel != "key" and len(set(compared)) > 2)


def numbers(rewards: Sequence[Sequence[float]]) -> list[list[float | None]]:
    """Rewards as floats that compare equal when they are, NaN with NaN (TRL's mark of a completion not scored)."""
    return [[None if math.isnan(float(r)) else float(r) for r in group] for group in rewards]


def rms(values: Sequence[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in values) / len(values)) if values else 0.0


def duplicate_share(groups: Sequence[Sequence]) -> float:
    """Share of responses that exactly repeat an earlier response of their own group (texts, or vectors by repr)."""
    total = sum(len(group) for group in groups)
    repeats = sum(len(group) - len({m if isinstance(m, str) else repr(m) for m in group}) for group in groups)
    return repeats / total if total else 0.0

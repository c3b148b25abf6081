"""What every trainer integration (OpenRLHF, TRL, veRL, the bandit) does once per step, in one place: the diversity
policy, fitting the step's groups within the service's limits, the one degrade policy, the weight, the step's
timing and its SetPO metrics under one set of names.

    shaper = SetpoShaper(SetpoClient(url), weight=0.05, on_error="skip")              # the paper's form
    shaper = SetpoShaper(SetpoClient(url), weight=0.5, min_reward=1.0, key=countdown_expression,
                         kernel="hybrid", normalize="zscore", controller=WeightController(target_ratio=0.3))
    shaper.start(group_size=8)                       # at start: groups scoreable, service ready, key works, limits
    step = shaper.score(texts_per_group, rewards=..., advantages=...)  # a member may be None: not scorable
    for group, bonus in zip(groups, step.bonus): advantages_of(group) += bonus   # the service's bonus
    logger.log(step.metrics)

    pending = shaper.submit(texts_per_group, rewards=...)  # off the critical path: as soon as the texts exist ...
    step = pending.result(advantages=...)                  # ... and wait only where the advantages are combined

The diversity policy (contract v1.1; docs/diversity.md says how to choose it for a task):
- `min_reward`: only responses whose reward reaches it are scored, among themselves; the others get 0;
- `key`: a function text -> solution identity or None, sent as the group's `keys` ('hybrid' and 'key' kernels);
- `kernel`: 'embedding' (the paper), 'hybrid', 'key'; `normalize`: 'none' (the paper) or 'zscore';
- `embed_span`: a regular expression; of each text, the last match (its group, if it has one) is what the service
  embeds, e.g. r"<answer>(.*?)</answer>" where the answer carries the solution (a program, an expression); a text
  without a match is sent whole and counted (setpo/span_missing). Keys are taken from the whole text;
- the weight: `weight` fixed, or steered by a WeightController to a target ratio of the bonus's RMS to the
  advantage's RMS (logged every step as setpo/weight).

The base and the combination (docs/diversity.md, "Bases that keep coverage"; the math: setpo_core.advantages):
- `advantage`: 'framework' (the advantages the caller passes, the framework's own), or 'maxrl' / 'w_reinforce'
  (computed here from the step's pass/fail rewards; `positive_weight` is W-REINFORCE's lambda); a reward that is
  neither 0 nor 1 is refused (ValueError) at submit;
- `combine`: 'add' (the paper: A + bonus) or 'reshare' (the bonus re-shares the base's positive advantages among
  a group's members, the group's total push unchanged; needs normalize='zscore'). The step's `advantages` are the
  result, whatever the service did: on a fallback step or for an unscored group the bonus is 0, so they are the base's.

The degrade policy, for every integration:
- a group with fewer than 3 scorable members, or more than the service takes (max_group_size,
  max_request_rows, max_response_bytes; its texts, max_queue_texts), gets bonus 0 and is counted
  (setpo/unscored_groups); one with fewer than 3 members reaching min_reward gets 0 without a request
  (setpo/small_scope_groups); one whose own rewards or vectors the service refuses (a 422 naming groups[b].rewards
  or .embeddings) gets 0 and is counted (setpo/bad_groups), its chunk sent again without it; the rest is shaped;
- texts are cut to the service's max_text_chars (and max_chars), by UTF-8 bytes where a group must fit the
  body limit, and a step is split into as many requests as max_groups / max_request_rows / max_body_bytes /
  max_response_bytes / max_queue_texts / max_queue_tokens need (the limits of /info, asked again after a failed
  step and after the client took a replica back: it may have come back with others),
  and into at least `in_flight` chunks of about equal bytes (a proxy for tokens: texts are cut to what the service
  keeps), which are in flight at once over the client's replicas; answers are put back by group index;
- a chunk that fails at one replica (unreachable, an error answer, an answer off the contract) is asked of
  another before the step falls back (setpo/chunk_retries); the step keeps one deadline for all of it;
- on_error="skip": ANY failure (unreachable, 5xx, 4xx such as a 401 after the key was rotated, an answer off
  the contract: a group missing, a NaN or Infinity or an overflowing square in any number read, a weight not
  the one sent (client.answer_problem); chunks of one step scored by different models; a key function
  that raises) trains the step with lambda = 0, is counted (setpo/fallback_steps)
  and logged at error level with the service's message; on_error="fail": it stops training with that message.
"""

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

from setpo_client.client import SetpoClient, json_body
from setpo_client.errors import SetpoAPIError, SetpoError
from setpo_client.policy import check_combination, check_form, check_span, check_steerable
from setpo_client.types import Advantage, Combine, GroupResult, Info, Kernel, Limits, Normalize
from setpo_client.weight import WeightController

log = logging.getLogger("setpo_client")

OnError = Literal["skip", "fail"]
MIN_GROUP = 3  # leave-one-out marginals need pairs left after removing one member
# Requests in flight per replica by default: a second one to the same process gains nothing, on a GPU or on CPU
# cores its one model already uses (docs/benchmarks.md, sections 16 and 17).
IN_FLIGHT_PER_REPLICA = 1
# The service's estimate of a /v1/diversity answer, refused over its max_response_bytes (setpo_server.routes): at
# most 5 numbers of 24 bytes a member and 160 bytes a group. A step is packed within it like within max_body_bytes.
ANSWER_BYTES_PER_ROW, ANSWER_BYTES_PER_GROUP = 5 * 24, 160
# A text's tokens, bounded from above for max_queue_tokens without its tokenizer: at most max_tokens (the service
# truncates), and at most one a UTF-8 byte (WordPiece, byte-level BPE and SentencePiece pieces each cover one or
# more) plus this many the tokenizer adds (special tokens, SentencePiece's leading '▁'). A model with a default prompt,
# which the service puts before every text, adds its tokens: a request over the queue then fails its chunk.
ADDED_TOKENS = 4


@dataclass
class PendingStep:
    """A step submitted to SetpoShaper.submit: its members (copied), what its work found, and its work in flight."""

    shaper: "SetpoShaper"
    groups: list[list]
    scorable: list[list[int]]
    rewards: list[list[float]] | None
    counts: dict[str, int]
    weight: float
    started: float
    work: Future | None  # None: nothing to ask (weight 0, no groups)
    submit_s: float = 0.0  # the caller's time from `started` to submit's return
    work_s: float = 0.0  # the work's own time on its thread, set when it ends, answered or failed

    def result(
        self,
        advantages: Sequence[Sequence[float]] | None = None,
        since: float | None = None,
        rewards: Sequence[Sequence[float]] | None = None,
    ) -> "ShapedStep":
        """The step shaped, once: waits for its answers (see SetpoShaper.submit); advantages as for score(). since:
        when the caller's own SetPO work before this call began (reading the step back), counted as blocked. rewards:
        the step's, for a base computed here (advantage='maxrl' | 'w_reinforce') when submit was not given them."""
        return self.shaper.collect(self, advantages, since, rewards)


@dataclass
class ShapedStep:
    bonus: list[list[float]]  # the service's bonus per member; 0 for unscored members, groups and fallbacks
    # each member's advantage to train on: the base (the caller's advantages, or the one `advantage` names) combined
    # with the bonus; None when the base is the framework's and the caller passed no advantages
    advantages: list[list[float]] | None
    marginals: list[list[float] | None] | None  # raw scoped s_i of each scored group's members sent; None on fallback
    metrics: dict[str, float]  # "setpo/..." names, see SetpoShaper.score


class SetpoShaper:
    """Scores one training step's groups under the diversity policy, the service's limits (learned from /info)
    and the degrade policy above. max_chars caps each text further (its beginning is kept, as the server keeps
    the beginning when it truncates tokens); by default texts are cut to what the service keeps (text_chars),
    which it would cut to anyway. in_flight: requests in flight at once (default: IN_FLIGHT_PER_REPLICA for each of
    the client's replicas; never more than /info's max_concurrent_requests and max_requests_per_caller admit); 1
    sends a step's requests in turn."""

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
        check_form(kernel, normalize, min_reward)
        check_span(embed_span, kernel)
        check_combination(advantage, combine, normalize, positive_weight)
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
        self.dropped_steps = 0  # submitted, never collected (submit)
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
        """What every plug-in proves at start, before any worker starts (after its own check that its hook took):
        its groups can be scored (group_size >= 3), by an advantage estimator SetPO supports (when the framework
        has a choice), and check(): the service is ready, accepts the key, speaks contract 1.1 and tells its
        limits, which take groups of group_size and texts of max_chars. ValueError for the plug-in's settings,
        SetpoError for the service; each names what to change as the plug-in's user spells it (spell('group_size'),
        spell('estimator'), spell('max_chars'))."""
        if group_size < MIN_GROUP:
            raise ValueError(
                f"SetPO needs {spell('group_size')} >= {MIN_GROUP} (leave-one-out marginals), got {group_size}"
            )
        if estimator is not None and estimator not in supported:
            raise ValueError(
                f"SetPO needs a group advantage estimator ({', '.join(supported)}); got {spell('estimator')}={estimator}"
            )
        info = self.check(ready_timeout)
        limits = info.limits
        largest = largest_group(limits)
        if group_size > largest:  # such a group would never be scored
            raise SetpoError(
                f"groups of {group_size} responses; the service at {self.client.base_url} takes at most {largest}. "
                f"Raise SETPO_MAX_GROUP_SIZE (and SETPO_MAX_REQUEST_ROWS, SETPO_MAX_RESPONSE_BYTES) on the service, or lower {spell('group_size')}."
            )
        if (self.max_chars or 0) > limits.max_text_chars:
            raise SetpoError(
                f"{spell('max_chars')} {self.max_chars}: the service takes texts of at most {limits.max_text_chars} "
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
        changes = self.client.replica_changes  # read first: a replica taken back while /info is asked counts next time
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
        return self.info is not None and self.info_changes == self.client.replica_changes

    def score(
        self,
        groups: Sequence[Sequence],
        rewards: Sequence[Sequence[float]] | None = None,
        advantages: Sequence[Sequence[float]] | None = None,
        keys: Sequence[Sequence[str | None]] | None = None,
        started: float | None = None,
    ) -> ShapedStep:
        """groups: per prompt, its responses as texts (embedded by the service) or embedding vectors; a member that
        is None is not scorable (padding, a rejected sample) and gets bonus 0. rewards: the same shape, needed with
        min_reward. advantages: the same shape, the advantages the bonus is added to (for the controller and the
        setpo/bonus_ratio metric). keys: the same shape, solution keys when the caller knows them (default: the key
        function applied to each text). started: when the caller's SetPO work for this step began (decoding
        included), for setpo/time_s; default now. The step's scoring is submitted and waited for at once."""
        return self.submit(groups, rewards, keys, started).result(advantages)

    def submit(
        self,
        groups: Sequence[Sequence],
        rewards: Sequence[Sequence[float]] | None = None,
        keys: Sequence[Sequence[str | None]] | None = None,
        started: float | None = None,
    ) -> "PendingStep":
        """score() in two halves, so that the framework's own work hides SetPO's: submit as soon as the texts (and
        the rewards, with min_reward) exist; the step's requests run on a thread of their own, and
        `pending.result(advantages)` waits for them where the advantages are combined (setpo/wait_s: what the
        caller blocked). The step's members are copied here, so the caller may reuse its lists. One step at a
        time: submitting while an earlier step is uncollected waits for that step's thread and drops its answer
        (logged, setpo/dropped_steps), so no thread outlives its step and no answer reaches another step."""
        start = time.perf_counter() if started is None else started
        if self.min_reward is not None and rewards is None:
            raise ValueError("min_reward scores members by reward: pass the step's rewards to score()")
        if rewards is not None and self.advantage != "framework":  # refused now, not after the step's requests
            base_advantages(self.advantage, rewards, self.positive_weight)
        if self.pending is not None:
            self.drop(self.pending)
        members = [list(group) for group in groups]
        scores = None if rewards is None else [[float(r) for r in group] for group in rewards]
        known = None if keys is None else [list(group) for group in keys]
        scorable = [[row for row, member in enumerate(group) if member is not None] for group in members]
        counts = dict.fromkeys(("unscored", "small_scope", "bad", "cut", "requests", "retries", "span_missing"), 0)
        step = PendingStep(self, members, scorable, scores, counts, self.weight, start, None)
        if step.weight > 0 and members:
            pool = ThreadPoolExecutor(1, thread_name_prefix="setpo-step")
            step.work = pool.submit(self.ask, step, known)
            pool.shutdown(wait=False)  # its one thread ends with the work, which the step's deadline bounds
        self.pending = step
        step.submit_s = time.perf_counter() - start
        return step

    def deadline(self, started: float) -> float | None:
        """When a step whose SetPO work began at `started` (time.perf_counter()) must be done, as time.monotonic()
        (None: no budget): one budget for all of it, a plug-in's own /info ask before the submit included."""
        return (
            None
            if self.step_timeout is None
            else time.monotonic() + self.step_timeout - (time.perf_counter() - started)
        )

    def ask(self, step: "PendingStep", keys: list[list[str | None]] | None) -> list[tuple[int, GroupResult]]:
        """A submitted step's work, on its own thread: (group index, the service's answer) for every group sent.
        Its time goes to step.work_s whether it answers or fails: a failed step's requests cost time too."""
        began, counts = time.perf_counter(), step.counts
        try:
            deadline = self.deadline(step.started)
            info = self.info
            if info is None or not self.info_known():
                info = self.info = self.learn_info(deadline)
            payloads = self.payloads(step.groups, step.scorable, step.rewards, keys, counts)  # 1. what can be scored
            envelope = {"groups": [], "weight": step.weight, "kernel": self.kernel, "normalize": self.normalize}
            if self.min_reward is not None:
                envelope["min_reward"] = self.min_reward
            in_flight = self.in_flight or IN_FLIGHT_PER_REPLICA * len(self.client.urls)
            places = [info.limits.max_concurrent_requests, info.limits.max_requests_per_caller]  # of one replica, ours
            in_flight = min(in_flight, min((n for n in places if n), default=in_flight) * len(self.client.urls))
            batches, counts["unscored"], counts["cut"] = fit_step(  # 2. fitted to the service's limits, in chunks
                payloads, info, envelope, self.max_chars, in_flight
            )
            return self.send(batches, step.weight, counts, deadline, in_flight)  # 3. the service's answers
        finally:
            step.work_s = time.perf_counter() - began

    def collect(
        self,
        step: "PendingStep",
        advantages: Sequence[Sequence[float]] | None,
        since: float | None = None,
        rewards: Sequence[Sequence[float]] | None = None,
    ) -> ShapedStep:
        """PendingStep.result: waits for the step's answers, then applies the fault policy, puts the bonus back
        onto the members, combines it with the base, steps the controller and times the step."""
        if step is not self.pending:
            raise RuntimeError("this step's SetPO scoring was collected already, or dropped for a later step's")
        self.pending = None
        waiting = time.perf_counter()
        reading = 0.0 if since is None else waiting - since  # the caller's work at collect, before result()
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
        metrics = self.step_metrics(
            groups, scorable, step.rewards, advantages, bonus, answered, counts, weight, marginals
        )
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

    def drop(self, step: "PendingStep") -> None:
        """An uncollected step, before the next one starts: its thread is waited for (bounded by its deadline) and
        its answer dropped."""
        self.pending = None
        self.dropped_steps += 1
        if step.work is not None:
            wait([step.work])
        log.warning(
            "SetPO: a step's scoring was submitted and never collected; dropped before the next step's "
            "(%d dropped so far)",
            self.dropped_steps,
        )

    def payloads(
        self,
        groups: Sequence[Sequence],
        scorable: list[list[int]],
        rewards: Sequence[Sequence[float]] | None,
        keys: Sequence[Sequence[str | None]] | None,
        counts: dict[str, int],
    ) -> list[tuple[int, dict, int]]:
        """(group index, v1.1 group payload, members) for every group worth sending: a group with fewer than 3
        members reaching min_reward would be answered zeros (counted small_scope), one whose own members cannot
        be sent goes unshaped alone (counted bad)."""
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
                payload["rewards"] = [float(rewards[index][row]) for row in rows]
                reaching = sum(r >= self.min_reward for r in payload["rewards"]) if self.min_reward is not None else 0
                if self.min_reward is not None and len(rows) >= MIN_GROUP and reaching < MIN_GROUP:
                    counts["small_scope"] += 1
                    continue
            if self.kernel != "embedding":
                payload["keys"] = [keys[index][row] for row in rows] if keys is not None else self.keys_of(members)
            problem = group_problem(payload)
            if problem is not None:
                counts["bad"] += 1
                log.warning("SetPO: group %d of the step cannot be sent (%s); its bonus is 0", index, problem)
                continue
            payloads.append((index, payload, len(rows)))
        return payloads

    def send(
        self,
        batches: list[list[tuple[int, dict]]],
        weight: float,
        counts: dict[str, int],
        deadline: float | None,
        in_flight: int,
    ) -> list[tuple[int, GroupResult]]:
        """The chunks, `in_flight` at a time, within the step's deadline; (group index, the service's answer) for
        every group answered, in the chunks' order whatever order the answers came in, all of them scored by one model.
        The threads end with the step: a failure cancels the chunks not yet sent and waits for those in flight (each
        bounded by the deadline)."""

        counting = threading.Lock()  # the chunks count as they go: a step that fails reports what it did too

        def ask(batch: list[tuple[int, dict]]) -> tuple[str | None, list[tuple[int, GroupResult]]]:
            batch, avoid = list(batch), list[str]()
            while batch:
                try:
                    answer = self.client.diversity(
                        [payload for _, payload in batch],
                        weight=weight,
                        min_reward=self.min_reward,
                        kernel=self.kernel,
                        normalize=self.normalize,
                        deadline=deadline,
                        avoid=avoid,
                    )
                    with counting:
                        counts["requests"] += 1
                    return answer.model, [(index, group) for (index, _), group in zip(batch, answer.groups)]
                except SetpoError as exc:
                    # A 422 about one group's own data (its rewards, its vectors: what only the service can judge) is
                    # that group's fault: it goes unshaped, the rest again. One about a limit (a group's size, a text's
                    # length) says the limits learned are stale, or this replica's are others': the chunk fails.
                    named = None
                    if isinstance(exc, SetpoAPIError) and exc.status == 422:
                        named = re.match(r"groups\[(\d+)\]\.(rewards|embeddings)\b", exc.param or "")
                    if named and int(named[1]) < len(batch):
                        index, _ = batch.pop(int(named[1]))
                        log.warning("SetPO: the service refused group %d of the step (%s); its bonus is 0", index, exc)
                        with counting:
                            counts["bad"] += 1
                        continue
                    # another replica may answer it: ask it while the step has time
                    others = [url for url in self.client.urls if url not in avoid and url != exc.replica]
                    if exc.replica is None or not others or (deadline is not None and time.monotonic() >= deadline):
                        raise
                    log.warning(
                        "SetPO: a chunk of %d groups failed at %s (%s); asking another replica",
                        len(batch),
                        exc.replica,
                        exc,
                    )
                    with counting:
                        counts["retries"] += 1
                    avoid.append(exc.replica)
            return None, []  # every group of the chunk refused

        with ThreadPoolExecutor(min(in_flight, len(batches)) or 1, thread_name_prefix="setpo-chunk") as pool:
            futures = [pool.submit(ask, batch) for batch in batches]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = [future for future in futures if future.done() and future.exception() is not None]
            if failed:
                pool.shutdown(wait=True, cancel_futures=True)
                raise failed[0].exception()  # type: ignore[misc]
            answers = [future.result() for future in futures]
        models = sorted({model for model, _ in answers if model is not None})
        if len(models) > 1:  # a replica taken back mid-step serving another model: marginals of two spaces
            raise SetpoError(f"one step's chunks were scored by different models ({', '.join(models)})")
        return [pair for _, pairs in answers for pair in pairs]

    def span_of(self, text: object, counts: dict[str, int]) -> object:
        """What of a text is embedded under embed_span: its last match's group (or the whole match); the text whole
        when nothing (or nothing but space) matches, counted. A member that is not text is left for group_problem."""
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
        groups: Sequence[Sequence],
        scorable: list[list[int]],
        rewards: Sequence[Sequence[float]] | None,
        advantages: Sequence[Sequence[float]] | None,
        bonus: list[list[float]],
        scored: list[tuple[int, GroupResult]],
        counts: dict[str, int],
        weight: float,
        marginals: list[list[float] | None] | None,
    ) -> dict[str, float]:
        """The step's setpo/* metrics (setpo/time_s and setpo/time_share are added by score)."""
        members = [(index, row) for index, rows in enumerate(scorable) for row in rows]
        metrics = {
            "setpo/duplicate_share": duplicate_share(
                [[hashable(group[row]) for row in rows] for group, rows in zip(groups, scorable)]
            ),
            "setpo/active": 1.0 if any(result.scored for _, result in scored) else 0.0,
            "setpo/weight": weight if marginals is not None else 0.0,  # the lambda this step applied
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
            "setpo/chunk_retries": float(counts["retries"]),
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
    ValueError for a reward that is neither 0 nor 1."""
    import torch  # setpo-core's own dependency: only this path of the client needs it

    from setpo_core.advantages import maxrl_advantages, w_reinforce_advantages

    width = max((len(group) for group in rewards), default=0)
    padded = torch.zeros(len(rewards), width, dtype=torch.float64)  # (B, G)
    mask = torch.zeros(len(rewards), width, dtype=torch.bool)  # (B, G)
    for b, group in enumerate(rewards):
        row = torch.tensor([float(r) for r in group], dtype=torch.float64)
        padded[b, : len(group)], mask[b, : len(group)] = row.nan_to_num(0.0), ~row.isnan()
    if advantage == "maxrl":
        values = maxrl_advantages(padded, mask)
    else:
        values = w_reinforce_advantages(padded, mask, positive_weight)
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


def fit_step(
    payloads: list[tuple[int, dict, int]], info: Info, envelope: dict, max_chars: int | None, chunks: int = 1
) -> tuple[list[list[tuple[int, dict]]], int, int]:
    """The step as requests the service accepts, at least `chunks` of them where there are groups enough: payloads
    are (group index, group payload, members); returns ([[(group index, group payload), ...] per request], groups
    left unscored, texts cut). Sizes are measured with the client's own encoder, so they are the real body sizes."""
    limits = info.limits
    chars = text_chars(info, max_chars)
    envelope_size = len(json_body(envelope))
    fitted, unscored, cut = [], 0, 0
    max_rows = largest_group(limits)
    oversized = [size for _, _, size in payloads if size > max_rows]
    if oversized:  # start() checked the configured group size; a group can still outgrow it (multi-output loops)
        log.warning(
            "SetPO: %d group(s) of %s members; the service takes at most %d: their bonus is 0. Raise "
            "SETPO_MAX_GROUP_SIZE (and SETPO_MAX_REQUEST_ROWS, SETPO_MAX_RESPONSE_BYTES) on the service, or make the groups smaller",
            len(oversized),
            ", ".join(map(str, sorted(set(oversized)))),
            max_rows,
        )
    for index, payload, size in payloads:
        group = fit_group(payload, size, limits, chars, limits.max_body_bytes - envelope_size)
        if group is None:
            unscored += 1
            continue
        texts = group[0].get("texts", [])
        tokens = sum(min(info.max_tokens, len(text.encode("utf-8")) + ADDED_TOKENS) for text in texts)
        fitted.append((index, *group, len(texts), tokens))
        if "texts" in payload:
            cut += sum(len(a) < len(b) for a, b in zip(texts, payload["texts"]))
    return pack(fitted, limits, envelope_size, chunks), unscored, cut


def would_shape(shaper: SetpoShaper, texts: Sequence[str | None], rewards: Sequence[float]) -> bool:
    """Whether the bonus would set a group's members apart, from the texts alone (no request). With all rewards
    equal (the groups DAPO's dynamic sampling drops) GRPO's advantage is 0 for every member, so the shaped one is
    lambda * s_i (lambda * zscore(s)): it differs exactly when the marginals do. That needs MIN_GROUP scorable
    members in scope (reward >= min_reward) that the kernel tells apart. Members with one text (its embed_span
    span), or one key under the key kernel, are a cluster: a marginal depends on its cluster's size and, for the
    embedding kernel, on the cosines between clusters, which differ with 3 or more of them (save a measure-zero
    symmetry). Clusters all of one size (one answer repeated, all keys different, two answers twice each) give equal
    marginals, as does one key shared by all under the hybrid kernel. False with weight 0."""
    floor = shaper.min_reward
    scope = [text for text, reward in zip(texts, rewards) if text is not None and (floor is None or reward >= floor)]
    if shaper.weight <= 0 or len(scope) < MIN_GROUP:
        return False
    compared: list = scope
    if shaper.kernel != "embedding":
        keys = shaper.keys_of(scope)
        if shaper.kernel == "key":  # a member without a key is a solution of its own
            compared = [key if key is not None else (row,) for row, key in enumerate(keys)]
        elif keys[0] is not None and keys.count(keys[0]) == len(keys):
            return False
    if shaper.embed_span is not None:  # never with the key kernel (check_span)
        compared = [shaper.span_of(text, {"span_missing": 0}) for text in scope]
    sizes = {compared.count(member) for member in compared}
    return len(sizes) > 1 or (shaper.kernel != "key" and len(set(compared)) > 2)


def largest_group(limits: Limits) -> int:
    """The most members a group may have for the service to score it: its group size, request rows and answer
    size limits."""
    rows = min(limits.max_group_size, limits.max_request_rows or limits.max_group_size)
    if limits.max_response_bytes:
        rows = min(rows, (limits.max_response_bytes - ANSWER_BYTES_PER_GROUP) // ANSWER_BYTES_PER_ROW)
    return rows


def text_chars(info: Info, max_chars: int | None = None) -> int:
    """Characters of a text the plug-ins send: what the server keeps (/info's truncate_chars; 8 a model token from
    a server too old to say), or the caller's max_chars, within the service's max_text_chars."""
    return min(info.limits.max_text_chars, max_chars or info.truncate_chars or 8 * info.max_tokens)


def fit_group(payload: dict, size: int, limits: Limits, chars: int, budget: int) -> tuple[dict, int, int] | None:
    """(payload fitted, members, its JSON bytes), or None when the group cannot be sent whole: too few or too many
    members, a key too long (cutting a key would change which solution it names), embeddings over the budget (the
    most one group's JSON may take), or texts whose share of it is too short to be any use."""
    max_rows = largest_group(limits)
    keys = payload.get("keys") or []
    if not MIN_GROUP <= size <= max_rows or any(key is not None and len(key) > limits.max_text_chars for key in keys):
        return None
    if "texts" in payload:
        if size > limits.max_queue_texts:  # one request's texts must fit the service's queue
            return None
        payload = {**payload, "texts": [text[:chars] for text in payload["texts"]]}
        if len(json_body(payload)) > budget:  # share the body among the texts, by UTF-8 bytes of their JSON
            share = (budget - len(json_body({**payload, "texts": [""] * size}))) // size
            payload["texts"] = [cut_to_json_bytes(text, share) for text in payload["texts"]]
    elif "embeddings" in payload:
        payload = {**payload, "embeddings": [[float(x) for x in vector] for vector in payload["embeddings"]]}
    body_size = len(json_body(payload))
    return (payload, size, body_size) if body_size <= budget else None


def pack(
    fitted: list[tuple[int, dict, int, int, int, int]], limits: Limits, envelope_size: int, chunks: int = 1
) -> list[list[tuple[int, dict]]]:
    """Fitted groups (index, payload, members, JSON bytes, texts, tokens at most) into requests, in order: `chunks`
    parts of about equal bytes (a group goes to the part its middle byte falls in; never split), each cut further
    into as few requests as max_groups, max_request_rows, max_body_bytes, max_response_bytes (the answer's size),
    max_queue_texts and max_queue_tokens (what one request may queue) allow."""
    total = max(1, sum(body_size for _, _, _, body_size, _, _ in fitted))
    batches: list[list[tuple[int, dict]]] = []
    batch: list[tuple[int, dict]] = []
    rows_in, bytes_in, texts_in, tokens_in, done, batch_part = 0, envelope_size, 0, 0, 0, 0
    for index, payload, row_count, body_size, text_count, token_count in fitted:
        part = min(chunks - 1, (2 * done + body_size) * chunks // (2 * total))
        done += body_size
        comma = 1 if batch else 0
        if batch and (
            part != batch_part
            or len(batch) + 1 > limits.max_groups
            or (limits.max_request_rows and rows_in + row_count > limits.max_request_rows)
            or bytes_in + comma + body_size > limits.max_body_bytes
            or (
                limits.max_response_bytes
                and (rows_in + row_count) * ANSWER_BYTES_PER_ROW + (len(batch) + 1) * ANSWER_BYTES_PER_GROUP
                > limits.max_response_bytes
            )
            or texts_in + text_count > limits.max_queue_texts
            or (limits.max_queue_tokens and tokens_in + token_count > limits.max_queue_tokens)
        ):
            batches.append(batch)
            batch, rows_in, bytes_in, texts_in, tokens_in, comma = [], 0, envelope_size, 0, 0, 0
        batch.append((index, payload))
        rows_in, bytes_in, batch_part = rows_in + row_count, bytes_in + comma + body_size, part
        texts_in, tokens_in = texts_in + text_count, tokens_in + token_count
    if batch:
        batches.append(batch)
    return batches


def cut_to_json_bytes(text: str, budget: int) -> str:
    """The longest beginning of text whose JSON string (quotes and escapes included) takes <= budget UTF-8 bytes."""
    if budget <= 2:
        return ""
    text = text.encode("utf-8")[: budget - 2].decode("utf-8", errors="ignore")  # never half a character
    while len(json_body(text)) > budget:  # escapes (quotes, backslashes, control characters) take more
        text = text[: len(text) - max(1, (len(json_body(text)) - budget) // 6)]
    return text


def rms(values: Sequence[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in values) / len(values)) if values else 0.0


def group_problem(payload: dict) -> str | None:
    """Why a group's payload cannot be sent, by its own members' fault (a text that is not text, a vector that is
    not a flat list of numbers, NaN, a lone surrogate), or None."""
    texts, rows = payload.get("texts"), payload.get("embeddings")
    if texts is not None and not all(isinstance(text, str) for text in texts):
        return "a member is not text"
    if rows is not None:
        flat = all(isinstance(row, list | tuple) and row and all(type(x) in (int, float) for x in row) for row in rows)
        if not flat or len({len(row) for row in rows}) > 1:
            return "a member is not a vector of numbers of the group's length"
    try:
        json_body(payload)  # NaN and infinity, lone surrogates
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def hashable(member: object) -> object:
    """A member as a set element: texts as they are, anything else by its repr (vectors, or whatever was passed)."""
    return member if isinstance(member, str) else repr(member)


def duplicate_share(groups: Sequence[Sequence]) -> float:
    """Share of responses that exactly repeat an earlier response of their own group (texts or vectors)."""
    total = sum(len(group) for group in groups)
    repeats = sum(len(group) - len(set(group)) for group in groups)
    return repeats / total if total else 0.0

"""What every trainer integration (OpenRLHF, TRL, veRL, the bandit) does once per step, in one place: fit the
step's groups within the service's limits, get back lambda * s_i for every response, apply the one degrade
policy, time the step, and report its SetPO metrics under one set of names.

    shaper = SetpoShaper(SetpoClient(url), weight=0.05, on_error="skip")
    shaper.check()                                   # at start: the service is ready, the key works, its limits
    step = shaper.score([group_0_texts, group_1_texts, ...])   # a member may be None: not scorable, bonus 0
    for group, bonus in zip(groups, step.bonus): advantages_of(group) += bonus   # bonus[i] = lambda * s_i
    logger.log(step.metrics)

The degrade policy, for every integration:
- a group with fewer than 3 scorable members, or more than the service takes (max_group_size,
  max_request_rows), gets bonus 0 and is counted (setpo/unscored_groups); the rest of the step is shaped;
- texts are cut to the service's max_text_chars (and max_chars), by UTF-8 bytes where a group must fit the
  body limit, and a step is split into as many requests as max_groups / max_request_rows / max_body_bytes need;
- on_error="skip": ANY failure (unreachable, 5xx, 4xx such as a 401 after the key was rotated, an answer off
  the contract) trains the step with lambda = 0, is counted (setpo/fallback_steps) and logged at error level
  with the service's message; on_error="fail": it stops training with that message.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, pstdev
from typing import Literal

from setpo_client.client import SetpoClient, json_body
from setpo_client.errors import SetpoError
from setpo_client.types import Info

log = logging.getLogger("setpo_client")

OnError = Literal["skip", "fail"]
MIN_GROUP = 3  # leave-one-out marginals need pairs left after removing one member


@dataclass
class ShapedStep:
    bonus: list[list[float]]  # lambda * s_i per member of each group; 0 for unscored members, groups and fallback steps
    marginals: list[list[float] | None] | None  # s_i per scored group (None for an unscored one); None on fallback
    metrics: dict[str, float]  # "setpo/..." names, see SetpoShaper.score


class SetpoShaper:
    """Scores one training step's groups under the service's limits (learned from /info) and the degrade
    policy above. max_chars caps each text further (its beginning is kept, as the server keeps the beginning
    when it truncates tokens); by default texts are cut to 8 characters a token of the service's model, which
    the service would cut to anyway."""

    def __init__(self, client: SetpoClient, weight: float, on_error: OnError = "skip", max_chars: int | None = None):
        if weight < 0:
            raise ValueError(f"weight (lambda) must be >= 0, got {weight}")
        if on_error not in ("skip", "fail"):
            raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
        self.client, self.weight, self.on_error, self.max_chars = client, weight, on_error, max_chars
        self.info: Info | None = None  # learned at the first step (or check()); forgotten after a failure
        self.fallback_steps = 0
        self.unscored_groups = 0
        self.previous_start: float | None = None  # the previous step's start: one training step ago

    def check(self, ready_timeout: float = 120.0) -> Info:
        """At start, before any worker starts: the service is ready, accepts the key (/info needs it) and
        tells its limits. Raises SetpoError with what to do; integrations refuse to start on it."""
        try:
            self.client.wait_until_ready(timeout=ready_timeout)
            self.info = self.client.info()
        except SetpoError as exc:
            raise SetpoError(
                f"the SetPO service at {self.client.base_url} is not usable: {exc}. Start it (setpo-server), "
                "fix its URL or SETPO_API_KEY, or train without SetPO (weight 0 / enable=false)."
            ) from exc
        return self.info

    def score(self, groups: Sequence[Sequence], started: float | None = None) -> ShapedStep:
        """groups: per prompt, its responses as texts (embedded by the service) or embedding vectors; a member
        that is None is not scorable (padding, a rejected sample) and gets bonus 0. started: when the caller's
        SetPO work for this step began (decoding included), for setpo/time_s; default now."""
        start = time.perf_counter() if started is None else started
        bonus = [[0.0] * len(group) for group in groups]
        found: list[list[float] | None] = [None] * len(groups)  # filled in by each scored group
        marginals = found if self.weight > 0 else None
        scorable = [[row for row, member in enumerate(group) if member is not None] for group in groups]
        metrics = {
            "setpo/duplicate_share": duplicate_share(
                [[hashable(group[row]) for row in rows] for group, rows in zip(groups, scorable)]
            )
        }
        unscored, cut, requests = 0, 0, 0
        if self.weight > 0 and groups:
            try:
                if self.info is None:
                    self.info = self.client.info()
                batches, unscored, cut = fit_step(groups, scorable, self.info, self.weight, self.max_chars)
                results = []  # every scored group of every request of the step
                for batch in batches:
                    result = self.client.diversity([payload for _, payload in batch], weight=self.weight)
                    requests += 1
                    for (index, _), scored in zip(batch, result.groups):
                        found[index] = scored.marginals
                        results.append(scored)
                if results:
                    flat = [s for scored in results for s in scored.marginals]
                    metrics.update(
                        {
                            "setpo/set_score_mean": fmean(scored.set_score for scored in results),
                            "setpo/marginal_mean": fmean(flat),
                            "setpo/marginal_std": pstdev(flat),
                            "setpo/saturation": fmean(scored.saturation for scored in results),
                        }
                    )
            except Exception as exc:
                if self.on_error == "fail":
                    log.error("SetPO scoring failed and on_error='fail': %s", exc)
                    raise SetpoError(f"SetPO scoring failed and on_error='fail': {exc}") from exc
                self.fallback_steps += 1
                self.info = None  # the service may have been redeployed with other limits: ask again next step
                marginals = None
                log.error(
                    "SetPO scoring failed: %s. Training this step with lambda = 0 (fallback step %d; on_error='skip')",
                    exc,
                    self.fallback_steps,
                    exc_info=not isinstance(exc, SetpoError),
                )
        if marginals is not None:
            for index, (rows, group_marginals) in enumerate(zip(scorable, marginals)):
                if group_marginals is not None:
                    for row, s in zip(rows, group_marginals):
                        bonus[index][row] = self.weight * s
        self.unscored_groups += unscored
        shaped = marginals is not None and self.weight > 0 and any(g is not None for g in marginals)
        now = time.perf_counter()
        metrics.update(
            {
                "setpo/active": 1.0 if shaped else 0.0,  # this step's advantages got lambda * s
                "setpo/weight": self.weight if marginals is not None else 0.0,
                "setpo/fallback_steps": float(self.fallback_steps),
                "setpo/unscored_groups": float(unscored),
                "setpo/unscored_groups_total": float(self.unscored_groups),
                "setpo/cut_texts": float(cut),
                "setpo/requests": float(requests),
                "setpo/time_s": now - start,
            }
        )
        if self.previous_start is not None:  # a whole training step: from the previous step's start to now
            metrics["setpo/time_share"] = metrics["setpo/time_s"] / (now - self.previous_start)
        self.previous_start = start
        return ShapedStep(bonus, marginals, metrics)


def fit_step(
    groups: Sequence[Sequence], scorable: list[list[int]], info: Info, weight: float, max_chars: int | None
) -> tuple[list[list[tuple[int, dict]]], int, int]:
    """The step as requests the service accepts: ([[(group index, group payload), ...] per request], groups left
    unscored, texts cut). Sizes are measured with the client's own encoder, so they are the real body sizes."""
    limits = info.limits
    max_rows = min(limits.max_group_size, limits.max_request_rows or limits.max_group_size)
    chars = min(
        limits.max_text_chars, max_chars or info.truncate_chars or 8 * info.max_tokens
    )  # the server keeps no more
    envelope = len(json_body({"groups": [], "weight": weight}))
    group_budget = limits.max_body_bytes - envelope  # the most one group's JSON may take
    fitted, unscored, cut = [], 0, 0
    for index, (group, rows) in enumerate(zip(groups, scorable)):
        if not MIN_GROUP <= len(rows) <= max_rows:
            unscored += 1
            continue
        members = [group[row] for row in rows]
        if isinstance(members[0], str):
            texts = [text[:chars] for text in members]
            payload = {"texts": texts}
            size = len(json_body(payload))
            if size > group_budget:  # share the body among the group's texts, by UTF-8 bytes of their JSON form
                share = (group_budget - len(json_body({"texts": [""] * len(texts)}))) // len(texts)
                texts = [cut_to_json_bytes(text, share) for text in texts]
                payload = {"texts": texts}
                size = len(json_body(payload))
            cut += sum(len(a) < len(b) for a, b in zip(texts, members))
        else:
            payload = {"embeddings": [[float(x) for x in vector] for vector in members]}
            size = len(json_body(payload))
        if size > group_budget:  # embeddings cannot be cut; texts too short a share to be any use
            unscored += 1
            continue
        fitted.append((index, payload, len(rows), size))

    batches: list[list[tuple[int, dict]]] = []
    batch: list[tuple[int, dict]] = []
    rows_in, bytes_in = 0, envelope
    for index, payload, row_count, size in fitted:
        comma = 1 if batch else 0
        if batch and (
            len(batch) + 1 > limits.max_groups
            or (limits.max_request_rows and rows_in + row_count > limits.max_request_rows)
            or bytes_in + comma + size > limits.max_body_bytes
        ):
            batches.append(batch)
            batch, rows_in, bytes_in, comma = [], 0, envelope, 0
        batch.append((index, payload))
        rows_in, bytes_in = rows_in + row_count, bytes_in + comma + size
    if batch:
        batches.append(batch)
    return batches, unscored, cut


def cut_to_json_bytes(text: str, budget: int) -> str:
    """The longest beginning of text whose JSON string (quotes and escapes included) takes <= budget UTF-8 bytes."""
    if budget <= 2:
        return ""
    text = text.encode("utf-8")[: budget - 2].decode("utf-8", errors="ignore")  # never half a character
    while len(json_body(text)) > budget:  # escapes (quotes, backslashes, control characters) take more
        text = text[: len(text) - max(1, (len(json_body(text)) - budget) // 6)]
    return text


def hashable(member: str | Sequence[float]) -> str | tuple[float, ...]:
    return member if isinstance(member, str) else tuple(member)


def duplicate_share(groups: Sequence[Sequence]) -> float:
    """Share of responses that exactly repeat an earlier response of their own group (texts or vectors)."""
    total = sum(len(group) for group in groups)
    repeats = sum(len(group) - len(set(group)) for group in groups)
    return repeats / total if total else 0.0

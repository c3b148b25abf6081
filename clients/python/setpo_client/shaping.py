"""What every trainer integration (OpenRLHF, TRL, veRL, the bandit) does once per step: send the step's
groups of responses to the service in one request, get back lambda * s_i for every response, apply the
fault policy when the service fails, and report the step's SetPO metrics under one set of names.

    shaper = SetpoShaper(SetpoClient(url), weight=0.05, on_error="skip")
    step = shaper.score([group_0_texts, group_1_texts, ...])
    for group, bonus in zip(groups, step.bonus): advantages_of(group) += bonus   # bonus[i] = lambda * s_i
    logger.log(step.metrics)
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, pstdev
from typing import Literal

from setpo_client.client import SetpoClient
from setpo_client.errors import SetpoAPIError, SetpoError

log = logging.getLogger("setpo_client")

OnError = Literal["skip", "fail"]


@dataclass
class ShapedStep:
    bonus: list[list[float]]  # lambda * s_i per response of each group; all 0 when the step fell back
    marginals: list[list[float]] | None  # s_i as the service returned them; None on fallback
    metrics: dict[str, float]  # "setpo/..." names, see SetpoShaper.score


class SetpoShaper:
    """Scores one training step's groups. on_error="skip": after the client's own bounded retries, train
    this step with lambda = 0 and count it (setpo/fallback_steps); "fail": raise. A 4xx is a bug in what we
    send, not an outage, so it raises under either policy. max_chars caps each text (its beginning is kept,
    as the server keeps the beginning when it truncates tokens) to bound the request size."""

    def __init__(self, client: SetpoClient, weight: float, on_error: OnError = "skip", max_chars: int | None = None):
        if weight < 0:
            raise ValueError(f"weight (lambda) must be >= 0, got {weight}")
        if on_error not in ("skip", "fail"):
            raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
        self.client, self.weight, self.on_error, self.max_chars = client, weight, on_error, max_chars
        self.fallback_steps = 0

    def score(self, groups: Sequence[Sequence[str]] | Sequence[Sequence[Sequence[float]]]) -> ShapedStep:
        """groups: per prompt, its responses as texts (embedded by the service) or as embedding vectors."""
        start = time.perf_counter()
        if groups and groups[0] and isinstance(groups[0][0], str):
            members = [[text[: self.max_chars] if self.max_chars else text for text in group] for group in groups]
            payload = [{"texts": group} for group in members]
        else:
            members = [[tuple(vector) for vector in group] for group in groups]  # hashable, for duplicate_share
            payload = [{"embeddings": [list(vector) for vector in group]} for group in groups]
        metrics = {"setpo/duplicate_share": duplicate_share(members)}
        marginals = None
        if self.weight > 0 and members:
            try:
                result = self.client.diversity(payload, weight=self.weight)
                marginals = [group.marginals for group in result.groups]
                flat = [s for group in marginals for s in group]
                metrics.update({
                    "setpo/set_score_mean": fmean(group.set_score for group in result.groups),
                    "setpo/marginal_mean": fmean(flat),
                    "setpo/marginal_std": pstdev(flat),
                    "setpo/saturation": fmean(group.saturation for group in result.groups),
                })
            except SetpoAPIError as exc:
                # A 4xx (other than 429) is a bug in what we send; a 5xx is the service failing, an outage
                if (400 <= exc.status < 500 and exc.status != 429) or self.on_error == "fail":
                    raise
                self._fall_back(exc)
            except SetpoError as exc:
                if self.on_error == "fail":
                    raise SetpoError(f"SetPO scoring failed and on_error='fail': {exc}") from exc
                self._fall_back(exc)
        weight = self.weight if marginals is not None else 0.0
        bonus = [[weight * s for s in group] for group in marginals] if marginals else [[0.0] * len(g) for g in members]
        metrics.update({
            "setpo/weight": weight,
            "setpo/fallback_steps": float(self.fallback_steps),
            "setpo/time_s": time.perf_counter() - start,
        })
        return ShapedStep(bonus, marginals, metrics)

    def _fall_back(self, exc: Exception) -> None:
        self.fallback_steps += 1
        log.warning("SetPO service failed (%s); training this step with lambda = 0 (fallback step %d)", exc, self.fallback_steps)


def duplicate_share(groups: Sequence[Sequence]) -> float:
    """Share of responses that exactly repeat an earlier response of their own group (texts or vectors)."""
    total = sum(len(group) for group in groups)
    repeats = sum(len(group) - len(set(group)) for group in groups)
    return repeats / total if total else 0.0

"""Accuracy and diversity of n samples per problem (paper section 5 and appendix E)."""

from math import comb
from statistics import fmean

from setpo_client import SetpoClient


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k), and 1 when fewer than
    k samples are wrong (n - c < k: every k-subset then holds a correct one)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n, and n itself."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else ks + [n]


def accuracy(correct: list[list[bool]]) -> dict[str, float]:
    """pass@k averaged over problems for every k in ks_for(n), and Avg@n (mean accuracy of all samples)."""
    n = len(correct[0])
    if any(len(row) != n for row in correct):
        raise ValueError("every problem needs the same number of samples")
    scores = {f"pass@{k}": fmean(pass_at_k(n, sum(row), k) for row in correct) for k in ks_for(n)}
    scores[f"avg@{n}"] = fmean(sum(row) / n for row in correct)
    return scores


def distinct_correct(answers: list[list[str | None]]) -> list[int]:
    """Per problem, how many different correct answers (None = incorrect sample) its samples hold."""
    return [len({a for a in row if a is not None}) for row in answers]


def countdown_diversity(answers: list[list[str | None]]) -> dict[str, float]:
    """The paper's Table 3: diversity width = problems with at least two distinct correct expressions;
    average mode = mean number of distinct correct expressions over those problems."""
    counts = [c for c in distinct_correct(answers) if c >= 2]
    return {"diversity_width": float(len(counts)), "average_mode": fmean(counts) if counts else 0.0}


def service_diversity(client: SetpoClient, samples: list[list[str]], per_request: int = 64) -> dict[str, float]:
    """Mean pairwise similarity (clamped cosine of the service's embedder) and set score D(S) of each
    problem's samples, averaged over problems. A member's local mass is its mean similarity to the others,
    so the mean local mass is the mean pairwise similarity. Sent in requests of `per_request` problems:
    a full benchmark at n = 64 (GSM8K: 84k texts) is over what one request may carry."""
    groups = []
    for start in range(0, len(samples), per_request):
        groups += client.diversity([{"texts": group} for group in samples[start : start + per_request]]).groups
    return {
        "mean_pairwise_similarity": fmean(fmean(g.local_mass) for g in groups),
        "set_score": fmean(g.set_score for g in groups),
    }

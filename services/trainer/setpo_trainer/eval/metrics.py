"""Accuracy and diversity of n samples per problem (paper section 5 and appendix E)."""

from collections import Counter
from math import comb, sqrt
from statistics import fmean, stdev

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
    """The paper's Table 3 as the paper counts it: diversity width = problems with at least two distinct correct
    expressions; average mode = mean number of distinct correct expressions over those problems. An expression is
    its spelling here (see solution_diversity for distinct solutions)."""
    counts = [c for c in distinct_correct(answers) if c >= 2]
    return {"diversity_width": float(len(counts)), "average_mode": fmean(counts) if counts else 0.0}


# ModeBench's reporting bar (its default min_defined_prompts): a cell whose PCMD fewer prompts define is a gap, not a
# number to compare, since a mean over a handful of prompts with 2+ correct samples says little.
PCMD_MIN_DEFINED_PROMPTS = 30


def solution_counts(solutions: list[list[str | None]]) -> list[Counter[str]]:
    """Per problem, how many of its correct samples give each distinct solution (None = an incorrect sample)."""
    return [Counter(s for s in row if s is not None) for row in solutions]


def pcmd(counts: Counter[str]) -> float | None:
    """ModeBench's PCMD of one problem: the chance that two of its K correct samples (drawn without replacement) are
    different solutions, 1 - sum n_m (n_m - 1) / (K (K - 1)) where n_m of them give solution m. None when K < 2: no
    pair to compare, and ModeBench leaves it undefined rather than zero."""
    total = sum(counts.values())
    if total < 2:
        return None
    return 1.0 - sum(n * (n - 1) for n in counts.values()) / (total * (total - 1))


def solution_diversity(solutions: list[list[str | None]]) -> dict[str, float | int | bool | None]:
    """From each sample's solution identity (None = incorrect): distinct correct solutions per problem (ModeBench's
    distinct@n), the share of problems with at least 2 and at least 3, and PCMD as ModeBench's cell summary reports
    it: the mean over the problems that define it, each weighing the same (weighting by correct samples would bring
    accuracy back into it), with its support and standard error."""
    counts = solution_counts(solutions)
    distinct = [len(c) for c in counts]
    defined = [value for value in map(pcmd, counts) if value is not None]
    return {
        "solutions_mean": fmean(distinct),
        "solutions_share_2": fmean(d >= 2 for d in distinct),
        "solutions_share_3": fmean(d >= 3 for d in distinct),
        "pcmd": fmean(defined) if defined else None,
        "pcmd_defined_prompts": len(defined),
        "pcmd_prompts": len(counts),
        "pcmd_support": len(defined) / len(counts),
        "pcmd_reportable": len(defined) >= PCMD_MIN_DEFINED_PROMPTS,
        "pcmd_standard_error": stdev(defined) / sqrt(len(defined)) if len(defined) > 1 else None,
    }


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

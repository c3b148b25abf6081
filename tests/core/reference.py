"""The paper's definitions followed literally, in float64 Python: slow, obviously correct, for tests only.

D(S) is recomputed from scratch on every subset S \\ {o_i}; nothing from the closed form is reused.
"""

import math


def cosine_clamped(a: list[float], b: list[float]) -> float:
    norm_a = math.sqrt(math.fsum(x * x for x in a))
    norm_b = math.sqrt(math.fsum(x * x for x in b))
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return min(max(math.fsum(x * y for x, y in zip(a, b)) / (norm_a * norm_b), 0.0), 1.0)


def kernel_of(embeddings: list[list[float]]) -> list[list[float]]:
    return [
        [1.0 if i == j else cosine_clamped(a, b) for j, b in enumerate(embeddings)] for i, a in enumerate(embeddings)
    ]


def local_mass(kernel: list[list[float]], members: list[int], y: int) -> float:
    return math.fsum(kernel[y][z] for z in members if z != y) / (len(members) - 1)


def set_score(kernel: list[list[float]], members: list[int], g=lambda x: -math.log1p(x)) -> float:
    return math.fsum(g(local_mass(kernel, members, y)) for y in members) / len(members)


def loo_marginals(kernel: list[list[float]], g=lambda x: -math.log1p(x)) -> list[float]:
    members = list(range(len(kernel)))
    full = set_score(kernel, members, g)
    return [full - set_score(kernel, [j for j in members if j != i], g) for i in members]


# Contract v1.1, literally: the kernels by their definition, the scope by rebuilding the subset S', z-scores by the
# textbook formula.


def key_kernel_of(keys: list[str | None]) -> list[list[float]]:
    return [
        [1.0 if i == j or (a is not None and a == b) else 0.0 for j, b in enumerate(keys)] for i, a in enumerate(keys)
    ]


def hybrid_kernel_of(embeddings: list[list[float]], keys: list[str | None]) -> list[list[float]]:
    cosine = kernel_of(embeddings)
    return [[1.0 if a is not None and a == b else cosine[i][j] for j, b in enumerate(keys)] for i, a in enumerate(keys)]


def scoped_loo_marginals(kernel: list[list[float]], scored: list[bool], g=lambda x: -math.log1p(x)) -> list[float]:
    """The paper's marginals of the sub-kernel of the scored members, 0 elsewhere; all 0 when fewer than 3."""
    subset = [i for i, keep in enumerate(scored) if keep]
    if len(subset) < 3:
        return [0.0] * len(kernel)
    sub_marginals = loo_marginals([[kernel[i][j] for j in subset] for i in subset], g)
    marginals = [0.0] * len(kernel)
    for i, s in zip(subset, sub_marginals):
        marginals[i] = s
    return marginals


def zscores(values: list[float], scored: list[bool]) -> list[float]:
    chosen = [v for v, keep in zip(values, scored) if keep]
    if len(chosen) < 3 or max(chosen) - min(chosen) <= 1e-6:
        return [0.0] * len(values)
    mean = math.fsum(chosen) / len(chosen)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in chosen) / (len(chosen) - 1))
    return [(v - mean) / (std + 1e-6) if keep else 0.0 for v, keep in zip(values, scored)]


# Bases that keep coverage, and the re-shared combination (setpo_core.advantages), by their definitions, one group at
# a time.


def maxrl(rewards: list[float]) -> list[float]:
    rate = math.fsum(rewards) / len(rewards)
    return [0.0] * len(rewards) if rate in (0.0, 1.0) else [(r - rate) / rate for r in rewards]


def w_reinforce(rewards: list[float], positive_weight: float) -> list[float]:
    return [positive_weight if r == 1 else -1.0 for r in rewards]


def reshared(advantages: list[float], bonus: list[float]) -> list[float]:
    positive = [i for i, a in enumerate(advantages) if a > 0]
    weights = {i: max(0.0, 1.0 + bonus[i]) for i in positive}
    shared = math.fsum(advantages[i] * weights[i] for i in positive)
    if shared == 0:
        return list(advantages)
    scale = math.fsum(advantages[i] for i in positive) / shared
    return [a * weights[i] * scale if i in weights else a for i, a in enumerate(advantages)]

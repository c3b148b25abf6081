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

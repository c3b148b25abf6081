"""Diversity among correct solutions (contract v1.1): solution-key kernels, the scope, standardised marginals.

The paper's marginal (diversity.set_diversity) is taken over the whole group, so a wrong response that differs
from the rest earns a bonus, and its size depends on the embedder, the group size and the task. Contract v1.1
adds three optional choices, each a small step on top of the paper's math (docs/diversity.md says why):

    kernel     embedding: clamp(cos, 0, 1)     (the paper)
               key:       K_ij = 1 if members i and j carry the same non-null solution key, else 0
               hybrid:    1 for equal non-null keys, clamp(cos, 0, 1) otherwise
    scope      S' = the members whose reward >= min_reward; the marginals are the paper's leave-one-out marginals
               of S' (K restricted to S'), every other member gets 0; a group with |S'| < 3 gets zeros
    normalize  zscore: s <- (s - mean_S' s) / (unbiased std_S' s + 1e-6) over S', others stay 0

Keys reach this module as integer ids per group, (B, G), -1 for a member without a key: the caller maps its
strings to ids (only equality matters). Like diversity.py, this imports nothing but torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from setpo_core.diversity import set_diversity

# Marginals of one group that span less than this are equal up to float32 rounding (a group of all-equal keys,
# or all-distinct ones): standardising them would blow rounding noise up to unit size, so they get zeros.
EQUAL_SPREAD = 1e-6


def key_kernel(keys: Tensor) -> Tensor:
    """(B, G) integer key ids (-1: no key) -> (B, G, G) float32 kernel: 1 for equal keys, 0 otherwise, diagonal 1.

    Two members without a key are different solutions: nothing says they are the same."""
    same = (keys[:, :, None] == keys[:, None, :]) & (keys >= 0)[:, :, None]  # (B, G, G)
    kernel = same.float()
    kernel.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    return kernel


def hybrid_kernel(cosine: Tensor, keys: Tensor) -> Tensor:
    """(B, G, G) clamped-cosine kernel with every pair of equal non-null keys set to 1: two spellings of one
    solution are one solution, however far apart the embedder puts their texts."""
    return torch.maximum(cosine, key_kernel(keys).to(cosine.dtype))


def scoped_marginals(kernel: Tensor, scored: Tensor, shape: str = "neg_log1p") -> Tensor:
    """(B, G) leave-one-out marginals of each group's scored members S' (the paper's formula on K restricted to
    S'), 0 for every other member and for every group with |S'| < 3 (leave-one-out needs pairs left).

    kernel: (B, G, G); scored: (B, G) bool, True for the members in S' (padding is never scored).
    """
    marginals = torch.zeros(scored.shape, dtype=kernel.dtype, device=kernel.device)  # (B, G)
    enough = scored.sum(dim=-1) >= 3  # (B,)
    if bool(enough.any()):
        marginals[enough] = set_diversity(kernel[enough], scored[enough], shape).marginals
    return marginals


def standardized(marginals: Tensor, scored: Tensor) -> Tensor:
    """(B, G) marginals z-scored over each group's scored members: (s - mean) / (unbiased std + 1e-6), in units of
    the group's own spread, so a weight means the same for any embedder, group size or task. 0 for members outside
    S', for groups with |S'| < 3 and for groups whose scored marginals are all equal (within EQUAL_SPREAD)."""
    member = scored.to(marginals.dtype)  # (B, G)
    size = member.sum(dim=-1, keepdim=True)  # (B, 1)
    mean = (marginals * member).sum(dim=-1, keepdim=True) / size.clamp_min(1)
    centered = (marginals - mean) * member  # (B, G)
    std = (centered.square().sum(dim=-1, keepdim=True) / (size - 1).clamp_min(1)).sqrt()  # (B, 1)
    spread = torch.where(scored, marginals, -torch.inf).amax(dim=-1) - torch.where(scored, marginals, torch.inf).amin(
        dim=-1
    )  # (B,)
    varies = (size.squeeze(-1) >= 3) & (spread > EQUAL_SPREAD)  # (B,)
    return torch.where(varies[:, None] & scored, centered / (std + 1e-6), 0.0)

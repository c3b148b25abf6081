"""Set-level diversity of groups of responses: the SetPO paper's math (section 3, appendix D), once.

For one group of G >= 3 responses with kernel matrix K, K_ij = clamp(cos(e_i, e_j), 0, 1):

    local mass     m_j      = sum_{k != j} K_jk / (G - 1)
    set score      D        = mean_j g(m_j),            g(x) = -log(1 + x) by default (the paper's)
    removal law    m_j^(-i) = ((G - 1) m_j - K_ji) / (G - 2)      (appendix D, "exact density update")
    LOO marginal   s_i      = D - mean_{j != i} g(m_j^(-i))        (paper eq. 3)
    shaped adv.    A^_i     = A_i + lambda * s_i,  A = (r - mean r) / (unbiased std r + 1e-6), 0 if all r equal

Every function takes a batch of groups padded to one size, tensors (B, G, ...), with a boolean mask (B, G)
that is True for real members, and works in closed form: O(G^2) per group, no Python loop over groups or
members, on whatever device the inputs are on. This module imports nothing but torch (no web, model or
I/O code), so the server, the trainers and the tests all use the same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor


def neg_log1p(x: Tensor) -> Tensor:
    """The paper's g(x) = -log(1 + x): steepest near 0, so the rarest responses gain the most."""
    return -torch.log1p(x)


def neg_linear(x: Tensor) -> Tensor:
    """g(x) = -x: D becomes minus the mean pairwise similarity, the plain pairwise baseline."""
    return -x


# Shaping functions g offered by name (settings and CLI flags pick one). Each is continuous and strictly
# decreasing on [0, 1] with a bounded derivative, as the paper's theorems 4.2-4.4 assume.
SHAPES: dict[str, Callable[[Tensor], Tensor]] = {"neg_log1p": neg_log1p, "neg_linear": neg_linear}

# A kernel entry above this counts as "saturated": the two responses are near-duplicates to the embedder.
SATURATION_THRESHOLD = 0.95


class SetDiversity(NamedTuple):
    local_mass: Tensor  # (B, G)  m_j, 0 on padding
    set_score: Tensor  # (B,)    D(S)
    marginals: Tensor  # (B, G)  s_i, 0 on padding


def pad_groups(groups: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Stack groups of shape (G_b, d_b) into zero-padded (B, G_max, d_max) and a member mask (B, G_max).

    Zero-padding the feature axis leaves every cosine unchanged, so groups embedded at different
    dimensions can share one batch.
    """
    dtype = groups[0].dtype
    for group in groups[1:]:
        dtype = torch.promote_types(dtype, group.dtype)
    size = max(group.shape[0] for group in groups)
    dim = max(group.shape[1] for group in groups)
    padded = torch.zeros(len(groups), size, dim, dtype=dtype, device=groups[0].device)  # (B, G, d)
    mask = torch.zeros(len(groups), size, dtype=torch.bool, device=groups[0].device)  # (B, G)
    for b, group in enumerate(groups):
        padded[b, : group.shape[0], : group.shape[1]] = group
        mask[b, : group.shape[0]] = True
    return padded, mask


def unit_rows(x: Tensor) -> Tensor:
    """Scale each row to unit length; a zero row stays zero. Dividing by max |x| first keeps rows with
    huge or tiny norms finite, where squaring them directly would overflow or underflow."""
    tiny = torch.finfo(x.dtype).tiny
    x = x / x.abs().amax(dim=-1, keepdim=True).clamp_min(tiny)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(tiny)


def cosine_kernel(embeddings: Tensor) -> Tensor:
    """(B, G, d) embeddings -> (B, G, G) float32 kernel clamp(cos, 0, 1), diagonal 1.

    Rows are normalised in the input's dtype (callers may pass float64 to keep extreme norms exact) and
    compared in float32. A zero vector has similarity 0 to every other vector, never NaN.
    """
    unit = unit_rows(embeddings).float()
    kernel = (unit @ unit.transpose(-1, -2)).clamp_(0.0, 1.0)  # (B, G, G)
    kernel.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # k(y, y) = 1 by definition, zero vectors included
    return kernel


def _member_pairs(mask: Tensor) -> Tensor:
    """(B, G) member mask -> (B, G, G) mask of pairs of distinct members."""
    eye = torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
    return mask[:, :, None] & mask[:, None, :] & ~eye


def set_diversity(kernel: Tensor, mask: Tensor | None = None, shape: str = "neg_log1p") -> SetDiversity:
    """Local masses, set scores and leave-one-out marginals for a batch of groups, all in O(G^2) per group.

    kernel: (B, G, G) symmetric similarities in [0, 1]; mask: (B, G), True for members (default: all).
    Every group needs at least 3 members: the leave-one-out set must still have pairs to measure.
    """
    g = SHAPES[shape]
    if mask is None:
        mask = torch.ones(kernel.shape[:2], dtype=torch.bool, device=kernel.device)
    member = mask.to(kernel.dtype)  # (B, G) 1 for members, 0 for padding
    size = member.sum(dim=-1, keepdim=True)  # (B, 1)
    if bool((size < 3).any()):
        small = torch.nonzero(size.squeeze(-1) < 3).flatten().tolist()
        raise ValueError(f"groups {small} have fewer than 3 members; leave-one-out marginals need at least 3")
    # Masks are multiplied in, and (B, G, G) temporaries updated in place: this is memory-bound work, and
    # every extra pass over B*G*G floats costs as much as the arithmetic.
    k_off = kernel * (member[:, :, None] * member[:, None, :])  # (B, G, G) K without padding...
    k_off.diagonal(dim1=-2, dim2=-1).zero_()  # ...and without the diagonal

    mass = k_off.sum(dim=-1) / (size - 1)  # (B, G)  m_j
    score = (g(mass) * member).sum(dim=-1) / size.squeeze(-1)  # (B,)  D(S)

    # Row i holds every m_j^(-i), the masses once o_i is removed: no subset is ever rebuilt.
    n = size[:, :, None]  # (B, 1, 1)
    mass_without = k_off.transpose(-1, -2).neg().add_((n - 1) * mass[:, None, :]).div_(n - 2)  # (B, G_i, G_j)
    g_without = g(mass_without.clamp_min_(0.0)).mul_(member[:, None, :])  # (B, G_i, G_j), padded j dropped
    g_without.diagonal(dim1=-2, dim2=-1).zero_()  # j = i is not in S \ {o_i}
    score_without = g_without.sum(dim=-1) / (size - 1)  # (B, G)  D(S \ {o_i})

    marginals = (score[:, None] - score_without) * member  # (B, G)  s_i, 0 on padding
    return SetDiversity(mass * member, score, marginals)


def kernel_saturation(kernel: Tensor, mask: Tensor | None = None) -> Tensor:
    """(B,) share of member pairs whose similarity exceeds SATURATION_THRESHOLD.

    A high share means the embedder sees the group as near-duplicates: marginals then carry little signal.
    """
    if mask is None:
        mask = torch.ones(kernel.shape[:2], dtype=torch.bool, device=kernel.device)
    pairs = _member_pairs(mask)
    above = (pairs & (kernel > SATURATION_THRESHOLD)).sum(dim=(-1, -2))
    return above.to(kernel.dtype) / pairs.sum(dim=(-1, -2)).clamp_min(1).to(kernel.dtype)


def group_advantages(rewards: Tensor, mask: Tensor | None = None) -> Tensor:
    """(B, G) rewards -> GRPO group advantages (r - mean) / (unbiased std + 1e-6), 0 on padding.

    A group whose rewards are all equal gets exactly 0: (r - mean) there is rounding noise, and dividing
    noise by 1e-6 would turn it into a large, meaningless advantage.
    """
    if mask is None:
        mask = torch.ones_like(rewards, dtype=torch.bool)
    size = mask.sum(dim=-1, keepdim=True).to(rewards.dtype)  # (B, 1)
    mean = torch.where(mask, rewards, 0.0).sum(dim=-1, keepdim=True) / size
    centered = torch.where(mask, rewards - mean, 0.0)  # (B, G)
    # std of centered / scale, times scale: squaring huge rewards directly would overflow to an inf std
    scale = centered.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(rewards.dtype).tiny)  # (B, 1)
    std = scale * ((centered / scale).square().sum(dim=-1, keepdim=True) / (size - 1).clamp_min(1)).sqrt()
    spread = torch.where(mask, rewards, -torch.inf).amax(dim=-1) - torch.where(mask, rewards, torch.inf).amin(dim=-1)
    return torch.where((spread > 0)[:, None] & mask, centered / (std + 1e-6), 0.0)


def shaped_advantages(rewards: Tensor, marginals: Tensor, weight: float | Tensor, mask: Tensor | None = None) -> Tensor:
    """SetPO's A^ = A + weight * s (paper section 3.4), 0 on padding. weight is lambda, a float or (B, 1)."""
    if mask is None:
        mask = torch.ones_like(rewards, dtype=torch.bool)
    return torch.where(mask, group_advantages(rewards, mask) + weight * marginals, 0.0)

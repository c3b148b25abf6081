"""How a group's rewards become advantages when the base must keep coverage, and how SetPO's credit re-shares the base's
positive push instead of adding to it (docs/diversity.md, "Bases that keep coverage"). Beside diversity.py's GRPO
advantage (group_advantages) and the paper's additive form (shaped_advantages):

    MaxRL        A_i = (r_i - p) / p          p: the group's success rate; A = 0 when p is 0 or 1   (Tajwar et al., 2026)
    W-REINFORCE  A_i = +lambda if r_i = 1, -1 if r_i = 0; no group baseline, lambda 0.1         (Zhu et al., 2025)
    re-shared    P = {i : A_i > 0}; w_i = max(0, 1 + b_i) on P, b_i the bonus (lambda * z-scored scoped marginal);
                 w scaled by sum_P A / sum_P A w, so that the group's total positive push stays the base's;
                 A^_i = A_i * w_i on P, A_i elsewhere (w = 1 when sum_P A w is 0)

Both bases assume binary rewards (0 or 1, the verifier's pass/fail): check_binary refuses anything else by name.
Tensors are (B, G) padded groups with a (B, G) member mask, as in diversity.py; 0 on padding. Imports nothing but torch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_binary(rewards: Tensor, mask: Tensor | None = None) -> None:
    """Raise ValueError naming the first member whose reward is neither 0 nor 1 (MaxRL's success rate and W-REINFORCE's
    two values are defined for pass/fail rewards only)."""
    if mask is None:
        mask = torch.ones_like(rewards, dtype=torch.bool)
    bad = mask & (rewards != 0) & (rewards != 1)
    if bool(bad.any()):
        group, member = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(
            f"group {group} member {member} has reward {float(rewards[group, member])!r}: MaxRL and W-REINFORCE assume "
            "binary rewards (1 correct, 0 not); give them a pass/fail reward"
        )


def success_rate(rewards: Tensor, mask: Tensor | None = None) -> Tensor:
    """(B, G) binary rewards -> (B, 1) share of each group's members that succeeded."""
    if mask is None:
        mask = torch.ones_like(rewards, dtype=torch.bool)
    size = mask.sum(dim=-1, keepdim=True).clamp_min(1).to(rewards.dtype)  # (B, 1)
    return torch.where(mask, rewards, 0.0).sum(dim=-1, keepdim=True) / size


def maxrl_advantages(rewards: Tensor, mask: Tensor | None = None) -> Tensor:
    """MaxRL: (r - p) / p, the gradient of log p (the success probability) rather than of p, so a prompt the policy
    rarely solves is pushed as hard as one it often solves; 0 for groups all right or all wrong, and on padding."""
    check_binary(rewards, mask)
    if mask is None:
        mask = torch.ones_like(rewards, dtype=torch.bool)
    rate = success_rate(rewards, mask)  # (B, 1)
    mixed = (rate > 0) & (rate < 1)  # (B, 1)
    return torch.where(mixed & mask, (rewards - rate) / rate.clamp_min(torch.finfo(rewards.dtype).tiny), 0.0)


def w_reinforce_advantages(rewards: Tensor, mask: Tensor | None = None, positive_weight: float = 0.1) -> Tensor:
    """W-REINFORCE: +positive_weight for a correct member, -1 for a wrong one, with no group baseline: mostly
    negative reinforcement, which lowers the wrong answers' probability and leaves the rest of the distribution be."""
    check_binary(rewards, mask)
    if mask is None:
        mask = torch.ones_like(rewards, dtype=torch.bool)
    correct, wrong = torch.full_like(rewards, positive_weight), torch.full_like(rewards, -1.0)  # in the rewards' dtype
    return torch.where(mask, torch.where(rewards == 1, correct, wrong), 0.0)


def reshared_advantages(advantages: Tensor, bonus: Tensor, mask: Tensor | None = None) -> Tensor:
    """The base's positive advantages, re-shared by SetPO's bonus: SetPO decides which members of P (A > 0) get the
    group's push, the base how much. The bonus is lambda times the z-scored scoped marginals (0 outside the scope)."""
    if mask is None:
        mask = torch.ones_like(advantages, dtype=torch.bool)
    positive = mask & (advantages > 0)  # (B, G) P
    weights = torch.where(positive, (1 + bonus).clamp_min(0.0), 0.0)  # (B, G)
    push = torch.where(positive, advantages, 0.0)  # (B, G)
    total, shared = push.sum(dim=-1, keepdim=True), (push * weights).sum(dim=-1, keepdim=True)  # (B, 1)
    weights = torch.where(shared > 0, weights * total / torch.where(shared > 0, shared, 1.0), 1.0)
    return torch.where(positive, advantages * weights, torch.where(mask, advantages, 0.0))

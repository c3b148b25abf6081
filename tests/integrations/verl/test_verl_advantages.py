"""+algorithm.setpo.advantage, positive_weight and combine (issue 62) on veRL's real v1 advantage step over a real local
TransferQueue, against the real service: veRL 0.9 has neither MaxRL nor W-REINFORCE, so the rows veRL trains on carry
the shaper's advantages, computed literally here from the step's pass/fail rewards (plus the service's bonus); a
re-shared bonus moves a group's positive push among its members without changing its total and leaves the other
members at veRL's advantage; a reward that is not pass/fail is refused by name at the first step (a misspelt value at
start: test_verl_start.py)."""

import pytest
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from tests.core.reference import maxrl, reshared

from . import test_verl_v1
from .test_verl_v1 import WEIGHT, base_and_shaped, put_rollouts

transfer_queue, tokenizer = test_verl_v1.transfer_queue, test_verl_v1.tokenizer  # its fixtures, for this module too

# groups of rollout.n = 3, right (1) or wrong (0): success rates 1/3, 2/3 and 1
PASS_FAIL = {
    "p0": [("48 / 2 = 24, so 72", 1.0), ("1.5 * 48 = 72", 0.0), ("it is 74", 0.0)],
    "p1": [("2 + 3 = 5", 1.0), ("five, since 2 and 3 make 5", 1.0), ("it is 6", 0.0)],
    "p2": [("10 / 2 = 5", 1.0), ("half of ten: 5", 1.0), ("5", 1.0)],
}
ROWS = [(uid, s, 0, text, reward) for uid, group in PASS_FAIL.items() for s, (text, reward) in enumerate(group)]
REWARDS = [reward for group in PASS_FAIL.values() for _, reward in group]


def in_groups(values: list) -> list[list]:
    return [values[i : i + 3] for i in range(0, len(values), 3)]


def bonus_of(client, normalize: str = "none") -> list[float]:
    """The service's bonus for PASS_FAIL's groups (texts alone: no scope) at the plug-in's weight."""
    groups = [{"texts": [text for text, _ in group]} for group in PASS_FAIL.values()]
    return [b for group in client.diversity(groups, weight=WEIGHT, normalize=normalize).groups for b in group.bonus]


@pytest.mark.parametrize("weight", [0.0, WEIGHT], ids=["weight-0", "with-bonus"])
def test_maxrl_replaces_verls_advantages_and_the_bonus_adds_to_them(transfer_queue, tokenizer, server, client, weight):
    """+algorithm.setpo.advantage=maxrl: every answer token of row i trains on (r_i - p) / p, p its group's success
    rate, written out from the rewards, plus lambda * s_i; veRL's GRPO advantage is gone."""
    policy = {"advantage": "maxrl", "weight": weight}
    base, shaped, metrics, _ = base_and_shaped(
        transfer_queue, tokenizer, f"maxrl-{weight}", rows=ROWS, url=server.url, policy=policy
    )
    # (r - p) / p with p the group's success rate; 0 for a group all right or all wrong (Tajwar et al., 2026)
    literal = [a for group in in_groups(REWARDS) for a in maxrl(group)]
    assert literal == pytest.approx([2.0, -1.0, -1.0, 0.5, 0.5, -1.0, 0.0, 0.0, 0.0])
    bonus = bonus_of(client) if weight else [0.0] * len(literal)
    assert shaped == pytest.approx([a + b for a, b in zip(literal, bonus)], abs=1e-5)
    assert base[:6] != pytest.approx(literal[:6], abs=1e-3)  # the mixed groups: not veRL's own GRPO
    assert metrics["setpo/weight"] == weight


def test_w_reinforce_plus_the_bonus_reaches_verls_batch(transfer_queue, tokenizer, server, client):
    policy = {"advantage": "w_reinforce", "positive_weight": 0.25}
    _, shaped, _, _ = base_and_shaped(
        transfer_queue, tokenizer, "w-reinforce", rows=ROWS, url=server.url, policy=policy
    )
    base = [0.25 if r == 1.0 else -1.0 for r in REWARDS]  # no group baseline (Zhu et al., 2025)
    assert shaped == pytest.approx([a + b for a, b in zip(base, bonus_of(client))], abs=1e-5)


def test_a_reshared_bonus_keeps_each_groups_positive_push_and_the_other_members_advantages(
    transfer_queue, tokenizer, server, client
):
    policy = {"combine": "reshare", "normalize": "zscore"}
    base, shaped, _, _ = base_and_shaped(transfer_queue, tokenizer, "reshare", rows=ROWS, url=server.url, policy=policy)
    # P = {A > 0}; w = max(0, 1 + b) on P, scaled so that sum_P A w = sum_P A; A w on P, A elsewhere
    pairs = zip(in_groups(base), in_groups(bonus_of(client, "zscore")))
    assert shaped == pytest.approx([a for group, bonus in pairs for a in reshared(group, bonus)], abs=1e-5)
    moved = False
    for before, after in zip(in_groups(base), in_groups(shaped)):
        push = [(a, s) for a, s in zip(before, after) if a > 0]
        assert sum(s for _, s in push) == pytest.approx(sum(a for a, _ in push), abs=1e-5)  # the total push: veRL's
        assert all(s == pytest.approx(a, abs=1e-6) for a, s in zip(before, after) if a <= 0)  # wrong ones: veRL's
        moved = moved or any(abs(s - a) > 1e-4 for a, s in push)
    assert moved  # the bonus really re-shared a group's push (p1's two right answers)


@pytest.mark.parametrize("where", ["_compute_old_log_prob", "_compute_advantage"])
def test_a_reward_that_is_not_pass_fail_is_refused_by_name_at_the_first_step(transfer_queue, tokenizer, server, where):
    """A formatted but wrong answer earning 0.1, as Countdown's reward gives it: MaxRL's success rate is undefined.
    Refused where the step's scoring is submitted (the old-log-prob pass), or at the advantage step when nothing was
    submitted earlier (sequence-level rollout correction scores there)."""
    rows = [*ROWS[:1], ("p0", 1, 0, "48 + 2 = 50", 0.1), *ROWS[2:]]
    meta, _ = put_rollouts(transfer_queue, tokenizer, f"partial-{where}", rows)
    settings = {"enable": True, "url": server.url, "weight": 0.0, "advantage": "maxrl"}
    trainer = test_verl_v1.trainer(tokenizer, **settings)
    with pytest.raises(ValueError, match=r"advantage='maxrl': group 0 member 1 has reward 0\.1\d*: .* binary rewards"):
        getattr(PPOTrainer, where)(trainer, meta, metrics={})

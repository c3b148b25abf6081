"""+algorithm.setpo.advantage, positive_weight and combine (issue 62) on veRL's real v1 advantage step over a real local
TransferQueue, against the real service: veRL 0.9 has neither MaxRL nor W-REINFORCE, so the rows veRL trains on carry
the shaper's advantages, computed literally here from the step's pass/fail rewards (plus the service's bonus); a
re-shared bonus moves a group's positive push among its members without changing its total and leaves the other
members at veRL's advantage; a misspelt value is refused at start by its setting's name, and a reward that is not
pass/fail at the first step."""

import pytest
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from . import test_verl_v1
from .test_verl_start import setpo, verl_config
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


def literal_maxrl(rewards: list[float]) -> list[float]:
    """(r - p) / p with p the group's success rate; 0 for a group all right or all wrong (Tajwar et al., 2026)."""
    shaped = []
    for group in in_groups(rewards):
        p = sum(group) / len(group)
        shaped += [0.0 if p in (0.0, 1.0) else (r - p) / p for r in group]
    return shaped


def literal_reshare(base: list[float], bonus: list[float]) -> list[float]:
    """P = {A > 0}; w = max(0, 1 + b) on P, scaled so that sum_P A w = sum_P A; A w on P, A elsewhere."""
    shaped = []
    for advantages, extra in zip(in_groups(base), in_groups(bonus)):
        positive = [a > 0 for a in advantages]
        weights = [max(0.0, 1 + b) if p else 0.0 for b, p in zip(extra, positive)]
        total = sum(a for a, p in zip(advantages, positive) if p)
        shared = sum(a * w for a, w in zip(advantages, weights))
        scale = total / shared if shared > 0 else None
        shaped += [a * w * scale if p and scale else a for a, w, p in zip(advantages, weights, positive)]
    return shaped


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
    maxrl = literal_maxrl(REWARDS)
    assert maxrl == pytest.approx([2.0, -1.0, -1.0, 0.5, 0.5, -1.0, 0.0, 0.0, 0.0])
    bonus = bonus_of(client) if weight else [0.0] * len(maxrl)
    assert shaped == pytest.approx([a + b for a, b in zip(maxrl, bonus)], abs=1e-5)
    assert base[:6] != pytest.approx(maxrl[:6], abs=1e-3)  # the mixed groups: not veRL's own GRPO
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
    assert shaped == pytest.approx(literal_reshare(base, bonus_of(client, "zscore")), abs=1e-5)
    moved = False
    for before, after in zip(in_groups(base), in_groups(shaped)):
        push = [(a, s) for a, s in zip(before, after) if a > 0]
        assert sum(s for _, s in push) == pytest.approx(sum(a for a, _ in push), abs=1e-5)  # the total push: veRL's
        assert all(s == pytest.approx(a, abs=1e-6) for a, s in zip(before, after) if a <= 0)  # wrong ones: veRL's
        moved = moved or any(abs(s - a) > 1e-4 for a, s in push)
    assert moved  # the bonus really re-shared a group's push (p1's two right answers)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["+algorithm.setpo.advantage=max_rl"], r"\+algorithm.setpo.advantage must be one of .*maxrl.*, got 'max_rl'"),
        (
            ["+algorithm.setpo.combine=re-share"],
            r"\+algorithm.setpo.combine must be one of add, reshare, got 're-share'",
        ),
        (
            ["+algorithm.setpo.combine=reshare"],
            r"\+algorithm.setpo.combine=reshare .* \+algorithm.setpo.normalize=zscore",
        ),
        (["+algorithm.setpo.positive_weight=0"], r"\+algorithm.setpo.positive_weight must be a finite number > 0"),
        (["+algorithm.setpo.positive_weight=high"], r"\+algorithm.setpo.positive_weight must be a number"),
    ],
    ids=[
        "misspelt-advantage",
        "misspelt-combine",
        "reshare-without-zscore",
        "positive-weight-0",
        "text-positive-weight",
    ],
)
def test_the_real_v1_trainer_refuses_a_base_or_combination_it_cannot_train_by_its_setting(server, overrides, match):
    config = verl_config(*setpo(server.url), *overrides)
    with pytest.raises(ValueError, match=match):
        get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


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

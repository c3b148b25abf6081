"""setpo_advantage and setpo_combine (issue 62) in real few-step TRL GRPO runs on CPU, against the real service: the
loss sees MaxRL's or W-REINFORCE's advantages computed literally from the step's rewards (plus the service's bonus),
a re-shared bonus moves the group's positive push among its members without changing its total and leaves the others
at TRL's advantage, and a reward that is not pass/fail is refused by name."""

import pytest

from tests.integrations.trl.test_trl_plugin import WEIGHT, make_trainer, spy, tiny_model  # noqa: F401

SIZE = 4  # num_generations in make_trainer


def pass_fail(completions, **kwargs):
    """A verifier's 1 or 0 (here: a completion of even length passes), different within most groups."""
    return [float(len(completion) % 2 == 0) for completion in completions]


def groups_of(values: list) -> list[list]:
    return [values[i : i + SIZE] for i in range(0, len(values), SIZE)]


def literal_maxrl(rewards: list[float]) -> list[float]:
    """(r - p) / p with p the group's success rate; 0 for a group all right or all wrong (Tajwar et al., 2026)."""
    shaped = []
    for group in groups_of(rewards):
        p = sum(group) / len(group)
        shaped += [0.0 if p in (0.0, 1.0) else (r - p) / p for r in group]
    return shaped


def literal_reshare(base: list[float], bonus: list[float]) -> list[float]:
    """P = {A > 0}; w = max(0, 1 + b) on P, scaled so that sum_P A w = sum_P A; A w on P, A elsewhere."""
    shaped = []
    for advantages, extra in zip(groups_of(base), groups_of(bonus)):
        positive = [a > 0 for a in advantages]
        weights = [max(0.0, 1 + b) if p else 0.0 for b, p in zip(extra, positive)]
        total = sum(a for a, p in zip(advantages, positive) if p)
        shared = sum(a * w for a, w in zip(advantages, weights))
        scale = total / shared if shared > 0 else None
        shaped += [a * w * scale if p and scale else a for a, w, p in zip(advantages, weights, positive)]
    return shaped


def bonus_of(client, texts: list[str], **policy) -> list[float]:
    """The service's bonus for the step's groups (texts alone: no scope), at the trainer's weight (a v1.1 request, as
    the shaper's, whose answer has the bonus)."""
    policy = {"normalize": "none", **policy}
    answer = client.diversity([{"texts": group} for group in groups_of(texts)], weight=WEIGHT, **policy)
    return [b for group in answer.groups for b in group.bonus]


def test_maxrl_at_weight_zero_trains_on_maxrls_advantages_of_the_steps_rewards(tiny_model, client, spy, tmp_path):  # noqa: F811
    policy = {"setpo_advantage": "maxrl"}
    make_trainer(tiny_model, client, tmp_path, reward_funcs=pass_fail, weight=0.0, setpo_policy=policy).train()
    assert len(spy["trl"]) == len(spy["loss"]) == 2
    for (trls, texts), trained_on in zip(spy["trl"], spy["loss"]):
        expected = literal_maxrl(pass_fail(texts))
        assert any(value not in (0.0, -1.0) for value in expected)  # a group neither all right nor all wrong
        assert [trained_on[text] for text in texts] == pytest.approx(expected, abs=1e-6)
        assert [trained_on[text] for text in texts] != pytest.approx(trls.tolist(), abs=1e-3)  # not TRL's own


def test_w_reinforce_plus_the_bonus_reaches_the_loss(tiny_model, client, spy, tmp_path):  # noqa: F811
    policy = {"setpo_advantage": "w_reinforce", "setpo_positive_weight": 0.25}
    make_trainer(tiny_model, client, tmp_path, reward_funcs=pass_fail, setpo_policy=policy).train()
    for (_, texts), trained_on in zip(spy["trl"], spy["loss"]):
        base = [0.25 if r == 1.0 else -1.0 for r in pass_fail(texts)]  # no group baseline (Zhu et al., 2025)
        expected = [a + b for a, b in zip(base, bonus_of(client, texts))]
        assert [trained_on[text] for text in texts] == pytest.approx(expected, abs=1e-5)


def test_a_reshared_bonus_keeps_the_groups_positive_push_and_the_other_members_advantages(
    tiny_model,  # noqa: F811
    client,
    spy,  # noqa: F811
    tmp_path,
):
    policy = {"setpo_combine": "reshare", "setpo_normalize": "zscore"}
    make_trainer(tiny_model, client, tmp_path, reward_funcs=pass_fail, setpo_policy=policy).train()
    moved = False
    for (trls, texts), trained_on in zip(spy["trl"], spy["loss"]):
        base, shaped = trls.tolist(), [trained_on[text] for text in texts]
        assert shaped == pytest.approx(literal_reshare(base, bonus_of(client, texts, normalize="zscore")), abs=1e-5)
        for before, after in zip(groups_of(base), groups_of(shaped)):
            push = [(a, s) for a, s in zip(before, after) if a > 0]
            assert sum(s for _, s in push) == pytest.approx(sum(a for a, _ in push), abs=1e-5)  # the total push
            assert all(s == pytest.approx(a, abs=1e-6) for a, s in zip(before, after) if a <= 0)  # the others: TRL's
            moved = moved or any(abs(s - a) > 1e-4 for a, s in push)
    assert moved  # the bonus really re-shared some group's push


def test_a_reward_that_is_not_pass_fail_is_refused_by_name(tiny_model, client, tmp_path):  # noqa: F811
    def partial_credit(completions, **kwargs):  # a formatted but wrong answer earns 0.1, as Countdown's reward does
        return [0.1, *[1.0] * (len(completions) - 1)]

    trainer = make_trainer(
        tiny_model, client, tmp_path, reward_funcs=partial_credit, weight=0.0, setpo_policy={"setpo_advantage": "maxrl"}
    )
    with pytest.raises(ValueError, match=r"advantage='maxrl': group 0 member 0 has reward 0\.1\d*: .* binary rewards"):
        trainer.train()

"""The coverage-keeping bases and the re-shared combination (setpo_core.advantages): hand-computed float64 literals, the
literal definitions of tests/core/reference.py on random groups, and the refusal of rewards that are not pass/fail."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from setpo_core.advantages import check_binary, maxrl_advantages, reshared_advantages, w_reinforce_advantages
from tests.core import reference


def f64(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_maxrl_hand_computed():
    rewards = f64([[1, 0, 0, 1], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    mask = torch.tensor([[True] * 4] * 4 + [[True, True, True, False]])
    expected = f64([[1, -1, -1, 1], [3, -1, -1, -1], [0, 0, 0, 0], [0, 0, 0, 0], [0.5, -1, 0.5, 0]])
    assert torch.allclose(maxrl_advantages(rewards, mask), expected, rtol=0, atol=1e-15)


def test_w_reinforce_hand_computed():
    rewards = f64([[1, 0, 1], [1, 1, 1], [0, 0, 1]])
    mask = torch.tensor([[True] * 3, [True] * 3, [True, True, False]])
    assert torch.equal(w_reinforce_advantages(rewards, mask), f64([[0.1, -1, 0.1], [0.1, 0.1, 0.1], [-1, -1, 0]]))
    assert torch.equal(w_reinforce_advantages(rewards[:1], positive_weight=0.5), f64([[0.5, -1, 0.5]]))


def test_reshared_hand_computed():
    third = 1 / 3
    advantages = f64([[third, third, third, -1], [third, third, third, -1], [0.6, 0.2, -0.4, -0.4], [1, 1, -1, -1]])
    bonus = f64([[0.5, -0.5, 0, 0], [2, -1.5, -0.5, 0], [1, 0, 0, 0], [-2, -3, 0, 0]])
    expected = f64(
        [
            [0.5, 1 / 6, third, -1],  # weights 1.5, 0.5, 1: already mean 1
            [6 / 7, 0, 1 / 7, -1],  # weights 3, 0 (clamped), 0.5, scaled by 6/7
            [0.6 * 8 / 7, 0.2 * 4 / 7, -0.4, -0.4],  # unequal push: scaled so that 0.6 + 0.2 is kept
            [1, 1, -1, -1],  # every weight 0: the base's push as it was
        ]
    )
    assert torch.allclose(reshared_advantages(advantages, bonus), expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("function", [maxrl_advantages, w_reinforce_advantages])
def test_rewards_that_are_not_pass_fail_are_refused_by_name(function):
    with pytest.raises(ValueError, match=r"group 1 member 2 has reward 0\.1.*binary"):
        function(f64([[1, 0, 1], [0, 1, 0.1]]))
    function(f64([[1, 0, 1], [0, 1, 0.1]]), torch.tensor([[True] * 3, [True, True, False]]))  # padding is not read
    with pytest.raises(ValueError, match="reward nan"):
        check_binary(f64([[1, float("nan"), 0]]))


@st.composite
def groups(draw):
    size = draw(st.integers(3, 10))
    rewards = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=size, max_size=size))
    bonus = draw(st.lists(st.floats(-3, 3), min_size=size, max_size=size))
    return rewards, bonus


@settings(max_examples=300, deadline=None)
@given(groups(), st.sampled_from([0.1, 0.5]))
def test_bases_and_resharing_match_the_literal_definitions(group, positive_weight):
    rewards, bonus = group
    maxrl = maxrl_advantages(f64([rewards]))[0]
    assert torch.allclose(maxrl, f64([reference.maxrl(rewards)])[0], rtol=0, atol=1e-12)
    w = w_reinforce_advantages(f64([rewards]), positive_weight=positive_weight)[0]
    assert w.tolist() == reference.w_reinforce(rewards, positive_weight)
    for base in (maxrl, w):
        shaped = reshared_advantages(base[None], f64([bonus]))[0]
        assert torch.allclose(shaped, f64([reference.reshared(base.tolist(), bonus)])[0], rtol=0, atol=1e-12)
        positive = base > 0
        assert torch.isclose(shaped[positive].sum(), base[positive].sum(), rtol=1e-12, atol=1e-12)  # the base's push
        assert torch.equal(shaped[~positive], base[~positive])  # wrong answers keep the base's advantage

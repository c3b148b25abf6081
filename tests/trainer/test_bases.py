"""--setpo.advantage through setpo-train on real OpenRLHF Experiences, through the real running service: the base
the shaper computes from each response's 0/1 reward replaces OpenRLHF's group advantage (MaxRL's written out here),
the bonus combines with it, and a reward that is not pass/fail is refused by name."""

import copy

import pytest
import torch

from setpo_trainer.openrlhf.rewards import path as reward_file
from tests.trainer import rollouts

# groups of 4 GSM8K responses, right (reward 1) or wrong (0): success rates 1/4, 3/4, 1/2 and 0
RATES = [["right"] + ["wrong"] * 3, ["right"] * 3 + ["wrong"], ["right", "wrong", "wrong", "right"], ["wrong"] * 4]


def maxrl_rollout(problems, strategy, tokenizer, maker) -> list:
    """OpenRLHF's Experiences for RATES' groups, whose rewards are 0 and 1 (the math reward file's)."""
    groups = [
        [rollouts.responses(answer, kind)[j] for j, kind in enumerate(kinds)]
        for (_, answer), kinds in zip(problems, RATES)
    ]
    samples = rollouts.scripted_samples(strategy, tokenizer, problems, groups, "math")
    return rollouts.after_model_forward(maker.split_rollout_samples(samples), kl_scale=0.0), groups


@pytest.mark.parametrize("weight", ["0", "0.2"])
def test_maxrl_replaces_openrlhfs_advantage_and_the_bonus_adds_to_it(weight, tiny_model, server, client, problems):
    """--setpo.advantage maxrl: every response token of response i trains on MaxRL's (r_i - p) / p, p its group's
    success rate, written out below from the rewards, plus lambda * s_i, in place of OpenRLHF's dr_grpo advantage."""
    flags = [*rollouts.SETTINGS["dr_grpo"][:-2], "--setpo.weight", weight, "--setpo.advantage", "maxrl"]
    openrlhf, setpo, strategy, tokenizer = rollouts.makers(tiny_model, server.url, *flags)
    experiences, groups = maxrl_rollout(problems, strategy, tokenizer, setpo)
    base = openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences))
    shaped = setpo.compute_advantages_and_returns(copy.deepcopy(experiences))

    given = {index: reward for e in base for index, reward in zip(e.index, e.rewards.tolist())}
    assert [[given[4 * g + j] for j in range(4)] for g in range(4)] == [
        [1, 0, 0, 0],
        [1, 1, 1, 0],
        [1, 0, 0, 1],
        [0] * 4,
    ]
    maxrl = [3.0, -1.0, -1.0, -1.0, 1 / 3, 1 / 3, 1 / 3, -1.0, 1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    marginals = [s for result in client.diversity([{"texts": g} for g in groups]).groups for s in result.marginals]
    for before, after in zip(base, shaped):
        for row, index in enumerate(after.index):
            response = after.action_mask[row].bool()
            expected = maxrl[index] + float(weight) * marginals[index]
            assert torch.allclose(after.advantages[row][response], torch.tensor(expected), atol=1e-5)
            assert torch.equal(after.advantages[row][~response], before.advantages[row][~response])  # untouched
            if maxrl[index] != 0:  # a mixed group: not OpenRLHF's r - mean(r)
                assert not torch.allclose(before.advantages[row][response], torch.tensor(expected), atol=1e-3)


def test_a_reward_that_is_not_pass_fail_is_refused_by_name_under_maxrl(tiny_model, server, problems):
    """Countdown's reward file gives 0.1 to a formatted but wrong answer: MaxRL's success rate is undefined there."""
    flags = [
        *rollouts.SETTINGS["dr_grpo"][:-2],
        "--reward.remote_url",
        str(reward_file("countdown")),
        "--setpo.weight",
        "0",
    ]
    _, setpo, strategy, tokenizer = rollouts.makers(tiny_model, server.url, *flags, "--setpo.advantage", "maxrl")
    samples = rollouts.scripted_samples(
        strategy, tokenizer, rollouts.countdown_problems(), list(rollouts.COUNTDOWN.values()), "countdown"
    )
    experiences = rollouts.after_model_forward(setpo.split_rollout_samples(samples), kl_scale=0.0)
    with pytest.raises(ValueError, match=r"advantage='maxrl': group 0 member 3 has reward 0\.1\d*: .* binary rewards"):
        setpo.compute_advantages_and_returns(experiences)

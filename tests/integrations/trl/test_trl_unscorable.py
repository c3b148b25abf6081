"""Completions TRL excludes (every reward function returned None: TRL zeroes their advantage, so they do not move the
policy) get no learning signal from SetPO either, in real one-step TRL GRPO runs on CPU against the real service."""

import pytest
import torch

from tests.integrations.trl.test_trl_plugin import WEIGHT, make_trainer, spy, tiny_model, varied_reward  # noqa: F401


def declining_first_of_each_group(seen: dict):
    """A reward function that declines (None) the first completion of each group of 4, as a multi-task reward does for
    a completion it does not apply to; it records whether the step's scoring was already submitted."""

    def reward(completions, **kwargs):
        pending = seen["trainer"].setpo.pending
        seen["submitted"].append(pending is not None and pending.work is not None)
        return [None if i % 4 == 0 else r for i, r in enumerate(varied_reward(completions))]

    return reward


def train_one_step(tiny_model, client, tmp_path, policy=None):  # noqa: F811
    seen: dict = {"submitted": []}
    trainer = make_trainer(
        tiny_model, client, tmp_path, max_steps=1, reward_funcs=declining_first_of_each_group(seen), setpo_policy=policy
    )
    seen["trainer"] = trainer
    trainer.train()
    return seen["submitted"]


def test_submitted_at_generation_unscorable_completions_get_no_bonus(tiny_model, client, spy, tmp_path):  # noqa: F811
    """The paper's form (no min_reward): submitted at generation, before TRL's rewards, and kept so."""
    assert train_one_step(tiny_model, client, tmp_path) == [True]  # still submitted before TRL's rewards
    (base, texts), trained_on = spy["trl"][0], spy["loss"][0]
    groups = [texts[i : i + 4] for i in range(0, len(texts), 4)]
    # submitted before the rewards existed, the unscorable completions were in their groups' marginals
    marginals = torch.tensor([s for g in client.diversity([{"texts": g} for g in groups]).groups for s in g.marginals])
    for i, text in enumerate(texts):
        if i % 4 == 0:  # unscorable: TRL's zero advantage, nothing added
            assert base[i].item() == 0.0 and trained_on[text] == 0.0
        else:
            assert trained_on[text] == pytest.approx(base[i].item() + WEIGHT * marginals[i].item(), abs=1e-5)


def test_with_min_reward_unscorable_completions_are_in_no_marginal(tiny_model, client, spy, tmp_path):  # noqa: F811
    # min_reward 0: TRL's nansum turns an unscorable completion's reward into 0, which would put it in scope
    assert train_one_step(tiny_model, client, tmp_path, policy={"setpo_min_reward": 0.0}) == [False]
    (base, texts), trained_on = spy["trl"][0], spy["loss"][0]
    scorable = [texts[i + 1 : i + 4] for i in range(0, len(texts), 4)]  # each group without its first completion
    direct = client.diversity(
        [{"texts": g, "rewards": varied_reward(g)} for g in scorable], weight=WEIGHT, min_reward=0.0
    )
    bonus = iter(b for group in direct.groups for b in group.bonus)
    for i, text in enumerate(texts):
        expected = base[i].item() + (0.0 if i % 4 == 0 else next(bonus))
        assert trained_on[text] == pytest.approx(expected, abs=1e-5)
    assert all(trained_on[texts[i]] == base[i].item() == 0.0 for i in range(0, len(texts), 4))

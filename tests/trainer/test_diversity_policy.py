"""The diversity policy through setpo-train (--setpo.min_reward, key, kernel, normalize, target_ratio and the
controller's bounds) on real OpenRLHF Experiences, through the real running service: each row's reward and
advantage reach SetpoShaper in the rollout's order, a row below min_reward gets exactly nothing, the bonus
added is the service's own `bonus`, and a target ratio moves lambda from step to step."""

import copy
import itertools

import pytest
import torch

from setpo_client.keys import countdown_expression
from setpo_client.weight import WeightController
from setpo_trainer.openrlhf.rewards import path as reward_file
from tests.trainer.rollouts import (
    COUNTDOWN,
    DIVERSITY_POLICY,
    KINDS,
    N_SAMPLES,
    SETTINGS,
    after_model_forward,
    assert_shaped,
    countdown_problems,
    makers,
    recording_client,
    responses,
    rollout,
    scripted_samples,
)


def row_means(experiences: list) -> dict[int, float]:
    """Each row's advantage as one number, by its place in the rollout: the mean over its response tokens."""
    means = {}
    for experience in experiences:
        mask = experience.action_mask.float()  # (B, A)
        for index, mean in zip(experience.index, (experience.advantages * mask).sum(-1) / mask.sum(-1)):
            means[index] = mean.item()
    return means


def test_the_flags_build_the_shaper(tiny_model, server):
    _, paper, _, _ = makers(tiny_model, server.url, *SETTINGS["grpo"])
    shaper = paper.setpo
    assert (shaper.weight, shaper.min_reward, shaper.key, shaper.kernel, shaper.normalize, shaper.controller) == (
        0.05,
        None,
        None,
        "embedding",
        "none",
        None,
    )  # the paper's form
    _, scoped, _, _ = makers(tiny_model, server.url, *SETTINGS["grpo"], *DIVERSITY_POLICY)
    shaper = scoped.setpo
    assert (shaper.min_reward, shaper.key, shaper.kernel, shaper.normalize) == (
        1.0,
        countdown_expression,
        "hybrid",
        "zscore",
    )
    assert shaper.controller == WeightController(0.3, 0.01, 2.0, 0.5, warmup_steps=3, freeze_after=100, weight=0.05)
    assert shaper.weight == 0.05  # --setpo.weight: the first step's lambda


def test_embed_span_flag_reaches_the_shaper(tiny_model, server):
    _, maker, _, _ = makers(tiny_model, server.url, *SETTINGS["grpo"], "--setpo.embed_span", "<answer>(.*?)</answer>")
    assert maker.setpo.embed_span.pattern == "<answer>(.*?)</answer>"
    _, paper, _, _ = makers(tiny_model, server.url, *SETTINGS["grpo"])
    assert paper.setpo.embed_span is None  # the whole text, as before


@pytest.mark.parametrize("kernel", ["hybrid", "key"])
def test_only_correct_responses_get_a_bonus_and_it_is_the_services(kernel, tiny_model, server, client):
    flags = [
        *SETTINGS["grpo"][:-2],
        "--reward.remote_url",
        str(reward_file("countdown")),
        "--setpo.weight",
        "0.5",
        "--setpo.min_reward",
        "1",
        "--setpo.key",
        "countdown_expression",
        "--setpo.kernel",
        kernel,
        "--setpo.normalize",
        "zscore",
    ]
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *flags)
    setpo.setpo.client, wire = recording_client(server.url)
    groups = list(COUNTDOWN.values())
    samples = scripted_samples(strategy, tokenizer, countdown_problems(), groups, "countdown")
    experiences = after_model_forward(setpo.split_rollout_samples(samples), kl_scale=0.05)
    base = openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences))
    shaped = setpo.compute_advantages_and_returns(copy.deepcopy(experiences))

    # OpenRLHF's rewards, by the row's place in the rollout: what COUNTDOWN's comments say
    given = {index: reward for e in base for index, reward in zip(e.index, e.rewards.tolist())}
    rewards = [[given[g * N_SAMPLES + j] for j in range(N_SAMPLES)] for g in range(len(groups))]
    assert rewards == [pytest.approx(r) for r in ([1, 1, 1, 0.1], [1, 1, 1, 1], [1, 1, 0.1, 0], [0.1, 0, 0.1, 0])]
    # the two groups with >= 3 correct responses, each row with its reward and key; the others are not sent
    sent = [
        {"texts": group, "rewards": reward, "keys": [countdown_expression(text) for text in group]}
        for group, reward in zip(groups[:2], rewards[:2])
    ]
    if kernel == "key":  # nothing is embedded
        sent = [{"rewards": group["rewards"], "keys": group["keys"]} for group in sent]
    assert sent[0]["keys"][0] == sent[0]["keys"][1] != sent[0]["keys"][2]  # one solution written twice
    assert wire.sent == [{"groups": sent, "weight": 0.5, "min_reward": 1.0, "kernel": kernel, "normalize": "zscore"}]

    direct = client.diversity(sent, weight=0.5, min_reward=1.0, kernel=kernel, normalize="zscore").groups
    bonus = [b for result in direct for b in result.bonus] + [0.0] * 2 * N_SAMPLES
    assert any(b != 0 for b in bonus) and bonus[3] == 0  # the 0.1 row of a scored group: the service gives 0
    for before, after in zip(base, shaped):
        for row, index in enumerate(after.index):
            if bonus[index] == 0:  # below min_reward, or in a group with fewer than 3 correct: nothing added
                assert torch.equal(after.advantages[row], before.advantages[row])
                continue
            response = after.action_mask[row].bool()
            shift = after.advantages[row] - before.advantages[row]
            assert torch.allclose(shift[response], torch.full_like(shift[response], bonus[index]), atol=1e-6)
            assert torch.all(shift[~response] == 0)
    info = {name: shaped[0].info[name][0].item() for name in shaped[0].info if name.startswith("setpo/")}
    assert info["setpo/small_scope_groups"] == 2 and info["setpo/scored_groups"] == 2
    assert info["setpo/scored_share"] == pytest.approx(7 / 16)
    advantages = row_means(base)
    assert info["setpo/advantage_rms"] == pytest.approx(
        (sum(a * a for a in advantages.values()) / len(advantages)) ** 0.5, rel=1e-5
    )


def test_a_target_ratio_moves_lambda_from_step_to_step(tiny_model, server, client, problems):
    flags = [*SETTINGS["grpo"], "--setpo.target_ratio", "0.5", "--setpo.weight_ema", "0.5"]
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *flags)
    groups = [responses(answer, kind) for (_, answer), kind in zip(problems, KINDS)]
    marginals = [
        s for result in client.diversity([{"texts": group} for group in groups]).groups for s in result.marginals
    ]
    steps = []  # (lambda applied, RMS of the bonus, RMS of OpenRLHF's row advantages), as logged
    for _ in range(3):
        experiences = rollout(problems, strategy, tokenizer, setpo, kl_scale=0.05)
        base = openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences))
        shaped = setpo.compute_advantages_and_returns(experiences)
        logged = {name: shaped[0].info[name][0].item() for name in shaped[0].info}
        assert_shaped(base, shaped, marginals, logged["setpo/weight"])  # the lambda logged is the one applied
        advantages = row_means(base)  # KL in the reward: a row's advantage differs between its tokens
        assert logged["setpo/advantage_rms"] == pytest.approx(
            (sum(a * a for a in advantages.values()) / len(advantages)) ** 0.5, rel=1e-5
        )
        steps.append((logged["setpo/weight"], logged["setpo/bonus_rms"], logged["setpo/advantage_rms"]))

    assert steps[0][0] == pytest.approx(0.05)  # --setpo.weight: the first step's lambda
    for (weight, bonus_rms, advantage_rms), (following, _, _) in itertools.pairwise(steps):
        # WeightController: an average (ema 0.5) of lambda and the lambda that would have hit the target exactly
        assert following == pytest.approx(0.5 * weight + 0.5 * weight * 0.5 * advantage_rms / bonus_rms, rel=1e-5)
    assert len({round(weight, 6) for weight, _, _ in steps}) == 3

"""SetpoExperienceMaker's advantage step on real OpenRLHF Experiences, through the real running service:
A^ - A = lambda * s_i on every response token of response i and 0 elsewhere, for GRPO, GSPO, DAPO and
OpenRLHF's other group estimators; lambda = 0 is OpenRLHF exactly."""

import copy

import pytest
import torch
from openrlhf.trainer.ppo_utils.experience import (
    balance_experiences,
    make_experience_batch,
    remove_padding_in_sequences,
    split_experience_batch,
)

from tests.trainer.rollouts import KINDS, SETTINGS, assert_shaped, makers, recording_client, responses, rollout


@pytest.mark.parametrize("setting", SETTINGS)
def test_advantage_is_openrlhfs_plus_weight_times_service_marginals(setting, tiny_model, server, client, problems):
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS[setting])
    setpo.setpo.client, wire = recording_client(server.url)
    experiences = rollout(problems, strategy, tokenizer, setpo, kl_scale=0.05 if setting == "grpo" else 0.0)
    base = openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences))
    shaped = setpo.compute_advantages_and_returns(copy.deepcopy(experiences))

    groups = [responses(answer, kind) for (_, answer), kind in zip(problems, KINDS)]
    given = {index: reward for e in base for index, reward in zip(e.index, e.rewards.tolist())}  # OpenRLHF's
    sent = [{"texts": group, "rewards": [given[4 * g + j] for j in range(4)]} for g, group in enumerate(groups)]
    assert wire.sent == [
        {"groups": sent, "weight": setpo.setpo.weight, "kernel": "embedding", "normalize": "none"}
    ]  # one request, every group, each row's reward in its place (contract v1.1's fields at the paper's values)
    marginals = [
        s for result in client.diversity([{"texts": group} for group in groups]).groups for s in result.marginals
    ]
    assert_shaped(base, shaped, marginals, strategy.args.setpo.weight)
    assert any(not torch.all(experience.action_mask) for experience in shaped)  # there was padding to keep
    assert any(torch.any(experience.advantages != 0) for experience in base)  # OpenRLHF's own advantages were there
    if setting == "dapo":  # the overlong penalty really changed some rewards before the group step
        assert any(reward not in (0.0, 1.0) for experience in base for reward in experience.rewards.tolist())
    if setting == "grpo":  # KL in the reward: OpenRLHF's advantage differs between tokens of one response
        row = base[0].advantages[0][base[0].action_mask[0].bool()]
        assert not torch.allclose(row, row[0].expand_as(row))


def test_the_actors_loss_batches_carry_the_shaped_advantages_and_the_metrics(tiny_model, server, client, problems):
    """What reaches PolicyModelActor.training_step: the trainer's balancing (--train.dynamic_batch_enable) and
    the replay buffer's split / unpad / batch (its append and collate_fn). training_step then logs every
    info tensor as a metric (its batch mean: our per-sample constants)."""
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["dapo"])
    experiences = rollout(problems, strategy, tokenizer, setpo, kl_scale=0.0)
    base = openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences))
    shaped = setpo.compute_advantages_and_returns(copy.deepcopy(experiences))
    groups = [responses(answer, kind) for (_, answer), kind in zip(problems, KINDS)]
    marginals = [
        s for result in client.diversity([{"texts": group} for group in groups]).groups for s in result.marginals
    ]
    expected = {}  # a trajectory's tokens -> OpenRLHF's advantages on its response tokens + lambda * s
    for experience in base:
        for row, index in enumerate(experience.index):
            tokens = tuple(experience.sequences[row][experience.attention_mask[row].bool()].tolist())
            expected[tokens] = experience.advantages[row][experience.action_mask[row].bool()] + 0.2 * marginals[index]

    items = [
        item
        for batch in balance_experiences(shaped, strategy.args)
        for item in remove_padding_in_sequences(split_experience_batch(batch))
    ]
    batch = make_experience_batch(items)
    assert len(items) == len(expected) + 1  # the duplicate response is one trajectory twice
    for row in range(len(items)):
        tokens = tuple(batch.sequences[row][batch.attention_mask[row].bool()].tolist())
        assert torch.allclose(batch.advantages[row][batch.action_mask[row].bool()], expected[tokens], atol=1e-6)
    assert torch.allclose(torch.tensor(batch.info["setpo/weight"]), torch.tensor(0.2))
    assert {
        "setpo/set_score_mean",
        "setpo/marginal_std",
        "setpo/saturation",
        "setpo/duplicate_share",
        "setpo/fallback_steps",
        "setpo/time_s",
        "setpo/bonus_rms",
        "setpo/advantage_rms",  # only when the experience maker hands SetpoShaper the advantages
        "setpo/bonus_ratio",
        "setpo/scored_groups",
        "setpo/scored_share",
    } <= batch.info.keys()


def test_weight_zero_is_openrlhf_exactly_and_sends_nothing(tiny_model, server, problems):
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["grpo"][:-2], "--setpo.weight", "0")
    setpo.setpo.client, wire = recording_client(server.url)
    experiences = rollout(problems, strategy, tokenizer, setpo, kl_scale=0.05)
    base = openrlhf.compute_advantages_and_returns(copy.deepcopy(experiences))
    shaped = setpo.compute_advantages_and_returns(copy.deepcopy(experiences))
    for before, after in zip(base, shaped):
        assert torch.equal(after.advantages, before.advantages) and torch.equal(after.returns, before.returns)
        assert torch.equal(after.info["setpo/weight"], torch.zeros(len(after.index)))
    assert wire.sent == []


def test_step_metrics_ride_in_experience_info(tiny_model, server, client, problems):
    _, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["grpo"])
    first = setpo.compute_advantages_and_returns(rollout(problems, strategy, tokenizer, setpo, kl_scale=0.05))
    second = setpo.compute_advantages_and_returns(rollout(problems, strategy, tokenizer, setpo, kl_scale=0.05))

    groups = [responses(answer, kind) for (_, answer), kind in zip(problems, KINDS)]
    results = client.diversity([{"texts": group} for group in groups]).groups
    marginals = torch.tensor([s for result in results for s in result.marginals])
    expected = {
        "setpo/set_score_mean": sum(r.set_score for r in results) / len(results),
        "setpo/marginal_mean": marginals.mean().item(),
        "setpo/marginal_std": marginals.std(unbiased=False).item(),
        "setpo/saturation": sum(r.saturation for r in results) / len(results),
        "setpo/duplicate_share": 1 / 16,
        "setpo/weight": 0.05,
        "setpo/fallback_steps": 0.0,
    }
    for experience in first + second:
        rows = len(experience.index)
        for name, value in expected.items():
            assert experience.info[name].shape == (rows,) and torch.allclose(
                experience.info[name], torch.tensor(value), atol=1e-5
            ), name
        assert torch.all(experience.info["setpo/time_s"] > 0)
    # time_share needs a whole step: from the previous advantage step to this one
    assert all("setpo/time_share" not in experience.info for experience in first)
    assert all(0 < experience.info["setpo/time_share"][0] < 1 for experience in second)


def test_prompt_response_embedding_and_character_cap(tiny_model, server, problems):
    _, setpo, strategy, tokenizer = makers(
        tiny_model, server.url, *SETTINGS["grpo"], "--setpo.embed", "prompt_response"
    )
    setpo.setpo.client, wire = recording_client(server.url)
    setpo.compute_advantages_and_returns(rollout(problems, strategy, tokenizer, setpo, kl_scale=0.0))
    sent = [group["texts"] for group in wire.sent[0]["groups"]]
    assert sent == [
        [prompt + response for response in responses(answer, kind)] for (prompt, answer), kind in zip(problems, KINDS)
    ]

    _, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["grpo"], "--setpo.max_chars", "20")
    setpo.setpo.client, wire = recording_client(server.url)
    setpo.compute_advantages_and_returns(rollout(problems, strategy, tokenizer, setpo, kl_scale=0.0))
    sent = [group["texts"] for group in wire.sent[0]["groups"]]
    assert sent == [
        [response[:20] for response in responses(answer, kind)] for (_, answer), kind in zip(problems, KINDS)
    ]

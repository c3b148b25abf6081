"""POST /v1/diversity through the real server and client, checked against the literal definition."""

import torch

from setpo_core.diversity import group_advantages
from tests.core import reference
from tests.inprocess import InProcessService

SOLUTIONS = [
    "Each box holds 12 eggs, so 5 boxes hold 5 * 12 = 60 eggs. The answer is 60.",
    "Five boxes of twelve: 12 + 12 + 12 + 12 + 12 = 60. The answer is 60.",
    "Let x be the number of eggs. x / 5 = 12, so x = 60. The answer is 60.",
    "Each box holds 12 eggs, so 5 boxes hold 5 * 12 = 60 eggs. The answer is 60.",
    "There are 10 eggs per box and 5 boxes, so 50 eggs. The answer is 50.",
]


def reference_marginals(vectors: list[list[float]]) -> torch.Tensor:
    return torch.tensor(reference.loo_marginals(reference.kernel_of(vectors)), dtype=torch.float64)


def test_text_groups_match_the_literal_definition_on_the_servers_embeddings(inprocess):
    result = inprocess.diversity([{"texts": SOLUTIONS}])
    vectors = [item.embedding for item in inprocess.embeddings(SOLUTIONS).data]
    group = result.groups[0]
    assert (torch.tensor(group.marginals, dtype=torch.float64) - reference_marginals(vectors)).abs().max() <= 1e-5
    kernel = reference.kernel_of(vectors)
    members = list(range(len(SOLUTIONS)))
    assert abs(group.set_score - reference.set_score(kernel, members)) <= 1e-5
    assert all(abs(m - reference.local_mass(kernel, members, y)) <= 1e-5 for y, m in zip(members, group.local_mass))
    assert result.model == "all-MiniLM-L6-v2"


def test_identical_texts_are_embedded_once_and_get_equal_lowest_credit(inprocess):
    result = inprocess.diversity([{"texts": SOLUTIONS}, {"texts": SOLUTIONS[:3]}])
    assert result.usage.texts == 8
    assert result.usage.unique_texts == 4  # SOLUTIONS[3] repeats SOLUTIONS[0]; group 2 repeats group 1
    marginals = result.groups[0].marginals
    assert abs(marginals[0] - marginals[3]) <= 1e-6
    assert max(marginals[0], marginals[3]) < min(marginals[1], marginals[2], marginals[4])


def test_embedding_groups_of_different_sizes_and_dimensions_in_one_request(inprocess):
    generator = torch.Generator().manual_seed(0)
    groups = [torch.randn(size, dim, generator=generator) + 0.5 for size, dim in [(3, 4), (7, 16), (16, 50)]]
    result = inprocess.diversity([{"embeddings": g.tolist()} for g in groups] + [{"texts": SOLUTIONS[:3]}])
    assert [len(g.marginals) for g in result.groups] == [3, 7, 16, 3]
    for group, response in zip(groups, result.groups):
        assert (
            torch.tensor(response.marginals, dtype=torch.float64) - reference_marginals(group.double().tolist())
        ).abs().max() <= 1e-5
    assert result.usage.texts == 3


def test_advantages_only_for_groups_with_rewards_and_equal_group_advantage_plus_weight_times_marginal(inprocess):
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0]
    default = inprocess.diversity([{"texts": SOLUTIONS, "rewards": rewards}, {"texts": SOLUTIONS[:3]}])
    explicit = inprocess.diversity([{"texts": SOLUTIONS, "rewards": rewards}], weight=0.5)
    off = inprocess.diversity([{"texts": SOLUTIONS, "rewards": rewards}], weight=0.0)

    base = group_advantages(torch.tensor([rewards], dtype=torch.float64))[0]
    marginals = torch.tensor(default.groups[0].marginals, dtype=torch.float64)
    assert default.groups[1].advantages is None
    assert torch.allclose(
        torch.tensor(default.groups[0].advantages, dtype=torch.float64), base + 0.05 * marginals, atol=1e-5
    )
    assert torch.allclose(
        torch.tensor(explicit.groups[0].advantages, dtype=torch.float64), base + 0.5 * marginals, atol=1e-5
    )
    assert torch.allclose(torch.tensor(off.groups[0].advantages, dtype=torch.float64), base, atol=1e-6)


def test_all_equal_rewards_give_only_the_diversity_term(inprocess):
    result = inprocess.diversity([{"texts": SOLUTIONS[:4], "rewards": [0.7] * 4}], weight=1.0)
    assert result.groups[0].advantages == result.groups[0].marginals


def test_saturation_is_the_share_of_near_duplicate_pairs(inprocess):
    result = inprocess.diversity([{"embeddings": [[1, 0], [1, 0.01], [0, 1], [0.01, 1]]}])
    assert abs(result.groups[0].saturation - 2 / 6) <= 1e-6  # (0,1) and (2,3) of the six pairs


def test_over_long_texts_are_truncated_and_counted(inprocess):
    long_text = "step " * 400  # far over all-MiniLM-L6-v2's 256 tokens
    result = inprocess.diversity([{"texts": [long_text, "a", "b"]}])
    assert result.usage.truncated == 1
    assert result.usage.tokens == 256 + 3 + 3  # "a" and "b" are [CLS] a [SEP]


def test_one_big_group_among_many_small_ones_gets_the_same_answers_as_alone(inprocess):
    # The server scores groups in buckets of one size (no padding to the largest); answers keep request order.
    generator = torch.Generator().manual_seed(1)
    groups = [torch.randn(3, 8, generator=generator) + 0.3 for _ in range(40)]
    groups.insert(17, torch.randn(64, 8, generator=generator) + 0.3)
    groups.insert(5, torch.randn(5, 8, generator=generator) + 0.3)
    rewards = [[float(i % 2) for i in range(len(g))] for g in groups]
    together = inprocess.diversity(
        [{"embeddings": g.tolist(), "rewards": r} for g, r in zip(groups, rewards)], weight=0.3
    )
    for group, reward, answer in zip(groups, rewards, together.groups):
        alone = inprocess.diversity([{"embeddings": group.tolist(), "rewards": reward}], weight=0.3).groups[0]
        assert answer == alone


def test_huge_finite_rewards_give_finite_advantages(inprocess):
    result = inprocess.diversity([{"texts": SOLUTIONS[:3], "rewards": [1e39, 0.0, -1e39]}], weight=0.0)
    assert torch.allclose(
        torch.tensor(result.groups[0].advantages, dtype=torch.float64),
        torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64),
    )


def test_truncation_side_left_keeps_the_ends_of_long_texts(inprocess):
    prefix = "step " * 300  # over the model's 256 tokens: only the end tells these two apart
    texts = [prefix + "so the answer is sixty", prefix + "therefore we find fifty as the result"]

    def cosine(response) -> float:
        a, b = (torch.tensor(item.embedding) for item in response.data)
        return float(a @ b)

    assert cosine(inprocess.embeddings(texts)) > 0.999  # default "right": both keep the same beginning
    with InProcessService(truncation_side="left") as left, left.client() as left_client:
        kept_ends = left_client.embeddings(texts)
    assert cosine(kept_ends) < 0.99
    assert kept_ends.usage.truncated == 2

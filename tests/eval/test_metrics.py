"""pass@k against hand-computed cases and the combinatorial definition; diversity metrics on built sets."""

from itertools import combinations

import pytest
import torch

from setpo_trainer.eval import metrics


def pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of n samples (the first c correct) that hold at least one correct sample."""
    subsets = list(combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize(
    "n,c,k,expected",
    [(4, 1, 1, 0.25), (4, 1, 2, 0.5), (4, 2, 2, 5 / 6), (5, 0, 3, 0.0), (5, 3, 3, 1.0), (64, 64, 1, 1.0)],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert metrics.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_equals_the_combinatorial_definition():
    for n in range(1, 10):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert metrics.pass_at_k(n, c, k) == pytest.approx(pass_at_k_by_enumeration(n, c, k)), (n, c, k)


def test_pass_at_k_is_one_when_fewer_than_k_samples_are_wrong():
    assert metrics.pass_at_k(64, 60, 8) == 1.0  # only 4 wrong: every 8-subset holds a correct one
    assert metrics.pass_at_k(64, 56, 8) < 1.0


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        metrics.pass_at_k(n, c, k)


def test_ks_and_accuracy_over_problems():
    assert metrics.ks_for(64) == [1, 2, 4, 8, 16, 32, 64]
    assert metrics.ks_for(6) == [1, 2, 4, 6]
    scores = metrics.accuracy([[True, False, False, False], [False] * 4])
    assert scores["pass@1"] == pytest.approx(0.125) and scores["pass@4"] == pytest.approx(0.5)
    assert scores["avg@4"] == pytest.approx(0.125)
    with pytest.raises(ValueError):
        metrics.accuracy([[True], [True, False]])


def test_distinct_correct_answers_and_countdown_diversity():
    answers = [
        ["(1+2)*3", "(1+2)*3", "3*(2+1)", None],  # 2 distinct correct: diverse
        ["9", None, None, None],  # 1
        ["a", "b", "c", "a"],  # 3: diverse
        [None] * 4,  # 0
    ]
    assert metrics.distinct_correct(answers) == [2, 1, 3, 0]
    assert metrics.countdown_diversity(answers) == {"diversity_width": 2.0, "average_mode": 2.5}
    assert metrics.countdown_diversity([[None, None]]) == {"diversity_width": 0.0, "average_mode": 0.0}


def test_service_diversity_is_the_mean_pairwise_clamped_cosine_and_set_score(inprocess):
    samples = [["12 * 5 = 60", "5 + 5 + ... = 60", "sixty", "12 * 5 = 60"], ["x = 2", "2", "two"]]
    result = metrics.service_diversity(inprocess, samples)
    similarities = []
    for group in samples:
        vectors = torch.tensor([e.embedding for e in inprocess.embeddings(group).data])
        kernel = (vectors @ vectors.T).clamp(0, 1)
        off = ~torch.eye(len(group), dtype=torch.bool)
        similarities.append(kernel[off].mean().item())
    assert result["mean_pairwise_similarity"] == pytest.approx(sum(similarities) / 2, abs=1e-5)
    direct = inprocess.diversity([{"texts": g} for g in samples])
    assert result["set_score"] == pytest.approx(sum(g.set_score for g in direct.groups) / 2)

"""Contract v1.1's math (setpo_core.solutions) against the literal definitions in tests/core/reference.py."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from setpo_core.diversity import cosine_kernel, set_diversity
from setpo_core.solutions import hybrid_kernel, key_kernel, scoped_marginals, standardized
from tests.core import reference


def ids(keys: list[str | None]) -> torch.Tensor:
    """(1, G) integer ids of string keys, -1 for None: the mapping the server does."""
    seen: dict[str, int] = {}
    return torch.tensor([[-1 if k is None else seen.setdefault(k, len(seen)) for k in keys]])


@st.composite
def scored_groups(draw, min_size=3, max_size=10):
    """Embeddings (G, 6) with a shared component (real groups are alike), keys from a small alphabet or None, and
    a scope mask."""
    size = draw(st.integers(min_size, max_size))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(size, 6, generator=generator, dtype=torch.float64) + 1.0
    keys = draw(st.lists(st.sampled_from(["a", "b", "c", None]), min_size=size, max_size=size))
    scored = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return embeddings, keys, scored


def test_key_kernel_is_one_for_equal_keys_only_and_none_is_never_equal():
    kernel = key_kernel(ids(["x", None, "x", None, "y"]))[0]
    assert kernel.tolist() == reference.key_kernel_of(["x", None, "x", None, "y"])
    assert kernel[1, 3] == 0 and kernel[1, 1] == 1 and kernel[0, 2] == 1


@settings(max_examples=200, deadline=None)
@given(scored_groups())
def test_scoped_marginals_match_the_literal_definition_on_the_subset(group):
    embeddings, keys, scored = group
    kernels = {
        "embedding": (cosine_kernel(embeddings[None]), reference.kernel_of(embeddings.tolist())),
        "key": (key_kernel(ids(keys)), reference.key_kernel_of(keys)),
        "hybrid": (
            hybrid_kernel(cosine_kernel(embeddings[None]), ids(keys)),
            reference.hybrid_kernel_of(embeddings.tolist(), keys),
        ),
    }
    for name, (kernel, literal) in kernels.items():
        assert torch.allclose(kernel[0].double(), torch.tensor(literal, dtype=torch.float64), atol=1e-6), name
        got = scoped_marginals(kernel, torch.tensor([scored]))[0]
        expected = reference.scoped_loo_marginals(literal, scored)
        assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5), name


def test_scope_of_the_whole_group_is_the_paper():
    generator = torch.Generator().manual_seed(3)
    kernel = cosine_kernel(torch.randn(4, 7, 5, generator=generator) + 1)  # (4, 7, 7)
    everyone = torch.ones(4, 7, dtype=torch.bool)
    assert torch.equal(scoped_marginals(kernel, everyone), set_diversity(kernel).marginals)


def test_members_outside_the_scope_and_groups_of_fewer_than_three_get_zeros():
    kernel = cosine_kernel(torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(1)))
    scored = torch.tensor([[True, False, True, True, False], [True, True, False, False, False]])
    marginals = scoped_marginals(kernel, scored)
    assert torch.all(marginals[0, [1, 4]] == 0) and torch.all(marginals[0, [0, 2, 3]] != 0)
    assert torch.all(marginals[1] == 0)


def test_a_wrong_member_that_differs_earns_nothing_under_the_scope():
    # three correct members alike, one wrong member orthogonal to them: the paper pays it the most
    embeddings = torch.tensor([[[1.0, 0.1], [1.0, 0.0], [1.0, 0.05], [0.0, 1.0]]])
    kernel = cosine_kernel(embeddings)
    paper = set_diversity(kernel).marginals[0]
    assert paper.argmax() == 3
    scoped = scoped_marginals(kernel, torch.tensor([[True, True, True, False]]))[0]
    assert scoped[3] == 0


def test_a_correct_solution_no_other_member_has_gets_the_highest_key_marginal():
    keys = ids(["A", "A", "A", "B", None])
    scored = torch.tensor([[True, True, True, True, False]])  # the last member is wrong
    z = standardized(scoped_marginals(key_kernel(keys), scored), scored)[0]
    assert z[3] > 0 and torch.all(z[:3] < 0) and z[4] == 0
    assert abs(z[:4].sum().item()) < 1e-5  # z-scores sum to zero over the scope: no net credit to correct answers


@settings(max_examples=200, deadline=None)
@given(scored_groups())
def test_standardized_matches_the_textbook_z_score(group):
    embeddings, keys, scored = group
    kernel = hybrid_kernel(cosine_kernel(embeddings[None]), ids(keys))
    mask = torch.tensor([scored])
    marginals = scoped_marginals(kernel, mask)
    got = standardized(marginals, mask)[0]
    expected = reference.zscores(marginals[0].double().tolist(), scored)
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-4)


def test_all_equal_or_all_distinct_keys_give_zero_z_scores_not_rounding_noise():
    scored = torch.ones(2, 5, dtype=torch.bool)
    keys = torch.cat([ids(["A"] * 5), ids(["A", "B", "C", "D", "E"])])
    marginals = scoped_marginals(key_kernel(keys), scored)
    assert torch.all(standardized(marginals, scored) == 0)
    # a symmetric arrangement (two pairs and a single): the pairs are equal, the single stands out
    single = scored[:1]
    z = standardized(scoped_marginals(key_kernel(ids(list("AABBC"))), single), single)[0]
    assert z[0] == z[1] == z[2] == z[3] and z[4] > 0

"""The closed-form math against the paper's literal definition, and the paper's theorems as properties."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from setpo_core.diversity import (
    SHAPES,
    cosine_kernel,
    group_advantages,
    kernel_saturation,
    pad_groups,
    set_diversity,
    shaped_advantages,
)
from tests.core import reference


def marginals_of(kernel: torch.Tensor, shape: str = "neg_log1p") -> torch.Tensor:
    return set_diversity(kernel[None], shape=shape).marginals[0]


@st.composite
def kernels(draw, min_size=3, max_size=10):
    """A symmetric (G, G) float32 kernel in [0, 1] with unit diagonal, entries drawn by hypothesis."""
    size = draw(st.integers(min_size, max_size))
    upper = draw(
        st.lists(st.floats(0.0, 1.0, width=32), min_size=size * (size - 1) // 2, max_size=size * (size - 1) // 2)
    )
    kernel = torch.eye(size)
    rows, cols = torch.triu_indices(size, size, offset=1)
    kernel[rows, cols] = torch.tensor(upper)
    kernel[cols, rows] = torch.tensor(upper)
    return kernel


def test_batched_closed_form_matches_literal_definition_for_mixed_sizes():
    generator = torch.Generator().manual_seed(0)
    sizes = [3, 4, 5, 8, 16, 33, 64, 128]
    groups = []
    for size in sizes:
        # A shared component makes similarities large and varied, as real responses to one prompt are.
        base = torch.randn(1, 24, generator=generator) * 1.5
        groups.append(torch.randn(size, 24, generator=generator) + base)
    padded, mask = pad_groups(groups)
    result = set_diversity(cosine_kernel(padded), mask)

    for b, group in enumerate(groups):
        kernel = reference.kernel_of(group.double().tolist())
        members = list(range(len(kernel)))
        expected = torch.tensor(reference.loo_marginals(kernel), dtype=torch.float64)
        expected_mass = torch.tensor([reference.local_mass(kernel, members, y) for y in members], dtype=torch.float64)
        size = group.shape[0]
        assert (result.marginals[b, :size].double() - expected).abs().max() <= 1e-5
        assert (result.local_mass[b, :size].double() - expected_mass).abs().max() <= 1e-5
        assert abs(result.set_score[b].item() - reference.set_score(kernel, members)) <= 1e-5
        assert torch.all(result.marginals[b, size:] == 0) and torch.all(result.local_mass[b, size:] == 0)


def test_linear_shape_matches_literal_definition_and_is_minus_mean_pairwise_similarity():
    group = torch.randn(9, 12, generator=torch.Generator().manual_seed(1)) + 1.0
    kernel = reference.kernel_of(group.double().tolist())
    result = set_diversity(cosine_kernel(group[None]), shape="neg_linear")
    expected = torch.tensor(reference.loo_marginals(kernel, g=lambda x: -x), dtype=torch.float64)
    assert (result.marginals[0].double() - expected).abs().max() <= 1e-5
    off_diagonal = [kernel[i][j] for i in range(9) for j in range(9) if i != j]
    assert result.set_score[0].item() == pytest.approx(-sum(off_diagonal) / len(off_diagonal), abs=1e-6)


def test_every_offered_shape_is_strictly_decreasing_on_unit_interval():
    x = torch.linspace(0, 1, 101)
    for name, g in SHAPES.items():
        assert torch.all(g(x[1:]) < g(x[:-1])), name


def test_zero_vector_has_similarity_zero_to_everything_and_no_nan():
    group = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    kernel = cosine_kernel(group[None])[0]
    assert torch.all(kernel[0, 1:] == 0) and torch.all(kernel[1:, 0][:-1] == 0) and kernel[0, 3] == 0
    assert torch.all(torch.diagonal(kernel) == 1)
    result = set_diversity(kernel[None])
    assert torch.isfinite(result.marginals).all() and torch.isfinite(result.set_score).all()


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e20, 1e30])
def test_huge_and_tiny_norms_give_the_same_kernel_as_unit_scale(scale):
    group = torch.randn(5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected = cosine_kernel(group[None])
    assert torch.allclose(cosine_kernel(group[None] * scale), expected, atol=1e-6)
    # float32 input at the edges of its range: max-abs scaling keeps the squares from overflowing
    if 1e-30 <= scale <= 1e30:
        assert torch.allclose(cosine_kernel((group * scale).float()[None]), expected, atol=1e-5)


def test_group_of_two_is_rejected_with_its_index():
    padded, mask = pad_groups([torch.randn(4, 3), torch.randn(2, 3)])
    with pytest.raises(ValueError, match=r"groups \[1\]"):
        set_diversity(cosine_kernel(padded), mask)


def test_kernel_saturation_counts_member_pairs_above_threshold():
    kernel = torch.tensor([[1.0, 0.99, 0.2, 0.0], [0.99, 1.0, 0.96, 0.0], [0.2, 0.96, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert kernel_saturation(kernel[None], mask).item() == pytest.approx(4 / 6)
    assert kernel_saturation(kernel[None]).item() == pytest.approx(4 / 12)


def test_group_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.7] * 7])
    mask = torch.tensor([[True] * 4 + [False] * 3, [True] * 4 + [False] * 3, [True] * 7])
    advantages = group_advantages(rewards, mask)
    std = math.sqrt(4 * 0.25 / 3)  # unbiased
    assert torch.allclose(advantages[0, :4], torch.tensor([0.5, -0.5, 0.5, -0.5]) / (std + 1e-6))
    std = math.sqrt((0.75**2 + 3 * 0.25**2) / 3)
    assert torch.allclose(advantages[1, :4], torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-6))
    assert torch.equal(advantages[:2, 4:], torch.zeros(2, 3))  # padding
    # all-equal rewards: exactly zero, although seven 0.7s in float32 leave a mean with rounding noise
    assert torch.equal(advantages[2], torch.zeros(7))


def test_shaped_advantages_add_weight_times_marginals_on_members_only():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 5.0]])
    marginals = torch.tensor([[0.1, -0.2, 0.3, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    shaped = shaped_advantages(rewards, marginals, 0.5, mask)
    assert torch.allclose(shaped, group_advantages(rewards, mask) + 0.5 * marginals * mask)
    assert shaped[0, 3] == 0


# The paper's theorems, as properties over hypothesis-drawn kernels.


@settings(max_examples=150, deadline=None)
@given(kernels())
def test_theorem_4_2_exact_three_term_decomposition(kernel):
    size = kernel.shape[0]
    k = kernel.double().tolist()
    members = list(range(size))
    mass = [reference.local_mass(k, members, j) for j in members]
    g = lambda x: -math.log1p(x)  # noqa: E731
    marginals = marginals_of(kernel)
    for i in members:
        others = [j for j in members if j != i]
        t_self = g(mass[i]) / size
        t_norm = (1 / size - 1 / (size - 1)) * sum(g(mass[j]) for j in others)
        t_inter = sum(g(mass[j]) - g(reference.local_mass(k, others, j)) for j in others) / (size - 1)
        assert marginals[i].item() == pytest.approx(t_self + t_norm + t_inter, abs=1e-5)


@settings(max_examples=150, deadline=None)
@given(kernels(max_size=12), st.data())
def test_theorem_4_3_marginal_strictly_decreases_in_every_similarity(kernel, data):
    size = kernel.shape[0]
    i = data.draw(st.integers(0, size - 1))
    t = data.draw(st.integers(0, size - 1).filter(lambda t: t != i))
    assume(kernel[i, t] <= 0.95)
    raised = kernel.clone()
    raised[i, t] = raised[t, i] = data.draw(st.floats(kernel[i, t].item() + 0.05, 1.0))
    assert marginals_of(raised)[i] < marginals_of(kernel)[i]
    # and the slope is the theorem's (g'(m_i) + g'(m_t)) / (G (G - 1)), by central difference in float64
    k64 = kernel.double()
    mass = set_diversity(k64[None]).local_mass[0]
    slope = (-1 / (1 + mass[i]) - 1 / (1 + mass[t])) / (size * (size - 1))
    step = 1e-6
    up, down = k64.clone(), k64.clone()
    up[i, t] = up[t, i] = k64[i, t] + step
    down[i, t] = down[t, i] = k64[i, t] - step
    numeric = (set_diversity(up[None]).marginals[0, i] - set_diversity(down[None]).marginals[0, i]) / (2 * step)
    assert numeric.item() == pytest.approx(slope.item(), rel=1e-4, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(kernels(min_size=4, max_size=12), st.data())
def test_theorem_4_4_dominance_ordering(kernel, data):
    size = kernel.shape[0]
    r, c = data.draw(st.lists(st.integers(0, size - 1), min_size=2, max_size=2, unique=True))
    others = [j for j in range(size) if j not in (r, c)]
    strict = data.draw(st.sampled_from(others))
    kernel = kernel.clone()
    kernel[c, strict] = kernel[strict, c] = max(kernel[c, strict].item(), 0.1)
    for j in others:
        shrink = data.draw(st.floats(0.0, 0.9 if j == strict else 1.0))
        kernel[r, j] = kernel[j, r] = kernel[c, j] * shrink  # o_r no more similar than o_c to every o_j
    marginals = marginals_of(kernel)
    assert marginals[r] > marginals[c]


@settings(max_examples=100, deadline=None)
@given(st.integers(3, 16), st.integers(0, 2**31 - 1), st.data())
def test_exact_duplicates_get_the_lowest_credit_in_their_group(size, seed, data):
    # Distinct responses (spread-out embeddings) plus one exact copy of a member. Not a theorem for every
    # group: a copy adds 1 / (G - 1) to its pair's masses, and for G in the dozens with noisy embeddings
    # the natural spread of masses can exceed that (seen at G = 32 and 64). Theorem 4.4 is the general form.
    distinct = torch.randn(size - 1, 256, generator=torch.Generator().manual_seed(seed))
    copied = data.draw(st.integers(0, size - 2))
    group = torch.cat([distinct, distinct[copied : copied + 1]])
    marginals = set_diversity(cosine_kernel(group[None])).marginals[0]
    assert marginals[copied].item() == pytest.approx(marginals[-1].item(), abs=1e-6)
    rest = [j for j in range(size - 1) if j != copied]
    assert all(marginals[-1] < marginals[j] for j in rest)


def test_exact_duplicate_pair_is_lowest_for_any_third_member():
    # G = 3 is the case the dominance theorem settles for every kernel: check it across many
    generator = torch.Generator().manual_seed(3)
    for _ in range(200):
        a, other = torch.randn(2, 6, generator=generator)
        marginals = set_diversity(cosine_kernel(torch.stack([a, a, other])[None])).marginals[0]
        if torch.nn.functional.cosine_similarity(a, other, dim=0) < 1 - 1e-4:
            assert marginals[0] < marginals[2] and marginals[1] < marginals[2]


@settings(max_examples=100, deadline=None)
@given(kernels(max_size=16), st.randoms(use_true_random=False))
def test_permuting_a_group_permutes_its_marginals(kernel, rng):
    order = list(range(kernel.shape[0]))
    rng.shuffle(order)
    order = torch.tensor(order)
    permuted = kernel[order][:, order]
    assert torch.allclose(marginals_of(permuted), marginals_of(kernel)[order], atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    groups = [torch.randn(size, 32) for size in (3, 6, 16)]
    padded, mask = pad_groups(groups)
    cpu = set_diversity(cosine_kernel(padded), mask)
    gpu = set_diversity(cosine_kernel(padded.cuda()), mask.cuda())
    assert torch.allclose(gpu.marginals.cpu(), cpu.marginals, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([3, 4, 17, 128]),
    st.sampled_from([1e-30, 1e-8, 1.0, 1e8, 1e30]),
    st.integers(0, 2**31 - 1),
    st.data(),
)
def test_hostile_groups_give_finite_results(size, scale, seed, data):
    """Zero vectors, exact duplicates, huge and tiny norms, G = 3 and G = 128: always finite, never NaN."""
    generator = torch.Generator().manual_seed(seed)
    group = torch.randn(size, 16, generator=generator, dtype=torch.float64) * scale
    zeros = data.draw(st.integers(0, size))
    group[:zeros] = 0.0
    if size > zeros + 1:
        group[-1] = group[zeros]  # an exact duplicate of a non-zero member
    result = set_diversity(cosine_kernel(group[None]))
    rewards = torch.randn(1, size, generator=generator)
    shaped = shaped_advantages(rewards, result.marginals, 0.5)
    for tensor in (result.marginals, result.local_mass, result.set_score, shaped):
        assert torch.isfinite(tensor).all()

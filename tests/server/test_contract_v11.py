"""Contract v1.1 of POST /v1/diversity (keys, min_reward, kernel, normalize) through the real app, in-process,
with the real embedded model, checked against the literal definitions in tests/core/reference.py."""

import math

import pytest
import torch

from setpo_client.errors import SetpoAPIError
from setpo_client.keys import countdown_expression
from setpo_core.diversity import group_advantages
from tests.core import reference

# One Countdown puzzle (numbers 2 3 5 8, target 16), six answers: two spellings of one solution, two other
# solutions, a wrong answer and one cut off before its answer.
ANSWERS = [
    "plan : add 3 and 5 , then multiply by 2 . <answer> ( 3 + 5 ) * 2 </answer>",
    "plan : sum 5 and 3 , then times 2 . <answer> 2 * ( 5 + 3 ) </answer>",
    "plan : multiply 2 by 8 . <answer> 2 * 8 </answer>",
    "plan : take 8 away from 24 . <answer> 8 * 3 - 8 </answer>",
    "plan : subtract 2 from 5 , then times 8 . <answer> ( 5 - 2 ) * 8 </answer>",
    "plan : add 3 and 5 , then",
]
REWARDS = [1.0, 1.0, 1.0, 1.0, 0.1, 0.0]
KEYS = [countdown_expression(text) for text in ANSWERS]


def embedded(client, texts: list[str]) -> list[list[float]]:
    return [item.embedding for item in client.embeddings(texts).data]


def test_the_countdown_key_makes_two_spellings_one_solution():
    assert KEYS[0] == KEYS[1] == "countdown:mul(2,add(3,5))"
    assert len({KEYS[0], KEYS[2], KEYS[3], KEYS[4]}) == 4 and KEYS[5] is None


def test_a_v1_request_gets_exactly_the_v1_answer(inprocess, http):
    body = {"groups": [{"texts": ANSWERS, "rewards": REWARDS}], "weight": 0.5}
    answer = http.post("/v1/diversity", json=body).json()
    assert set(answer) == {"model", "groups", "usage"}
    assert set(answer["groups"][0]) == {"marginals", "local_mass", "set_score", "saturation", "advantages"}
    vectors = embedded(inprocess, ANSWERS)
    expected = reference.loo_marginals(reference.kernel_of(vectors))
    assert answer["groups"][0]["marginals"] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("kernel", ["embedding", "hybrid", "key"])
@pytest.mark.parametrize("normalize", ["none", "zscore"])
def test_scoped_marginals_and_bonus_match_the_literal_definition(inprocess, kernel, normalize):
    groups = [{"texts": ANSWERS, "rewards": REWARDS, **({"keys": KEYS} if kernel != "embedding" else {})}]
    answer = inprocess.diversity(groups, weight=0.4, min_reward=1.0, kernel=kernel, normalize=normalize)
    vectors = embedded(inprocess, ANSWERS)
    literal = {
        "embedding": reference.kernel_of(vectors),
        "hybrid": reference.hybrid_kernel_of(vectors, KEYS),
        "key": reference.key_kernel_of(KEYS),
    }[kernel]
    scored = [r >= 1.0 for r in REWARDS]
    marginals = reference.scoped_loo_marginals(literal, scored)
    normalised = reference.zscores(marginals, scored) if normalize == "zscore" else marginals
    group = answer.groups[0]
    assert answer.weight == 0.4 and group.scored == 4
    assert group.marginals == pytest.approx(marginals, abs=1e-5)
    assert group.bonus == pytest.approx([0.4 * z for z in normalised], abs=1e-4)
    assert group.bonus[4] == group.bonus[5] == 0  # the wrong and the unfinished answer earn nothing
    base = group_advantages(torch.tensor([REWARDS], dtype=torch.float64))[0].tolist()
    assert group.advantages == pytest.approx([a + b for a, b in zip(base, group.bonus)], abs=1e-9)
    # local mass and set score describe the whole group under the requested kernel
    members = list(range(len(ANSWERS)))
    assert group.set_score == pytest.approx(reference.set_score(literal, members), abs=1e-5)


def test_with_keys_the_spellings_of_one_solution_get_the_least_credit(inprocess):
    groups = [{"texts": ANSWERS, "rewards": REWARDS, "keys": KEYS}]
    for kernel in ("hybrid", "key"):
        bonus = inprocess.diversity(groups, weight=1.0, min_reward=1.0, kernel=kernel, normalize="zscore").groups[0]
        assert max(bonus.bonus[0], bonus.bonus[1]) < min(bonus.bonus[2], bonus.bonus[3]), kernel


def test_the_key_kernel_embeds_nothing_and_keys_alone_will_do(inprocess):
    with_texts = inprocess.diversity(
        [{"texts": ANSWERS, "rewards": REWARDS, "keys": KEYS}], weight=1.0, min_reward=1.0, kernel="key"
    )
    keys_only = inprocess.diversity([{"keys": KEYS, "rewards": REWARDS}], weight=1.0, min_reward=1.0, kernel="key")
    assert with_texts.usage.texts == keys_only.usage.texts == 0 and with_texts.usage.tokens == 0
    assert with_texts.groups[0] == keys_only.groups[0]


def test_a_group_with_fewer_than_three_scored_members_gets_zeros_and_says_so(inprocess):
    answer = inprocess.diversity(
        [{"texts": ANSWERS[:4] + ANSWERS[4:], "rewards": [1.0, 0.1, 0.0, 1.0, 0.1, 0.0]}],
        weight=2.0,
        min_reward=1.0,
        normalize="zscore",
    )
    group = answer.groups[0]
    assert group.scored == 0 and group.bonus == [0.0] * 6 and group.marginals == [0.0] * 6


def test_without_min_reward_every_member_is_scored_and_zscores_sum_to_zero(inprocess):
    group = inprocess.diversity([{"texts": ANSWERS}], weight=1.0, normalize="zscore").groups[0]
    assert group.scored == 6 and group.advantages is None
    assert math.fsum(group.bonus) == pytest.approx(0.0, abs=1e-5)
    assert statistics_std(group.bonus) == pytest.approx(1.0, abs=1e-3)


def statistics_std(values: list[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_a_hybrid_group_without_keys_is_plain_embedding(inprocess):
    plain = inprocess.diversity([{"texts": ANSWERS}], kernel="embedding", normalize="none").groups[0]
    hybrid = inprocess.diversity([{"texts": ANSWERS}], kernel="hybrid", normalize="none").groups[0]
    assert hybrid.marginals == plain.marginals


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"groups": [{"texts": ANSWERS}], "min_reward": 1.0}, "groups[0].rewards", "min_reward"),
        ({"groups": [{"texts": ANSWERS, "keys": KEYS[:5]}], "kernel": "hybrid"}, "groups[0]", "6 members but 5 keys"),
        ({"groups": [{"texts": ANSWERS}], "kernel": "key"}, "groups[0].keys", "give 'keys'"),
        ({"groups": [{"texts": ANSWERS, "keys": KEYS}]}, "groups[0].keys", "'hybrid' or 'key'"),
        ({"groups": [{"keys": KEYS}], "kernel": "hybrid"}, "groups[0]", "give 'texts' or 'embeddings'"),
        ({"groups": [{"texts": ANSWERS}], "kernel": "cosine"}, "kernel", "'embedding', 'hybrid' or 'key'"),
        ({"groups": [{"texts": ANSWERS}], "normalize": "rank"}, "normalize", "'none' or 'zscore'"),
        ({"groups": [{"texts": ANSWERS, "keys": [1, 2, 3, 4, 5, 6]}], "kernel": "key"}, "groups[0].keys[0]", "string"),
    ],
)
def test_contract_errors_are_4xx_that_name_the_field(http, body, param, words):
    response = http.post("/v1/diversity", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_the_client_sends_null_keys_and_refuses_an_unknown_kernel_before_sending(inprocess):
    answer = inprocess.diversity([{"keys": [None, None, "a"], "rewards": [1, 1, 1]}], kernel="key", min_reward=1)
    assert answer.groups[0].scored == 3  # three keys, two of them null: sent as null, not dropped
    with pytest.raises(ValueError):
        inprocess.diversity([{"texts": ANSWERS}], kernel="cosine")  # type: ignore[arg-type]


def test_info_says_which_contract_it_speaks(inprocess):
    assert inprocess.info().contract == "1.1"


def test_an_error_of_the_contract_is_a_setpo_api_error_with_the_servers_message(inprocess):
    with pytest.raises(SetpoAPIError) as error:
        inprocess.diversity([{"texts": ANSWERS}], min_reward=1.0)
    assert error.value.status == 422 and "rewards" in str(error.value)

"""The Countdown LM experiment's task and corpus, checked against the project's own scorer and solution key."""

import random
import re
from collections import Counter

from experiments.countdown_lm import corpus, puzzles
from experiments.countdown_lm.plan import FULL
from setpo_client.keys import countdown_expression
from setpo_trainer.rewards import countdown_reward, evaluate_expression

STEP = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def answer(expression: str) -> str:
    return f"<answer> {expression} </answer>"


def test_every_puzzle_has_at_least_three_modes_by_the_solution_key():
    for puzzle in puzzles.all_puzzles(seed=0):
        numbers, target = tuple(sorted(puzzle["numbers"])), puzzle["target"]
        grouped = puzzles.modes(numbers, target)
        assert {countdown_expression(answer(s.expression)) for group in grouped.values() for s in group} == set(grouped)
        assert len(grouped) == puzzle["modes"] >= 3
        families = {puzzles.family(group[0].expression) for group in grouped.values()}
        assert len(families) >= 3  # not only regroupings of one sum or product
        for group in grouped.values():  # the scorer agrees: each mode is a correct use of the numbers
            assert evaluate_expression(group[0].expression, puzzle["numbers"]) == target


def test_a_mode_is_the_expression_tree_not_its_spelling():
    assert puzzles.mode_of("( 3 + 5 ) * 2") == puzzles.mode_of("2 * ( 5 + 3 )")
    assert puzzles.mode_of("1 + ( 2 + 3 )") != puzzles.mode_of("( 1 + 2 ) + 3")  # ModeBench keeps the grouping
    assert puzzles.family("1 + ( 2 + 3 )") == puzzles.family("( 3 + 1 ) + 2")
    # the text is parenthesised as the steps compute it, so its mode is the tree the steps build
    for s in puzzles.solutions((2, 3, 17)):
        assert evaluate_expression(s.expression, [2, 3, 17]) == s.value


def test_splits_are_disjoint_by_puzzle_and_seeded():
    split = puzzles.splits(seed=0, validation=32, test=64)
    keys = {name: {(tuple(sorted(p["numbers"])), p["target"]) for p in rows} for name, rows in split.items()}
    assert len(keys["test"]) == 64 and len(keys["validation"]) == 32 and len(keys["train"]) > 2000
    assert (
        not keys["test"] & keys["validation"]
        and not keys["test"] & keys["train"]
        and not keys["validation"] & keys["train"]
    )
    assert puzzles.splits(seed=0, validation=32, test=64) == split


def test_corpus_mixes_correct_solutions_with_plausible_wrong_attempts():
    rows = puzzles.splits(seed=0, validation=4, test=4)["train"][:50]
    pairs = corpus.corpus(rows, per_puzzle=40, seed=0)
    by_prompt = {p["prompt"]: p for p in rows}
    rewards = [
        countdown_reward(response, by_prompt[prompt]["numbers"], by_prompt[prompt]["target"])
        for prompt, response in pairs
    ]
    assert set(rewards) == {1.0, 0.1}  # every attempt is well formed: right, or a valid expression that misses
    share = rewards.count(1.0) / len(rewards)
    assert abs(share - (1 - corpus.MISS_SHARE - corpus.SLIP_SHARE)) < 0.05
    assert corpus.corpus(rows, per_puzzle=40, seed=0) == pairs


def test_correct_answers_use_each_number_once_with_honest_non_negative_integer_steps():
    rows = puzzles.splits(seed=0, validation=4, test=4)["train"][:50]
    by_prompt = {p["prompt"]: p for p in rows}
    for prompt, response in corpus.corpus(rows, per_puzzle=20, seed=1):
        puzzle = by_prompt[prompt]
        if countdown_reward(response, puzzle["numbers"], puzzle["target"]) < 1:
            continue
        expression = response.split("<answer>")[1].split("</answer>")[0]
        assert sorted(map(int, re.findall(r"\d+", expression))) == sorted(puzzle["numbers"])
        steps = STEP.findall(response)
        assert len(steps) == len(puzzle["numbers"]) - 1 and int(steps[-1][3]) == puzzle["target"]
        for left, op, right, result in steps:
            assert evaluate_expression(f"{left} {op} {right}", [int(left), int(right)]) == int(result) >= 0


def test_correct_solutions_are_drawn_uniformly_over_modes_not_spellings():
    numbers, target = (1, 1, 20), 20  # 12 modes with 1 to 4 spellings each
    grouped = puzzles.modes(numbers, target)
    assert len(grouped) == 12 and max(map(len, grouped.values())) == 4 * min(map(len, grouped.values()))
    texts = corpus.attempts({"numbers": list(numbers), "target": target}, 6000, random.Random(0))
    drawn = Counter(countdown_expression(t) for t in texts if countdown_reward(t, list(numbers), target) == 1.0)
    expected = sum(drawn.values()) / len(grouped)
    assert set(drawn) == set(grouped) and all(abs(c - expected) < 0.2 * expected for c in drawn.values())


def test_responses_fit_the_rl_completion_length():
    rows = puzzles.splits(seed=0, validation=4, test=4)["train"][:200]
    longest = max(len(response.split()) + 1 for _, response in corpus.corpus(rows, per_puzzle=10, seed=0))  # + <eos>
    assert longest <= FULL.rl.max_completion_length and longest <= FULL.max_new_tokens


def test_a_response_states_its_plan_steps_and_answer():
    solution = next(s for s in puzzles.solutions((2, 3, 5)) if s.expression == "( 3 + 5 ) * 2")
    text = corpus.response(solution, random.Random(0))
    assert (
        text.startswith("plan : ")
        and "3 + 5 = 8 . 8 * 2 = 16 ." in text
        and text.endswith("<answer> ( 3 + 5 ) * 2 </answer>")
    )
    assert countdown_reward(text, [3, 5, 2], 16) == 1.0
    right = next(s for s in puzzles.solutions((2, 3, 5)) if s.expression == "2 * ( 3 + 5 )")
    assert "3 + 5 = 8 . 2 * 8 = 16 ." in corpus.response(right, random.Random(0))

"""Countdown reward on real reasoning-gym puzzles, and on wrong, malformed and hostile answers."""

import time

import pytest
import reasoning_gym

from setpo_trainer.rewards import countdown_reward, evaluate_expression, extract_expression


@pytest.fixture(scope="module")
def puzzles():
    return list(reasoning_gym.create_dataset("countdown", size=200, seed=7))


def test_the_datasets_own_solutions_score_one(puzzles):
    for puzzle in puzzles:
        meta = puzzle["metadata"]
        response = f"<think>let me try</think> <answer>{meta['expression']}</answer>"
        assert countdown_reward(response, meta["numbers"], meta["target"]) == 1.0


def test_wrong_malformed_and_missing_answers(puzzles):
    meta = puzzles[0]["metadata"]
    numbers, target = meta["numbers"], meta["target"]
    assert countdown_reward(f"<answer>{' + '.join(map(str, numbers))}</answer>", numbers, target) in (0.1, 1.0)
    assert countdown_reward("<answer>1 + 1</answer>", numbers, target) == 0.1  # formatted, wrong numbers
    assert countdown_reward(meta["expression"], numbers, target) == 0.0  # no <answer> tag
    assert countdown_reward("<answer></answer>", numbers, target) == 0.1
    assert countdown_reward("<answer>x</answer>", numbers, target, format_score=0.2) == 0.2


@pytest.mark.parametrize(
    "expr,numbers,expected",
    [
        ("(3 + 5) * 2", [2, 3, 5], 16),
        ("8 / (3 - 1)", [1, 3, 8], 4),
        ("7 / 2 * 2", [2, 2, 7], 7),  # exact fractions, no float rounding
        ("3 + 3", [3, 5], None),  # a number used twice, another not at all
        ("3 + 5", [3, 5, 2], None),  # a number left out
        ("4 / (2 - 2)", [4, 2, 2], None),  # division by zero
        ("9 ** 9 ** 9", [9, 9, 9], None),  # no powers: would never finish
        ("-3 + 5", [3, 5], 2),  # unary minus, as reasoning-gym's own solutions write it
        ("3 - -5", [3, 5], 8),
        ("3.5 + 1", [3, 1], None),  # integers only
        ("__import__('os').system('true')", [1], None),  # code is never run
        ("(" * 150 + "1" + ")" * 150, [1], None),  # too long to be an answer
        ("(((((((((1)))))))))", [1], 1),
    ],
)
def test_evaluate_expression_is_exact_safe_and_bounded(expr, numbers, expected):
    start = time.perf_counter()
    assert evaluate_expression(expr, numbers) == expected
    assert time.perf_counter() - start < 1.0


def test_extract_takes_the_last_answer_tag():
    assert extract_expression("<answer>1+2</answer> wait <answer> 3*4 </answer>") == "3*4"
    assert extract_expression("<answer>unclosed") is None

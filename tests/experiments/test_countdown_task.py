"""The Countdown LM experiment's task and corpus, checked against the project's own scorer."""

import random

from experiments.countdown_lm import corpus, puzzles
from setpo_trainer.rewards import countdown_reward, evaluate_expression


def test_every_puzzle_has_several_correct_expressions_by_the_scorer():
    for puzzle in puzzles.all_puzzles(seed=0):
        right = [s.expression for s in puzzles.solutions(tuple(puzzle["numbers"])) if s.value == puzzle["target"]]
        assert all(evaluate_expression(e, puzzle["numbers"]) == puzzle["target"] for e in right)
        assert len(puzzles.distinct(right)) == puzzle["solutions"] >= 4


def test_splits_are_disjoint_by_puzzle_and_seeded():
    split = puzzles.splits(seed=0, validation=32, test=64)
    keys = {name: {(tuple(sorted(p["numbers"])), p["target"]) for p in rows} for name, rows in split.items()}
    assert len(keys["test"]) == 64 and len(keys["validation"]) == 32 and len(keys["train"]) > 500
    assert (
        not keys["test"] & keys["validation"]
        and not keys["test"] & keys["train"]
        and not keys["validation"] & keys["train"]
    )
    assert puzzles.splits(seed=0, validation=32, test=64) == split


def test_corpus_mixes_correct_solutions_with_plausible_wrong_attempts():
    rows = puzzles.splits(seed=0, validation=4, test=4)["train"][:50]
    pairs = corpus.corpus(rows, per_puzzle=20, seed=0)
    by_prompt = {p["prompt"]: p for p in rows}
    rewards = [
        countdown_reward(response, by_prompt[prompt]["numbers"], by_prompt[prompt]["target"])
        for prompt, response in pairs
    ]
    assert set(rewards) == {1.0, 0.1}  # every attempt is well formed: right, or a valid expression that misses
    share = rewards.count(1.0) / len(rewards)
    assert abs(share - (1 - corpus.MISS_SHARE - corpus.SLIP_SHARE)) < 0.05
    assert corpus.corpus(rows, per_puzzle=20, seed=0) == pairs


def test_a_response_states_its_plan_steps_and_answer():
    solution = next(s for s in puzzles.solutions((3, 5, 2)) if s.expression == "( 3 + 5 ) * 2")
    text = corpus.response(solution, random.Random(0))
    assert (
        text.startswith("plan : ")
        and "3 + 5 = 8 . 8 * 2 = 16 ." in text
        and text.endswith("<answer> ( 3 + 5 ) * 2 </answer>")
    )
    assert countdown_reward(text, [3, 5, 2], 16) == 1.0

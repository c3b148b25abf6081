"""What the model writes, and the synthetic pretraining corpus that gives it a broad prior.

A response is a short worded plan, the two arithmetic steps, and the answer:

    plan : add 3 and 5 , then multiply by 2 . 3 + 5 = 8 . 8 * 2 = 16 . <answer> ( 3 + 5 ) * 2 </answer>

The worded plan is there for the embedder: a bare expression such as "(3+5)*2" looks like every other to a
sentence embedder, while "add 3 and 5, then multiply by 2" and "multiply 2 by 9, then subtract 2" read as
different plans. Each operation has a few wordings, drawn at random, so the corpus has several forms of every
solution. The corpus mixes correct solutions (every correct expression of the puzzle, uniformly: the broad prior)
with plausible wrong attempts: a valid expression over the numbers that misses the target (honest arithmetic),
and the same with an arithmetic slip that claims to reach it.
"""

import random

from experiments.countdown_lm.puzzles import Solution, solutions

# How the first step is worded; {l} and {r} are its numbers.
FIRST = {
    "+": ["add {l} and {r}", "sum {l} and {r}", "{l} plus {r}"],
    "-": ["subtract {r} from {l}", "take {r} away from {l}", "{l} minus {r}"],
    "*": ["multiply {l} by {r}", "{l} times {r}", "take the product of {l} and {r}"],
    "/": ["divide {l} by {r}", "{l} over {r}", "split {l} into {r} parts"],
}
# The second step when the first result is on its left ({n}: the number left) ...
THEN_LEFT = {
    "+": ["add {n}", "plus {n}"],
    "-": ["subtract {n}", "minus {n}"],
    "*": ["multiply by {n}", "times {n}"],
    "/": ["divide by {n}", "over {n}"],
}
# ... and when it is on its right: a o (b o c).
THEN_RIGHT = {
    "+": ["add it to {n}", "add {n}"],
    "-": ["subtract it from {n}", "take it away from {n}"],
    "*": ["multiply {n} by it", "scale {n} by it"],
    "/": ["divide {n} by it", "split {n} by it"],
}

# Shares of the corpus; the rest are correct solutions. Chosen so the base model solves a modest share of
# unseen puzzles on its first try (pass@1 ~ 10-40 %) while most puzzles are solved within 64 tries.
MISS_SHARE = 0.35
SLIP_SHARE = 0.15


def response(solution: Solution, rng: random.Random, claimed: int | None = None) -> str:
    """The text for one solution; `claimed` replaces the final result (an arithmetic slip)."""
    (l1, o1, r1, x), (l2, o2, r2, y) = solution.steps
    first = rng.choice(FIRST[o1]).format(l=l1, r=r1)
    then = rng.choice(THEN_LEFT[o2]).format(n=r2) if solution.first_on_left else rng.choice(THEN_RIGHT[o2]).format(n=l2)
    final = y if claimed is None else claimed
    return (
        f"plan : {first} , then {then} . {l1} {o1} {r1} = {x} . {l2} {o2} {r2} = {final} . "
        f"<answer> {solution.expression} </answer>"
    )


def attempt(puzzle: dict, rng: random.Random) -> str:
    """One corpus response for the puzzle: correct, a miss, or a slip, in the shares above."""
    candidates = solutions(tuple(puzzle["numbers"]))
    right = [s for s in candidates if s.value == puzzle["target"]]
    wrong = [s for s in candidates if s.value != puzzle["target"]]
    draw = rng.random()
    if draw < MISS_SHARE:
        return response(rng.choice(wrong), rng)
    if draw < MISS_SHARE + SLIP_SHARE:
        return response(rng.choice(wrong), rng, claimed=puzzle["target"])
    return response(rng.choice(right), rng)


def corpus(puzzles: list[dict], per_puzzle: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, response) pairs: `per_puzzle` attempts for each puzzle, in a seeded random order."""
    rng = random.Random(seed)
    pairs = [(p["prompt"], attempt(p, rng)) for p in puzzles for _ in range(per_puzzle)]
    rng.shuffle(pairs)
    return pairs

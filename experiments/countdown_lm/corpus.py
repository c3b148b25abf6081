"""What the model writes, and the synthetic pretraining corpus that gives it a broad prior.

A response is a short worded plan, the two arithmetic steps, and the answer:

    plan : add 3 and 5 , then multiply by 2 . 3 + 5 = 8 . 8 * 2 = 16 . <answer> ( 3 + 5 ) * 2 </answer>

The worded plan is there for the embedder: a bare expression such as "(3+5)*2" looks like every other to a
sentence embedder, while "add 3 and 5, then multiply by 2" and "multiply 2 by 9, then subtract 2" read as
different plans. Each operation has a few wordings, drawn at random, so the corpus has several forms of every
solution. The corpus mixes correct solutions with plausible wrong attempts: a valid expression over the numbers
that misses the target (honest arithmetic), and the same with an arithmetic slip that claims to reach it. A
correct solution is drawn uniformly over the puzzle's modes, then over that mode's spellings: the broad prior
keeps every mode alive, not only those with many spellings.
"""

import random

from experiments.countdown_lm.puzzles import Solution, Step, modes, solutions

# How a step on two given numbers is worded; {l} and {r} are its numbers.
FIRST = {
    "+": ["add {l} and {r}", "sum {l} and {r}", "{l} plus {r}"],
    "-": ["subtract {r} from {l}", "take {r} away from {l}", "{l} minus {r}"],
    "*": ["multiply {l} by {r}", "{l} times {r}", "take the product of {l} and {r}"],
    "/": ["divide {l} by {r}", "{l} over {r}", "split {l} into {r} parts"],
}
# A later step with the running result on its left ({n}: the given number) ...
THEN_LEFT = {
    "+": ["add {n}", "plus {n}"],
    "-": ["subtract {n}", "minus {n}"],
    "*": ["multiply by {n}", "times {n}"],
    "/": ["divide by {n}", "over {n}"],
}
# ... and on its right: n o (result).
THEN_RIGHT = {
    "+": ["add it to {n}", "add {n}"],
    "-": ["subtract it from {n}", "take it away from {n}"],
    "*": ["multiply {n} by it", "scale {n} by it"],
    "/": ["divide {n} by it", "split {n} by it"],
}
# Shares of the corpus; the rest are correct solutions. Chosen so the base model solves a modest share of
# unseen puzzles on its first try (pass@1 ~ 10-40 %) while most puzzles are solved within 64 tries.
MISS_SHARE = 0.25
SLIP_SHARE = 0.10


def wording(step: Step, rng: random.Random) -> str:
    if step.form == "new":
        return rng.choice(FIRST[step.op]).format(l=step.left, r=step.right)
    if step.form == "left":
        return "then " + rng.choice(THEN_LEFT[step.op]).format(n=step.right)
    return "then " + rng.choice(THEN_RIGHT[step.op]).format(n=step.left)


def response(solution: Solution, rng: random.Random, claimed: int | None = None) -> str:
    """The text for one solution; `claimed` replaces the final result (an arithmetic slip)."""
    plan = " , ".join(wording(step, rng) for step in solution.steps)
    *early, last = solution.steps
    written = [f"{s.left} {s.op} {s.right} = {s.result}" for s in early]
    written.append(f"{last.left} {last.op} {last.right} = {last.result if claimed is None else claimed}")
    return f"plan : {plan} . {' . '.join(written)} . <answer> {solution.expression} </answer>"


def attempts(puzzle: dict, count: int, rng: random.Random) -> list[str]:
    """`count` corpus responses for the puzzle, each correct, a miss, or a slip, in the shares above."""
    numbers = tuple(sorted(puzzle["numbers"]))
    by_mode = modes(numbers, puzzle["target"])
    names = sorted(by_mode)
    wrong = [s for s in solutions(numbers) if s.value != puzzle["target"]]
    drawn = []
    for _ in range(count):
        draw = rng.random()
        if draw < MISS_SHARE + SLIP_SHARE:
            drawn.append(response(rng.choice(wrong), rng, puzzle["target"] if draw >= MISS_SHARE else None))
        else:
            drawn.append(response(rng.choice(by_mode[rng.choice(names)]), rng))
    return drawn


def corpus(puzzles: list[dict], per_puzzle: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, response) pairs: `per_puzzle` attempts for each puzzle, in a seeded random order."""
    rng = random.Random(seed)
    pairs = [(p["prompt"], text) for p in puzzles for text in attempts(p, per_puzzle, rng)]
    rng.shuffle(pairs)
    return pairs

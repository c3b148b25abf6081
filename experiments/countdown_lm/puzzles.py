"""The task: 3 numbers from 1-9 and a target; write an expression that uses each number once with + - * /.

Every puzzle is kept only if it has several distinct correct expressions (the experiment is about keeping
more than one alive), counted the way setpo-eval counts them: the expression text without spaces. Splits are
by puzzle: a puzzle (its numbers as a multiset, and its target) is in exactly one of train, validation, test.
"""

import functools
import itertools
import json
import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

OPERATORS = "+-*/"
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class Solution:
    """One way to combine three numbers in two steps: `first` = x o1 y, then the final step with `last`."""

    expression: str  # as written in the answer, tokens separated by spaces: "( 3 + 5 ) * 2"
    steps: tuple[tuple[int, str, int, int], ...]  # (left, op, right, result) for each of the two steps
    value: int
    first_on_left: bool  # (a o b) o c: the first step's result is the final step's left operand


def apply(left: int, op: str, right: int) -> int | None:
    """The step's result when it is a non-negative integer (what the corpus writes), else None."""
    value = {
        "+": lambda: Fraction(left + right),
        "-": lambda: Fraction(left - right),
        "*": lambda: Fraction(left * right),
        "/": lambda: Fraction(left, right) if right else None,
    }[op]()
    if value is None or value < 0 or value.denominator != 1:
        return None
    return int(value)


def render(left: str, op: str, right: str, left_op: str | None, right_op: str | None) -> str:
    """left op right with only the parentheses precedence needs (so "3 * 5 + 2", but "( 3 + 5 ) * 2")."""
    if left_op and PRECEDENCE[left_op] < PRECEDENCE[op]:
        left = f"( {left} )"
    if right_op and (PRECEDENCE[right_op] < PRECEDENCE[op] or (PRECEDENCE[right_op] == PRECEDENCE[op] and op in "-/")):
        right = f"( {right} )"
    return f"{left} {op} {right}"


@functools.cache  # the corpus asks for the same puzzle's solutions tens of times
def solutions(numbers: tuple[int, int, int]) -> list[Solution]:
    """Every two-step expression over the numbers whose intermediate results are non-negative integers."""
    found = []
    for a, b, c in set(itertools.permutations(numbers)):
        for o1, o2 in itertools.product(OPERATORS, repeat=2):
            x = apply(a, o1, b)  # (a o1 b) o2 c
            y = apply(x, o2, c) if x is not None else None
            if y is not None:
                found.append(
                    Solution(render(f"{a} {o1} {b}", o2, str(c), o1, None), ((a, o1, b, x), (x, o2, c, y)), y, True)
                )
            x = apply(b, o2, c)  # a o1 (b o2 c)
            y = apply(a, o1, x) if x is not None else None
            if y is not None:
                found.append(
                    Solution(render(str(a), o1, f"{b} {o2} {c}", None, o2), ((b, o2, c, x), (a, o1, x, y)), y, False)
                )
    return sorted(found, key=lambda s: (s.expression, s.steps))


def distinct(expressions) -> set[str]:
    """setpo-eval's notion of distinct expressions: the text without whitespace."""
    return {"".join(e.split()) for e in expressions}


def all_puzzles(seed: int, min_solutions: int = 4, targets: range = range(10, 100)) -> list[dict]:
    """Every puzzle (3 numbers from 1-9 as a multiset, a target in `targets`) with at least `min_solutions`
    distinct correct expressions, in a seeded random order, numbers shown in a seeded random order (~740)."""
    rng = random.Random(seed)
    puzzles = []
    for numbers in itertools.combinations_with_replacement(range(1, 10), 3):
        by_value: dict[int, list[str]] = {}
        for s in solutions(numbers):
            by_value.setdefault(s.value, []).append(s.expression)
        for target in sorted(by_value):
            count = len(distinct(by_value[target]))
            if target in targets and count >= min_solutions:
                puzzles.append({"numbers": rng.sample(numbers, 3), "target": target, "solutions": count})
    rng.shuffle(puzzles)
    return puzzles


def splits(seed: int, validation: int, test: int) -> dict[str, list[dict]]:
    """Disjoint splits by puzzle (train: all the rest), each row with an id and the prompt the model sees."""
    puzzles = all_puzzles(seed)
    parts = {
        "test": puzzles[:test],
        "validation": puzzles[test : test + validation],
        "train": puzzles[test + validation :],
    }
    return {
        name: [{"id": f"{name}-{i}", "prompt": prompt(p), **p} for i, p in enumerate(rows)]
        for name, rows in parts.items()
    }


def prompt(puzzle: dict) -> str:
    """What the model is given: short, no chat template (its tokenizer has none). Ends where the answer starts."""
    return f"numbers {' '.join(map(str, puzzle['numbers']))} target {puzzle['target']} :"


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path

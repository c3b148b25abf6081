"""The task: 3 numbers from 1-20 and a target in 10-99; write an expression that uses each number once with + - * /.

A puzzle is kept only if it has at least 3 correct solution *modes*: distinct solutions under ModeBench's
identity, the normalised executed expression tree (`setpo_client.keys.countdown_expression`: "( 3 + 5 ) * 2" and
"2 * ( 5 + 3 )" are one mode, "3 * 2 + 2" another). The experiment is about keeping more than one mode alive, so
a puzzle with one mode cannot show it. Modes that only regroup one sum or product ("( 1 + 2 ) + 3" and
"1 + ( 2 + 3 )") count as ModeBench counts them, but a puzzle must also have 3 solutions when those are merged
(`family`), so that its diversity is not bracketing alone. Numbers up to 20 rather than 9 give enough such
puzzles; four numbers would too, but a small model pretrained on a CPU barely solves them. Splits are by puzzle:
a puzzle (its numbers as a multiset, and its target) is in exactly one of train, validation, test.
"""

import ast
import functools
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

from setpo_client.keys import countdown_expression

OPERATORS = "+-*/"
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
MAX_VALUE = 99  # every step gives 0..99: a small model learns that arithmetic, and each is one token
COUNT, LARGEST = 3, 20  # three numbers from 1 to 20
MIN_MODES = 3  # also the least number of families (modes with regroupings merged) a puzzle must have
TARGETS = range(10, 100)


@dataclass(frozen=True)
class Step:
    """One written step, `left op right = result`; `form` says where its operands come from, for the wording:
    "new" (two given numbers), "left"/"right" (the previous result, left or right of a given number)."""

    left: int
    op: str
    right: int
    result: int
    form: str


@dataclass(frozen=True)
class Solution:
    """One way to combine the numbers step by step, with its answer as written (tokens separated by spaces)."""

    expression: str  # "( 3 + 5 ) * 2"
    steps: tuple[Step, ...]
    value: int

    @property
    def mode(self) -> str:
        return mode_of(self.expression)


def mode_of(expression: str) -> str:
    """ModeBench's solution identity of an answer, the same key SetPO's key kernel and the evaluation use."""
    return countdown_expression(f"<answer> {expression} </answer>")


def family(expression: str) -> str:
    """The mode with regroupings of + and of * merged: "1 + ( 2 + 3 )" and "( 3 + 1 ) + 2" are one family."""
    return _flat(ast.parse(expression, mode="eval").body)


def _flat(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    name = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}[type(node.op)]
    if name in ("sub", "div"):
        return f"{name}({_flat(node.left)},{_flat(node.right)})"
    terms, stack = [], [node]
    while stack:  # the operands of a run of the same commutative operator, in any grouping
        n = stack.pop()
        if isinstance(n, ast.BinOp) and type(n.op) is type(node.op):
            stack += [n.left, n.right]
        else:
            terms.append(_flat(n))
    return f"{name}({','.join(sorted(terms))})"


def apply(left: int, op: str, right: int) -> int | None:
    """The step's result when it is a non-negative integer up to MAX_VALUE (what the corpus writes), else None."""
    if op == "+":
        value = left + right
    elif op == "-":
        value = left - right
    elif op == "*":
        value = left * right
    elif right == 0 or left % right:
        return None
    else:
        value = left // right
    return value if 0 <= value <= MAX_VALUE else None


def render(left: tuple[str, str | None], op: str, right: tuple[str, str | None]) -> tuple[str, str]:
    """(text, top operator) of left op right, parenthesised so that the text parses back to this very tree
    (its mode is the tree's): "3 * 5 + 2", "( 3 + 5 ) * 2", "2 + ( 3 + 5 )"."""
    (ltext, lop), (rtext, rop) = left, right
    if lop and PRECEDENCE[lop] < PRECEDENCE[op]:
        ltext = f"( {ltext} )"
    if rop and PRECEDENCE[rop] <= PRECEDENCE[op]:
        rtext = f"( {rtext} )"
    return f"{ltext} {op} {rtext}", op


def leaf(n: int) -> tuple[str, None]:
    return str(n), None


def chains(order: tuple[int, ...], ops: tuple[str, ...]):
    """(a o b) with c, then with d ...: the running result on the left or on the right of each next number."""
    x = apply(order[0], ops[0], order[1])
    if x is not None:
        yield from grow(
            render(leaf(order[0]), ops[0], leaf(order[1])),
            (Step(order[0], ops[0], order[1], x, "new"),),
            order[2:],
            ops[1:],
        )


def grow(expression: tuple[str, str], steps: tuple[Step, ...], numbers: tuple[int, ...], ops: tuple[str, ...]):
    """Every way to finish a chain: the next number joins the running result on either side."""
    if not numbers:
        yield Solution(expression[0], steps, steps[-1].result)
        return
    x, n, op = steps[-1].result, numbers[0], ops[0]
    for on_left in (True, False):
        y = apply(x, op, n) if on_left else apply(n, op, x)
        if y is not None:
            step = Step(x, op, n, y, "left") if on_left else Step(n, op, x, y, "right")
            text = render(expression, op, leaf(n)) if on_left else render(leaf(n), op, expression)
            yield from grow(text, (*steps, step), numbers[1:], ops[1:])


@functools.cache  # the corpus asks for the same numbers' solutions many times
def solutions(numbers: tuple[int, ...]) -> list[Solution]:
    """Every expression over the numbers, built one step at a time, whose steps give integers in 0..MAX_VALUE."""
    found = set()
    for order in set(itertools.permutations(numbers)):
        for ops in itertools.product(OPERATORS, repeat=len(numbers) - 1):
            found.update(chains(order, ops))
    return sorted(found, key=lambda s: (s.expression, s.steps))


def modes(numbers: tuple[int, ...], target: int) -> dict[str, list[Solution]]:
    """The puzzle's correct solutions grouped by mode (each mode: every spelling the corpus can write of it)."""
    grouped: dict[str, list[Solution]] = {}
    for s in solutions(numbers):
        if s.value == target:
            grouped.setdefault(s.mode, []).append(s)
    return grouped


@functools.cache  # the tests and the experiment ask more than once
def catalogue(count: int, largest: int) -> tuple[tuple[tuple[int, ...], int, int], ...]:
    """(numbers, target, modes) of every puzzle over `count` numbers from 1 to `largest` (a multiset) and a target
    in TARGETS with at least MIN_MODES correct modes and as many families."""
    found = []
    for numbers in itertools.combinations_with_replacement(range(1, largest + 1), count):
        by_target: dict[int, set[str]] = {}
        for s in solutions(numbers):
            if s.value in TARGETS:
                by_target.setdefault(s.value, set()).add(s.expression)
        for target, expressions in sorted(by_target.items()):
            kinds = len({mode_of(e) for e in expressions})
            if kinds >= MIN_MODES and len({family(e) for e in expressions}) >= MIN_MODES:
                found.append((numbers, target, kinds))
    return tuple(found)


def all_puzzles(seed: int) -> list[dict]:
    """The catalogue's puzzles in a seeded random order, each one's numbers shown in a seeded random order."""
    rng = random.Random(seed)
    puzzles = [{"numbers": rng.sample(n, len(n)), "target": t, "modes": m} for n, t, m in catalogue(COUNT, LARGEST)]
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

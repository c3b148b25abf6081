"""setpo-eval counts Countdown solutions, not spellings: distinct correct solutions, the shares with 2+ and 3+, and
ModeBench's PCMD with its support, checked against a slow literal reference written here (and against the `modebench`
package itself when it is installed)."""

import ast
import json
import math
import random
import re
from collections import Counter
from itertools import combinations, permutations, product

import pytest

from setpo_trainer.eval import cli, datasets, metrics
from setpo_trainer.rewards.countdown import evaluate_expression


def answer(expression: str) -> str:
    return f"thinking... <answer> {expression} </answer>"


def countdown(numbers: tuple[int, ...], target: int) -> datasets.Problem:
    return datasets.Problem("p", "countdown", "", numbers=numbers, target=target)


# --- the reference: slow and literal -------------------------------------------------------------------------------


def swaps(node: ast.AST) -> set[str]:
    """Every tree reachable from `node` by swapping the two operands of any of its + and * nodes, written out."""
    if isinstance(node, ast.Constant):
        return {str(node.value)}
    assert isinstance(node, ast.BinOp)
    name = type(node.op).__name__
    trees = set()
    for left, right in product(swaps(node.left), swaps(node.right)):
        trees.add(f"{name}({left},{right})")
        if name in ("Add", "Mult"):
            trees.add(f"{name}({right},{left})")
    return trees


def same_solution(a: str, b: str) -> bool:
    """ModeBench's identity said literally: the same executed tree, up to the order of the operands of + and *."""
    return bool(swaps(ast.parse(a, mode="eval").body) & swaps(ast.parse(b, mode="eval").body))


def reference_figures(problem: datasets.Problem, responses: list[str]) -> tuple[int, float | None]:
    """(distinct correct solutions, PCMD) of one puzzle: classes of correct expressions under same_solution, and the
    share of all unordered pairs of correct samples that are different solutions."""
    correct = [re.findall(r"<answer>(.*?)</answer>", r)[-1].strip() for r in responses if problem.reward(r) == 1.0]
    classes: list[str] = []
    for expression in correct:
        if not any(same_solution(expression, seen) for seen in classes):
            classes.append(expression)
    pairs = list(combinations(correct, 2))
    pcmd = sum(not same_solution(a, b) for a, b in pairs) / len(pairs) if pairs else None
    return len(classes), pcmd


def reference_summary(per_puzzle: list[tuple[int, float | None]]) -> dict:
    """ModeBench's cell summary, from its definitions: PCMD's mean over the puzzles that define it, each weighing the
    same; support = how many define it, of how many; reportable from 30; standard error = sample std / sqrt(count)."""
    distinct = [d for d, _ in per_puzzle]
    defined = [p for _, p in per_puzzle if p is not None]
    mean = sum(defined) / len(defined) if defined else 0.0
    spread = math.sqrt(sum((p - mean) ** 2 for p in defined) / (len(defined) - 1)) if len(defined) > 1 else None
    return {
        "solutions_mean": sum(distinct) / len(distinct),
        "solutions_share_2": sum(d >= 2 for d in distinct) / len(distinct),
        "solutions_share_3": sum(d >= 3 for d in distinct) / len(distinct),
        "pcmd": mean if defined else None,
        "pcmd_defined_prompts": len(defined),
        "pcmd_prompts": len(per_puzzle),
        "pcmd_support": len(defined) / len(per_puzzle),
        "pcmd_reportable": len(defined) >= 30,
        "pcmd_standard_error": spread / math.sqrt(len(defined)) if spread is not None else None,
    }


# --- random puzzles whose samples respell, regroup and miss ---------------------------------------------------------


def every_expression(numbers: tuple[int, ...]) -> list[str]:
    """All expressions over three numbers: each order, each pair of operators, both groupings."""
    found = []
    for (a, b, c), (x, y) in product(permutations(numbers), product("+-*/", repeat=2)):
        found += [f"({a} {x} {b}) {y} {c}", f"{a} {x} ({b} {y} {c})"]
    return found


def random_puzzles(seed: int, count: int, n: int) -> list[tuple[datasets.Problem, list[str]]]:
    """Puzzles whose target many expressions hit, with n samples each: correct ones drawn from every spelling of every
    correct tree (so the same solution comes respelt and different solutions come too), wrong ones and junk. How often
    a puzzle is solved varies, so some puzzles have fewer than 2 correct samples and leave PCMD undefined."""
    rng = random.Random(seed)
    puzzles = []
    for i in range(count):
        numbers = tuple(rng.randint(1, 12) for _ in range(3))
        expressions = every_expression(numbers)
        values = [v for v in (_value(numbers, e) for e in expressions) if v is not None]
        target = max(sorted(set(values)), key=values.count)  # the value most expressions reach: several solutions
        problem = datasets.Problem(f"p{i}", "countdown", "", numbers=numbers, target=target)
        correct = [e for e in expressions if problem.reward(answer(e)) == 1.0]
        solved, favourite = rng.choice([0.0, 0.1, 0.5, 0.9]), rng.choice(correct)
        responses = []
        for _ in range(n):
            roll = rng.random()
            if roll < solved:  # half of the correct ones the puzzle's favourite: solutions repeat, as a policy's do
                responses.append(answer(_respace(rng, rng.choice([favourite, rng.choice(correct)]))))
            elif roll < 0.95:
                responses.append(answer(rng.choice(expressions)))
            else:
                responses.append("I cannot solve this.")
        puzzles.append((problem, responses))
    return puzzles


def _value(numbers: tuple[int, ...], expression: str) -> int | None:
    """The expression's value when it is a whole number a target could be (1-200), else None."""
    value = evaluate_expression(expression, list(numbers))
    return int(value) if value is not None and value.denominator == 1 and 1 <= value <= 200 else None


def _respace(rng: random.Random, expression: str) -> str:
    """Another spelling of the same text: spaces dropped or doubled."""
    return rng.choice([expression.replace(" ", ""), expression.replace(" ", "  "), expression])


# --- the tests ------------------------------------------------------------------------------------------------------


def test_respelt_and_reordered_answers_are_one_solution():
    problem = countdown((3, 5, 2), 16)
    responses = [answer("(3+5)*2"), answer("(5+3)*2"), answer("2*(3+5)")]
    solutions = [[problem.solution(r) for r in responses]]
    assert metrics.distinct_correct([[problem.correct_answer(r) for r in responses]]) == [3]  # today's spellings
    figures = metrics.solution_diversity(solutions)
    assert figures["solutions_mean"] == 1 and figures["solutions_share_2"] == 0.0
    assert figures["pcmd"] == 0.0  # three correct samples, every pair the same solution
    assert figures["pcmd_defined_prompts"] == 1 and figures["pcmd_prompts"] == 1 and not figures["pcmd_reportable"]


def test_different_trees_are_different_solutions_and_wrong_answers_none():
    problem = countdown((2, 3, 4), 14)
    assert problem.solution(answer("2 * (3 + 4)")) != problem.solution(answer("3 * 4 + 2"))
    assert problem.solution(answer("4*3 + 2")) == problem.solution(answer("2 + 3*4"))
    assert problem.solution(answer("2 + 3 + 4")) is None and problem.solution("no answer") is None
    # ModeBench keeps the grouping of a sum: (1+2)+3 and 1+(2+3) are two executed trees
    sums = countdown((1, 2, 3), 6)
    assert sums.solution(answer("(1+2)+3")) != sums.solution(answer("1+(2+3)"))
    assert datasets.Problem("m", "math", "q", "4").solution("\\boxed{4}") is None  # no solution key for math


@pytest.mark.parametrize(
    "counts,expected",
    [({"A": 2, "B": 1}, 2 / 3), ({"A": 3}, 0.0), ({"A": 1, "B": 1, "C": 1}, 1.0), ({"A": 1}, None), ({}, None)],
)
def test_pcmd_hand_computed(counts, expected):
    """ModeBench's own examples: {A: 2, B: 1} has 2 of its 3 pairs different; fewer than 2 correct is undefined."""
    assert metrics.pcmd(Counter(counts)) == (None if expected is None else pytest.approx(expected))


def test_reportable_from_thirty_defined_prompts_and_the_shares():
    two: list[str | None] = ["a", "b", None]
    one: list[str | None] = ["a", None, None]
    none: list[str | None] = [None, None, None]
    assert metrics.solution_diversity([two] * 29 + [one])["pcmd_reportable"] is False
    figures = metrics.solution_diversity([two] * 30 + [one, none])
    assert figures["pcmd_reportable"] is True and figures["pcmd_defined_prompts"] == 30
    assert figures["pcmd_support"] == pytest.approx(30 / 32) and figures["pcmd"] == 1.0
    assert figures["pcmd_standard_error"] == 0.0  # every defined prompt the same: no spread
    assert figures["solutions_share_2"] == pytest.approx(30 / 32) and figures["solutions_share_3"] == 0.0
    assert metrics.solution_diversity([["a", "b", "c"], ["a", "a", "b"]])["solutions_share_3"] == 0.5


def test_setpo_eval_figures_equal_the_literal_reference(tmp_path):
    puzzles = random_puzzles(seed=1, count=45, n=12)
    dataset, samples = tmp_path / "puzzles.jsonl", tmp_path / "samples.jsonl"
    dataset.write_text(
        "".join(json.dumps({"id": p.id, "numbers": p.numbers, "target": p.target}) + "\n" for p, _ in puzzles)
    )
    samples.write_text(
        "".join(json.dumps({"problem_id": p.id, "response": r}) + "\n" for p, responses in puzzles for r in responses)
    )
    args = ["run", "--dataset", str(dataset), "--kind", "countdown", "--samples", str(samples)]
    summary = cli.run(cli.parse_args(args + ["--method", "m", "--out", str(tmp_path / "out")]))

    expected = reference_summary([reference_figures(p, responses) for p, responses in puzzles])
    assert 0 < expected["pcmd_defined_prompts"] < 45 and expected["solutions_share_3"] > 0  # the data has every case
    for key, value in expected.items():
        assert summary["diversity"][key] == (value if isinstance(value, bool) else pytest.approx(value)), key
    # the spelling count stays beside it, and counts more
    assert summary["diversity"]["distinct_correct_mean"] > summary["diversity"]["solutions_mean"]
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert all((row["solution"] is None) == (not row["correct"]) for row in rows)


def test_agrees_with_the_modebench_package():
    """The oracle: ModeBench's own verifier, identity and cell summary on the same samples (skipped where the
    `modebench` package is not installed)."""
    modebench = pytest.importorskip("modebench")
    from modebench.metrics import cell_summary

    prompt_results, ours = [], []
    for problem, responses in random_puzzles(seed=2, count=60, n=12):
        spec = {"verifier": "countdown", "numbers": list(problem.numbers), "target": problem.target}
        keys = []
        for response in responses:
            expression = re.findall(r"<answer>(.*?)</answer>", response)
            keys.append(modebench.validated_modebench_outcome_key(expression[-1] if expression else "", spec))
        assert [problem.solution(r) for r in responses] == keys  # same verdict and the same key string
        ours.append(keys)
        attempts = [{"verified": key is not None, "canonical_key": key} for key in keys]
        prompt_results.append({"draws": [{"attempts": attempts}]})
    theirs, figures = cell_summary(prompt_results), metrics.solution_diversity(ours)
    assert figures["pcmd"] == pytest.approx(theirs["d_mode"])
    assert figures["pcmd_standard_error"] == pytest.approx(theirs["standard_error"])
    for field in ("defined_prompts", "prompts", "support", "reportable"):
        assert figures[f"pcmd_{field}"] == theirs[field], field

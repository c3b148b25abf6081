"""Countdown (TinyZero-style, as in the paper): reach the target with + - * / over the given numbers, each
used exactly once. The answer is the last <answer>...</answer>; reward 1.0 when correct, `format_score`
(the paper's 0.1 format term) when an answer is given but invalid or wrong, 0.0 when there is none.

Expressions are never eval()'d: they are parsed with `ast`, only integer literals, the four operators, unary
minus and parentheses are accepted, and arithmetic is exact (fractions), so no input can run code, raise to a power
or grow without bound.
"""

import ast
import re
from collections import Counter
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200  # a valid answer over 6 two-digit numbers is ~30 characters
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def extract_expression(response: str) -> str | None:
    found = _ANSWER.findall(response)
    return found[-1].strip() if found else None


def evaluate_expression(expr: str, numbers: list[int]) -> Fraction | None:
    """The exact value of expr, or None unless it uses each of `numbers` exactly once and only + - * / ( )."""
    if len(expr) > MAX_EXPRESSION_CHARS or not re.fullmatch(r"[\d+\-*/().\s]+", expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):  # reasoning-gym writes "-2 + x"
            return -value(node.operand)
        raise ValueError(f"not allowed: {ast.dump(node)[:40]}")

    try:
        result = value(tree)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None
    return result if Counter(used) == Counter(numbers) else None


def countdown_reward(response: str, numbers: list[int], target: int, format_score: float = 0.1) -> float:
    expr = extract_expression(response)
    if expr is None:
        return 0.0
    return 1.0 if evaluate_expression(expr, numbers) == target else format_score

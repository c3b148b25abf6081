"""Solution keys: a response's text -> a canonical identity of the solution it gives, or None.

Two responses with the same key are the same solution, however they are worded or spelt. SetpoShaper sends the
keys with a group (contract v1.1): the `key` kernel compares solutions by key alone, `hybrid` treats equal keys
as identical and compares the rest by embedding (docs/diversity.md says which to use for which task).

    countdown_expression("... <answer> ( 3 + 5 ) * 2 </answer>") == "countdown:mul(2,add(3,5))"
    countdown_expression("... <answer> 2 * ( 5 + 3 ) </answer>") == "countdown:mul(2,add(3,5))"

A key function is any `Callable[[str], str | None]`; plug-ins that take it from a config string name it as
"module:function" (load_key).
"""

import ast
import importlib
import re
from collections.abc import Callable

KeyFunction = Callable[[str], str | None]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MAX_EXPRESSION_CHARS = 200  # as the Countdown scorer: a valid answer over 6 two-digit numbers is ~30 characters


def countdown_expression(text: str) -> str | None:
    """The executed expression tree of the last <answer>...</answer>, normalised as ModeBench's Countdown identity
    ("normalised executed expression tree"): the two operands of + and * in a fixed order, - and / as written,
    parentheses that change nothing gone. None when there is no answer or it is not an arithmetic expression over
    integers. Whether the answer is correct is the reward's business, not the key's."""
    found = _ANSWER.findall(text)
    if not found:
        return None
    expression = found[-1].strip()
    if len(expression) > MAX_EXPRESSION_CHARS or not re.fullmatch(r"[\d+\-*/().\s]+", expression):
        return None
    try:
        return "countdown:" + _tree(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _tree(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return str(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return _tree(node.operand)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return f"neg({_tree(node.operand)})"
    if isinstance(node, ast.BinOp):
        left, right = _tree(node.left), _tree(node.right)
        if isinstance(node.op, (ast.Add, ast.Mult)):  # commutative: a + b and b + a are one solution
            left, right = sorted((left, right))
            return f"{'add' if isinstance(node.op, ast.Add) else 'mul'}({left},{right})"
        if isinstance(node.op, (ast.Sub, ast.Div)):
            return f"{'sub' if isinstance(node.op, ast.Sub) else 'div'}({left},{right})"
    raise ValueError("not an arithmetic expression over integers")


# Key functions the project ships, by the short name a config may use instead of "module:function".
KEYS: dict[str, KeyFunction] = {"countdown_expression": countdown_expression}


def load_key(name: str) -> KeyFunction:
    """A key function from a config string: a name in KEYS, or "package.module:function"."""
    if name in KEYS:
        return KEYS[name]
    module, _, attribute = name.partition(":")
    if not module or not attribute:
        raise ValueError(f"key function {name!r}: give one of {sorted(KEYS)} or 'package.module:function'")
    try:
        function = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"key function {name!r} cannot be loaded: {exc}") from exc
    if not callable(function):
        raise ValueError(f"key function {name!r} is not callable")
    return function

"""GSM8K / MATH: find a response's final answer and compare it with the reference.

The final answer is the last \\boxed{...} (the paper's verifier); GSM8K's "#### 72" and "The answer is 72"
are accepted when there is no box, so base models that never box are still scored. Comparison is exact
after normalising notation: numbers by value (1,000 = 1000.0; \\frac{1}{2} = 0.5 = 1/2), everything else as
normalised LaTeX text.
"""

import re
from fractions import Fraction

_SPECIAL_TOKEN = re.compile(r"<\|[^|>]*\|>")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FALLBACKS = [re.compile(r"####\s*([^\n]+)"), re.compile(r"[Tt]he (?:final )?answer is[:\s]*\$?([^\n$]+)")]


def extract_final_answer(response: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces allowed), else the last GSM8K-style answer, else None."""
    starts = [m.end() for m in _BOX.finditer(response)]
    if starts:
        depth, start = 1, starts[-1]
        for i in range(start, len(response)):
            depth += {"{": 1, "}": -1}.get(response[i], 0)
            if depth == 0:
                return response[start:i].strip()
        return None  # an unclosed box is no answer
    for pattern in _FALLBACKS:
        found = pattern.findall(response)
        if found:  # a chat model's end token (<|im_end|>, <|eot_id|>) may follow the answer on its line
            return _SPECIAL_TOKEN.sub("", found[-1]).strip().rstrip(".")
    return None


def _normalise(answer: str) -> str:
    text = answer.strip()
    text = re.sub(
        r"\\text\{([^}]*)\}|\\textbf\{([^}]*)\}|\\mbox\{([^}]*)\}",
        lambda m: next(g for g in m.groups() if g is not None),
        text,
    )
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "$", "^\\circ", "^{\\circ}", "\\%", "%"):
        text = text.replace(token, "")
    text = re.sub(r"^[a-zA-Z]\s*=\s*", "", text)  # "x = 5" -> "5"
    text = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", text)  # 1,000 -> 1000
    text = re.sub(r"\s+", "", text).rstrip(".")
    return text


def _as_number(text: str) -> Fraction | None:
    frac = re.fullmatch(r"-?\\frac\{(-?\d+)\}\{(-?\d+)\}", text) or re.fullmatch(r"-?\\frac(\d)(\d)", text)
    try:
        if frac:
            value = Fraction(int(frac.group(1)), int(frac.group(2)))
            return -value if text.startswith("-") else value
        if re.fullmatch(r"-?\d+/\d+", text):
            return Fraction(text)
        if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", text):
            return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def answers_match(predicted: str, reference: str) -> bool:
    a, b = _normalise(predicted), _normalise(reference)
    x, y = _as_number(a), _as_number(b)
    if x is not None and y is not None:
        return x == y
    return a == b


def math_reward(response: str, reference: str) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0 (no answer found is wrong)."""
    answer = extract_final_answer(response)
    return float(answer is not None and answers_match(answer, reference))

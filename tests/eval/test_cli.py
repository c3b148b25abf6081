"""setpo-eval end to end: datasets, generation with a real small model, scoring, JSONL, tables and plots."""

import json

import pytest

from setpo_trainer.eval import cli, datasets
from setpo_trainer.models import smollm2_path

# What setpo-eval adds for Countdown beside today's figures (tests/eval/test_solutions.py checks their values)
SOLUTION_FIGURES = {
    "solutions_mean",
    "solutions_share_2",
    "solutions_share_3",
    "pcmd",
    "pcmd_defined_prompts",
    "pcmd_prompts",
    "pcmd_support",
    "pcmd_reportable",
    "pcmd_standard_error",
}


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
    assert set(summary["diversity"]) == {"distinct_correct_mean", "diversity_width", "average_mode", *SOLUTION_FIGURES}
    scored = [json.loads(line) for line in (tmp_path / "setpo" / "samples.jsonl").read_text().splitlines()]
    assert [row["reward"] for row in scored][1::2] == [0.0, 0.0] and all(
        row["reward"] in (0.1, 1.0) for row in scored[::2]
    )
    cli.main(["compare", str(tmp_path / "grpo"), str(tmp_path / "setpo"), "--out", str(tmp_path / "cmp")])
    assert "| setpo | countdown | 2 |" in (tmp_path / "cmp" / "summary.md").read_text()
    assert (tmp_path / "cmp" / "pass_at_k.png").stat().st_size > 5000 and (
        tmp_path / "cmp" / "diversity.png"
    ).stat().st_size > 5000


def score(tmp_path, method: str, seed: int, responses: dict[str, list[str]]) -> dict:
    """setpo-eval run on given Countdown samples (puzzle a: 2, 3, 5 -> 16; puzzle b: 2, 3, 4 -> 14)."""
    dataset = tmp_path / "puzzles.jsonl"
    dataset.write_text(
        '{"id": "a", "numbers": [2, 3, 5], "target": 16}\n{"id": "b", "numbers": [2, 3, 4], "target": 14}\n'
    )
    samples = tmp_path / f"{method}-{seed}.jsonl"
    rows = [{"problem_id": p, "response": f"<answer>{r}</answer>"} for p, group in responses.items() for r in group]
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / f"{method}-{seed}"
    args = ["run", "--dataset", str(dataset), "--kind", "countdown", "--samples", str(samples), "--seed", str(seed)]
    cli.main(args + ["--method", method, "--out", str(out)])
    return json.loads((out / "summary.json").read_text())


def test_compare_gives_mean_and_std_over_seeds(tmp_path):
    runs = [
        score(tmp_path, "grpo", 0, {"a": ["(3+5)*2", "(5+3)*2", "2*(3+5)"], "b": ["2*(3+4)", "2+3+4", "2+3+4"]}),
        score(tmp_path, "grpo", 1, {"a": ["(3+5)*2", "2*(5+3)", "nope"], "b": ["2*(4+3)", "4*3+2", "2+4*3"]}),
        score(tmp_path, "setpo", 0, {"a": ["(3+5)*2", "nope", "nope"], "b": ["3*4+2", "2*(3+4)", "3+4+2"]}),
    ]
    grpo = runs[:2]
    # a has one solution however it is spelt; seed 1 solves b two ways (4*3+2 and 2+4*3 are one)
    assert [r["diversity"]["solutions_mean"] for r in grpo] == [1.0, 1.5]
    assert [r["diversity"]["distinct_correct_mean"] for r in grpo] == [2.0, 2.5]  # spellings: a 3 and 2, b 1 and 3
    # seed 0: b's one correct sample leaves its PCMD undefined, so only a's 0 counts; seed 1: a 0, b 2/3
    assert [r["diversity"]["pcmd"] for r in grpo] == [0.0, pytest.approx(1 / 3)]
    assert [r["diversity"]["pcmd_defined_prompts"] for r in grpo] == [1, 2]
    cli.main(
        ["compare", *(str(tmp_path / name) for name in ("grpo-0", "grpo-1", "setpo-0")), "--out", str(tmp_path / "cmp")]
    )

    seeds = {row["method"]: row for row in json.loads((tmp_path / "cmp" / "seeds.json").read_text())}
    assert seeds["grpo"]["seeds"] == [0, 1] and seeds["setpo"]["seeds"] == [0]
    for section in ("accuracy", "diversity"):
        for key, (mean, std) in seeds["grpo"][section].items():
            values = [float(r[section][key]) for r in grpo if r[section][key] is not None]
            literal_mean = sum(values) / len(values)
            assert mean == pytest.approx(literal_mean), key
            literal_std = (sum((v - literal_mean) ** 2 for v in values) / len(values)) ** 0.5
            assert std == (pytest.approx(literal_std) if len(values) > 1 else None), key  # one value: no spread
    assert seeds["grpo"]["accuracy"]["avg@3"] == pytest.approx([0.75, 1 / 12])  # 2/3 and 5/6
    table = (tmp_path / "cmp" / "summary.md").read_text()
    dataset = tmp_path / "puzzles.jsonl"
    assert f"| grpo | {dataset} | 0, 1 | 0.750 ± 0.083 |" in table  # pass@1 over the two seeds
    assert "| 0.167 ± 0.167 (1.5/2)* |" in table  # PCMD, the prompts defining it per seed, under ModeBench's bar
    assert f"| setpo | {dataset} | 0 | 0.500 |" in table  # one run: its figures, no spread


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

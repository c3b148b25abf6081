"""The Countdown experiment's quick form (make test-experiment): a tiny pretraining, every validation arm for a few
RL steps with TRL against the real setpo-server (tests/conftest.py's) — the paper's form, SetPO scoped to correct
answers with the Countdown solution key (hybrid kernel), the same steered by the weight controller, and the
unlikeliness reward — then the finalists on 4 test puzzles and the report; then v3's keyless forms and v4's coverage
arms. Checks that every stage runs, the policy reaches the service and every metric is written; nothing about which
method wins."""

import json
import math
from pathlib import Path

import pytest

from experiments.countdown_lm import job, keep
from experiments.countdown_lm.__main__ import main
from experiments.countdown_lm.arms import Config, phase_one
from experiments.countdown_lm.arms import coverage as coverage_arms
from experiments.countdown_lm.coverage import HEADLINE as COVERAGE_HEADLINE
from experiments.countdown_lm.coverage import progress as coverage_progress
from experiments.countdown_lm.plan import QUICK
from experiments.countdown_lm.report import progress, puzzles_of, same_samples
from setpo_client.keys import countdown_expression

HEADLINE = ["pass@1", "pass@8", "solutions", "pcmd", "share_2", "share_3"]
# The module's fixture runs v2, v3 and v4 in their quick forms (the first test's setup): minutes on an idle 2-core
# machine, several times that beside another suite on the slowest CPU; the default 600 s would fail it, not a hang.
pytestmark = pytest.mark.timeout(2400)


@pytest.fixture(scope="module")
def quick(server, tmp_path_factory):
    """The quick form, once for this module: its results and its --out."""
    out = tmp_path_factory.mktemp("countdown_lm")
    return main(["--out", str(out), "--quick", "--setpo-url", server.url]), out


def test_quick_experiment_runs_every_stage_and_writes_every_metric(quick):
    results, tmp_path = quick

    choices = json.loads((tmp_path / "choices.json").read_text())
    tried = {row["config"]["name"] for row in choices["validation"]}
    assert {"grpo", "paper-w0.5", "scoped-hybrid-w0.15", "unlikeliness-beta0.25"} <= tried
    assert any(name.startswith("controller-hybrid-ratio") for name in tried)

    assert len(results["arms"]) == 4  # GRPO, the paper's form, the best scoped form, the unlikeliness reward
    for name, arm in results["arms"].items():
        for key in HEADLINE:
            mean, std = arm["metrics"][key]
            assert mean is None or (math.isfinite(mean) and math.isfinite(std)), (name, key)
        assert all(len(curve) == QUICK.samples for curve in arm["curves"])  # pass@k for k = 1..n
        assert name == "grpo" or set(arm["versus_grpo"]) == set(HEADLINE + ["pass@64"])

    controller = next(r for r in choices["validation"] if r["config"]["name"].startswith("controller-"))
    run = tmp_path / "runs" / controller["config"]["name"] / f"seed{QUICK.validation_seeds[0]}"
    logged = json.loads((run / "log_history.json").read_text())
    assert all("setpo/weight" in step and "setpo/bonus_rms" in step for step in logged)  # the shaper ran each step
    assert logged[0]["setpo/weight"] == controller["config"]["weight"]  # the controller starts from the arm's lambda

    report = tmp_path / "report"
    for name in ("results.json", "validation.md", "test.md", "pass_at_k.png", "solutions.png"):
        assert (report / name).stat().st_size > 0

    # kept in the repository and restored elsewhere (a later sitting), every run counts as done and reads the same
    kept, elsewhere = tmp_path.with_name(tmp_path.name + "-kept"), tmp_path.with_name(tmp_path.name + "-elsewhere")
    assert keep.save(tmp_path, kept) == keep.restore(elsewhere, kept) > len(choices["validation"])
    assert not list(kept.glob("**/model"))  # summaries and samples, not the models
    for row in choices["validation"]:
        fields = {k: v for k, v in row["config"].items() if k != "name"}
        assert job.is_done(elsewhere, Config(**fields), QUICK.validation_seeds[0], "validation")
    grpo = tmp_path / "runs" / "grpo" / f"seed{QUICK.validation_seeds[0]}"
    assert puzzles_of(elsewhere / grpo.relative_to(tmp_path) / "eval-validation" / "samples.jsonl") == (
        puzzles_of(grpo / "eval-validation" / "samples.jsonl")
    )

    # the table of a stopped experiment: every phase-one config done here, GRPO's first
    table = progress(tmp_path, QUICK)
    first = len(phase_one(QUICK))
    assert table.startswith(f"{first} of {first} validation configs done")
    assert "\n| grpo | yes |" in table
    assert progress(elsewhere, QUICK).split("\n", 1)[1] == table.split("\n", 1)[1]  # the same, from what was kept


def test_quick_experiment_v3_replays_a_kept_run_then_runs_the_keyless_forms(quick):
    """v3 after v2: on one machine and one code the replay writes the kept run's samples exactly, so v2's runs are
    reused (GRPO and the keyed form are not run again); the answer-span form trains with only the answer span sent;
    report-v3 has the finalists (GRPO, the keyless winner, the scoped embedding form's, v2's keyed form), sample std."""
    results, tmp_path = quick[0]["v3"], quick[1]
    replay = results["choices"]["replay"]
    assert replay["differing"] == 0 and replay["samples"] > 0
    v3 = tmp_path / "v3" / "runs"
    assert not (v3 / "grpo").exists() and (v3 / "scoped-hybrid-w0.15").exists()  # reused; only the replay ran
    winners = results["choices"]["winners"]
    assert winners["keyless"] in {"scoped-answer-span-w0.15", "scoped-embedding-w0.15"}
    assert set(results["arms"]) == {"grpo", winners["keyless"], winners["scoped-embedding"], "scoped-hybrid-w0.15"}
    assert results["std"] == "sample (ddof 1)"
    tried = {row["config"]["name"] for row in results["choices"]["validation"]}
    assert tried == {"grpo", "scoped-embedding-w0.15", "scoped-answer-span-w0.15"}
    span_run = v3 / "scoped-answer-span-w0.15" / f"seed{QUICK.validation_seeds[0]}"
    logged = json.loads((span_run / "log_history.json").read_text())
    assert all("setpo/span_missing" in step for step in logged)  # the span was cut on every step
    for name in ("results.json", "validation.md", "test.md", "pass_at_k.png", "solutions.png"):
        assert (tmp_path / "report-v3" / name).stat().st_size > 0


def test_quick_experiment_v4_runs_every_coverage_arm_with_checkpoints_and_reports_coverage(quick):
    """v4 after v3, on v2's data and base model: the base model at n = coverage_samples, every arm of
    arms.coverage plus replay on the best combined form, each validation run's checkpoint evaluated (pass@1 and
    pass@64 over steps), the bases applied by the shaper (the advantages it logs are theirs), the replay threshold
    calibrated, and report-v4 with the pass@k curve, AUC, lost puzzles and intervals against GRPO and v3's form, and
    each test run's policy on training puzzles beside the base model's."""
    results, tmp_path = quick[0]["v4"], quick[1] / "v4"
    assert (
        json.loads((tmp_path / "eval" / "base-validation" / "summary.json").read_text())["n"] == QUICK.coverage_samples
    )
    rows = {row["config"]["name"]: row for row in results["validation"]}
    combined = results["choices"]["combined"]["name"]
    expected = {c.name for c in coverage_arms(QUICK)} | {f"{combined}-replay"}
    assert set(rows) == expected
    steps = list(range(QUICK.curve_every, QUICK.rl.steps, QUICK.curve_every)) + [QUICK.rl.steps]
    for name, row in rows.items():
        assert row["steps"] == steps and all(len(row["over_steps"][k]) == len(steps) for k in ("pass@1", "pass@64"))
        assert (tmp_path / "runs" / name / f"seed{QUICK.validation_seeds[0]}" / "eval-validation-step2").is_dir()
    threshold = json.loads((tmp_path / "replay_threshold.json").read_text())
    replay_run = tmp_path / "runs" / f"{combined}-replay" / f"seed{QUICK.validation_seeds[0]}"
    trained = json.loads((replay_run / "train_summary.json").read_text())["config"]
    assert trained["replay"] and trained["replay_threshold"] == threshold["threshold"]
    logged = json.loads((replay_run / "log_history.json").read_text())
    assert all("setpo/replay_bank_size" in step and "setpo/replay_loss" in step for step in logged)
    # W-REINFORCE's advantages are +0.1 / -1 whatever the group: the shaper's base, not TRL's r - mean(r)
    w_run = tmp_path / "runs" / "w-reinforce" / f"seed{QUICK.validation_seeds[0]}"
    for step in json.loads((w_run / "log_history.json").read_text()):
        assert 0.1 <= step["setpo/advantage_rms"] <= 1.0
    assert set(results["arms"]) >= {"grpo", "scoped-embedding-w0.3", results["choices"]["winner"]["name"]}
    for name, arm in results["arms"].items():
        assert len(arm["curves"]) == len(QUICK.coverage_test_seeds) and len(arm["curves"][0]) == len(results["ks"])
        assert set(arm["lost_puzzles"]) == set(QUICK.coverage_test_seeds)  # per seed, possibly none
        assert name == "grpo" or set(arm["versus_grpo"]) == set(COVERAGE_HEADLINE)
        # and on training puzzles every run trained on, beside the base model's: where else a puzzle is lost
        assert set(arm["train_seen"]["lost_puzzles"]) == set(QUICK.coverage_test_seeds)
        assert set(arm["train_seen"]["metrics"]) == set(COVERAGE_HEADLINE)
    seen = json.loads((tmp_path / "eval" / "base-train-seen" / "summary.json").read_text())
    assert seen["n"] == QUICK.coverage_samples and results["base_train_seen"]["puzzles"] == QUICK.coverage_train_puzzles
    assert (
        f"| pass@64, {QUICK.coverage_train_puzzles} training puzzles |"
        in (tmp_path / "report-v4" / "test.md").read_text()
    )
    for name in (
        "results.json",
        "validation.md",
        "test.md",
        "pass_at_k.png",
        "over_steps.png",
        "validation_pass_at_k.png",
    ):
        assert (tmp_path / "report-v4" / name).stat().st_size > 0
    assert all(len(row["curve"]) == len(results["ks"]) for row in results["validation"])
    configs = coverage_arms(QUICK)  # the progress table a later sitting reads: every config done, a row each
    table = coverage_progress(tmp_path, QUICK)
    assert table.startswith(f"{len(configs) + 1} of {len(configs) + 1} validation configs done")  # replay's too
    for name in [*(config.name for config in configs), f"{combined}-replay"]:
        assert f"| {name} | yes" in table or f"| {name} | no" in table or f"| {name} **(chosen)** |" in table
    assert f"| {results['choices']['winner']['name']} **(chosen)** |" in table


def test_coverage_measures_follow_their_definitions(tmp_path):
    """pass@k unbiased from n samples, AUC the mean of the curve at k = 1, 2, 4, ..., distinct solutions and PCMD
    among the first 64 samples only, and a puzzle lost when the base model solved it and the arm never does."""
    from experiments.countdown_lm.coverage import summarize

    def write(name: str, rows: list[tuple[str, int, str | None]]) -> Path:
        path = tmp_path / f"{name}.jsonl"
        lines = [
            {
                "problem_id": pid,
                "sample": i,
                "response": f"<answer> {expr} </answer>" if expr else "x",
                "correct": bool(expr),
            }
            for pid, i, expr in rows
        ]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return path

    n = 128
    # p: correct at samples 0 (3 + 5) * 2, 1 2 * (5 + 3) (the same solution), 70 (8 - 1) * 2 (past the first 64)
    correct = {0: "( 3 + 5 ) * 2", 1: "2 * ( 5 + 3 )", 70: "( 8 - 1 ) * 2"}
    arm = [("p", i, correct.get(i)) for i in range(n)] + [("q", i, None) for i in range(n)]
    base = [("p", i, None) for i in range(n)] + [("q", i, "1 + 2" if i == 5 else None) for i in range(n)]
    summary = summarize(write("arm", arm), write("base", base))
    p, q = summary["puzzles"]
    assert p["pass@1"] == pytest.approx(3 / n) and p["pass@64"] == pytest.approx(
        1 - math.comb(n - 3, 64) / math.comb(n, 64)
    )
    assert p["auc"] == pytest.approx(
        sum(1 - math.comb(n - 3, k) / math.comb(n, k) for k in (1, 2, 4, 8, 16, 32, 64)) / 7
    )
    assert p["solutions"] == 1 and p["pcmd"] == 0.0  # among the first 64: one solution, twice
    assert p["lost"] == 0.0 and q["lost"] == 1.0 and q["pcmd"] is None
    assert summary["lost"] == 0.5 and list(summary["lost_puzzles"]) == ["q"]
    assert summary["lost_puzzles"]["q"]["base_solutions"] == {countdown_expression("<answer> 1 + 2 </answer>"): 1}


def test_same_samples_counts_the_replayed_samples_that_differ(tmp_path):
    rows = [
        {"problem_id": "p", "sample": i, "response": f"<answer> {i} + 1 </answer>", "reward": 0.1, "correct": False}
        for i in range(3)
    ]
    newer = [{**row, "temperature": 1.0} for row in rows]  # a later setpo-eval writes more fields: not a difference
    for name, changed in (("kept", rows), ("replayed", [*newer[:2], {**newer[2], "response": "other"}])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    assert same_samples(tmp_path / "kept", tmp_path / "replayed")["differing"] == 1
    assert same_samples(tmp_path / "kept", tmp_path / "kept")["differing"] == 0


def test_every_run_and_the_service_compute_as_an_avx2_cpu_in_float32():
    """The experiment pins one arithmetic for its runs (inherited by each run's process and the service) and names
    the service's dtype: kept runs from machines with other instructions stay comparable (docs/experiments.md)."""
    import os

    from experiments.countdown_lm.__main__ import ARITHMETIC, local_service

    assert all(os.environ[name] == value for name, value in ARITHMETIC.items())
    server = local_service()
    assert server.env["SETPO_DTYPE"] == "float32" and server.env["ATEN_CPU_CAPABILITY"] == "avx2"


def test_a_run_packed_twice_is_the_same_bytes(tmp_path):
    """experiment-keep saves every finished run again each sitting: unchanged samples must not change in git."""
    import time

    from experiments.countdown_lm.keep import pack, unpack

    plain = tmp_path / "samples.jsonl"
    plain.write_text('{"response": "<answer> 1 + 2 </answer>"}\n' * 50)
    pack(plain, tmp_path / "first.gz")
    time.sleep(1.1)  # gzip's header keeps a time in seconds
    pack(plain, tmp_path / "second.gz")
    assert (tmp_path / "first.gz").read_bytes() == (tmp_path / "second.gz").read_bytes()
    unpack(tmp_path / "second.gz", tmp_path / "back.jsonl")
    assert (tmp_path / "back.jsonl").read_text() == plain.read_text()


def test_why_lost_counts_each_template_and_names_the_lost_puzzles_with_the_base_models_solutions(tmp_path):
    """A template is the answer with each number written n; its share is over the base model's correct answers and
    over every answer of a config (its seeds pooled); a puzzle is listed with each run that lost it."""
    from experiments.countdown_lm.coverage import template, why_lost

    assert template("plan . <answer> 1 </answer> <answer> 19 - ( 5 - 1 ) </answer>") == "n - ( n - n )"
    assert template("no answer") == "(none)"

    def write(path: Path, rows: list[tuple[str, str, bool]]) -> None:
        path.mkdir(parents=True)
        lines = [
            {"problem_id": pid, "sample": i, "response": f"<answer> {expr} </answer>", "correct": ok}
            for i, (pid, expr, ok) in enumerate(rows)
        ]
        (path / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    # the base model: p by n + n (twice), q by n - n - n (once); config a's seed 0 answers q wrongly with n - n
    write(tmp_path / "eval" / "base-validation", [("p", "1 + 2", True), ("p", "2 + 1", True), ("q", "9 - 3 - 1", True)])
    write(tmp_path / "runs" / "a" / "seed0" / "eval-validation", [("p", "1 + 2", True), ("q", "9 - 3", False)])
    write(tmp_path / "runs" / "a" / "seed1" / "eval-validation", [("p", "1 + 2", True), ("q", "9 - 3 - 1", True)])
    table = why_lost(tmp_path, least=0.3).splitlines()
    assert table[0] == "| template | base: of its correct answers | base: of all | a |"
    assert table[2] == "| `n + n` | 0.667 | 0.667 | 0.500 |"  # 2 of the base's 3 correct answers, 2 of a's 4
    assert table[3] == "| `n - n - n` | 0.333 | 0.333 | 0.250 |" and len(table) == 4 + 4  # 1 of 4; no n - n row
    assert table[-1] == "| q | 1 | 1 of 1 | `n - n - n` 1 |"  # lost by a/seed0 only

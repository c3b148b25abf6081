"""The Countdown experiment's quick form (make test-experiment): a tiny pretraining, every validation arm for a few
RL steps with TRL against the real setpo-server (tests/conftest.py's) — the paper's form, SetPO scoped to correct
answers with the Countdown solution key (hybrid kernel), the same steered by the weight controller, and the
unlikeliness reward — then the finalists on 4 test puzzles and the report. Checks that every stage runs, the
policy reaches the service and every metric is written; nothing about which method wins."""

import json
import math

import pytest

from experiments.countdown_lm import job, keep
from experiments.countdown_lm.__main__ import main
from experiments.countdown_lm.arms import Config, phase_one
from experiments.countdown_lm.plan import QUICK
from experiments.countdown_lm.report import progress, puzzles_of, same_samples

HEADLINE = ["pass@1", "pass@8", "solutions", "pcmd", "share_2", "share_3"]


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

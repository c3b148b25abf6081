"""The Countdown experiment's quick form (make test-experiment): a tiny pretraining, every validation arm for a few
RL steps with TRL against the real setpo-server (tests/conftest.py's) — the paper's form, SetPO scoped to correct
answers with the Countdown solution key (hybrid kernel), the same steered by the weight controller, and the
unlikeliness reward — then the finalists on 4 test puzzles and the report. Checks that every stage runs, the
policy reaches the service and every metric is written; nothing about which method wins."""

import json
import math

from experiments.countdown_lm import job, keep
from experiments.countdown_lm.__main__ import main
from experiments.countdown_lm.arms import Config, phase_one
from experiments.countdown_lm.plan import QUICK
from experiments.countdown_lm.report import progress, puzzles_of

HEADLINE = ["pass@1", "pass@8", "solutions", "pcmd", "share_2", "share_3"]


def test_quick_experiment_runs_every_stage_and_writes_every_metric(server, tmp_path):
    results = main(["--out", str(tmp_path), "--quick", "--setpo-url", server.url])

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

"""The Countdown LM experiment's quick form (make test-experiment): a tiny pretraining, a 2-step lambda sweep, 3
RL steps of GRPO and of SetPO+GRPO with TRL against the real setpo-server (tests/conftest.py's), and setpo-eval
on 4 test puzzles. Checks that every stage runs and writes every metric; nothing about which method wins."""

import math

from experiments.countdown_lm.__main__ import main

EVAL_METRICS = [
    "pass@1",
    "pass@8",
    "avg@8",
    "distinct_correct_mean",
    "diversity_width",
    "average_mode",
    "mean_pairwise_similarity",
    "set_score",
]
SETPO_TRAIN_METRICS = ["train_setpo_time_share", "train_saturation", "train_set_score", "train_marginal_std"]


def test_quick_experiment_runs_every_stage_and_writes_every_metric(server, tmp_path):
    results = main(["--out", str(tmp_path), "--quick", "--setpo-url", server.url])

    assert set(results["methods"]) == {"base", "grpo", "setpo"}
    for method, metrics in results["methods"].items():
        for key in EVAL_METRICS + (SETPO_TRAIN_METRICS if method == "setpo" else []):
            mean, std, values = metrics[key]
            assert all(math.isfinite(v) for v in [mean, std, *values]), (method, key)
        assert all(len(curve) == 8 for curve in results["curves"][method])  # pass@k for k = 1..n
    assert results["lambda"] == 0.5 and results["timings_s"]["total"] > 0  # the quick sweep's only candidate
    report = tmp_path / "report"
    for name in ("results.json", "table.md", "pass_at_k.png", "distinct.png"):
        assert (report / name).stat().st_size > 0
    assert (tmp_path / "sweep" / "sweep.json").exists()

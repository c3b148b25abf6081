"""setpo-bandit, the paper's toy bandit, trained against the real running service."""

import json
import subprocess
import sys

import pytest

from setpo_client import SetpoClient
from setpo_client.shaping import SetpoShaper
from setpo_server.local import free_port
from setpo_trainer import bandit


def test_setpo_keeps_more_rewarded_modes_alive_than_grpo_without_losing_reward(server, tmp_path):
    bandit.main(["--url", server.url, "--out", str(tmp_path), "--seeds", "0", "1", "2"])
    summary = json.loads((tmp_path / "results.json").read_text())
    args = bandit.parse_args(["--url", "x", "--out", "x"])
    for seed in ("0", "1", "2"):
        grpo, setpo = (summary["runs"][m][seed] for m in ("grpo", "setpo"))
        assert bandit.alive_rewarded(grpo["probs"][-1], args) == 1  # GRPO collapses onto one rewarded mode
        assert bandit.alive_rewarded(setpo["probs"][-1], args) >= 3
        # the diversity comes from the rewarded modes, not from drifting to unrewarded ones
        assert sum(m["reward_mean"] for m in setpo["metrics"][-20:]) / 20 >= 0.95
        assert all(m["setpo/weight"] == 2.0 for m in setpo["metrics"])
    assert summary["alive_mean"]["setpo"] > summary["alive_mean"]["grpo"]
    assert (tmp_path / "mode_probabilities.png").stat().st_size > 10_000
    assert "| mean |" in (tmp_path / "table.md").read_text()


def test_a_step_that_falls_back_is_exactly_a_grpo_step():
    args = bandit.parse_args(["--url", "x", "--out", "x", "--steps", "40"])
    down = SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=0)
    grpo = bandit.train(args, SetpoShaper(down, weight=0.0), seed=5)
    fallen_back = SetpoShaper(down, weight=2.0, on_error="skip")
    setpo = bandit.train(args, fallen_back, seed=5)
    assert setpo["probs"] == grpo["probs"]
    assert fallen_back.fallback_steps == 40 and setpo["metrics"][-1]["setpo/fallback_steps"] == 40


def test_setpo_metrics_are_logged_every_step(inprocess):
    args = bandit.parse_args(["--url", "x", "--out", "x", "--steps", "5"])
    run = bandit.train(args, SetpoShaper(inprocess, weight=2.0), seed=0)
    assert len(run["probs"]) == 6 and len(run["metrics"]) == 5
    for step in run["metrics"]:
        assert {"setpo/set_score_mean", "setpo/marginal_std", "setpo/saturation", "setpo/duplicate_share"} <= set(step)
        assert step["setpo/active"] == 1
    assert "setpo/time_share" not in run["metrics"][0]  # measured by the shaper from one step to the next
    assert all(0 < step["setpo/time_share"] <= 1 for step in run["metrics"][1:])


def test_the_demo_fits_on_one_screen_and_says_what_its_step_share_means(server, tmp_path):
    command = [sys.executable, "-m", "setpo_trainer.bandit", "--url", server.url, "--out", str(tmp_path)]
    # bytes: text=True would turn tqdm's carriage returns (a bar redrawn in place) into newlines
    quiet = subprocess.run([*command, "--steps", "30", "--seeds", "0", "1"], capture_output=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    output = (quiet.stdout + quiet.stderr).decode()
    assert "HTTP Request" not in output  # 120 requests, none of them a line of their own
    assert output.count("\n") <= 30, output  # a screen, with tqdm's bar redrawn in place
    assert "| mean |" in output and str(tmp_path / "mode_probabilities.png") in output
    assert "of this toy's step, whose own update takes microseconds" in output
    assert "training: 100%" in output  # one progress bar over seeds, methods and steps
    loud = subprocess.run(
        [*command, "--steps", "3", "--seeds", "0", "--verbose"], capture_output=True, text=True, timeout=300
    )
    assert loud.stderr.count("HTTP Request: POST") == 3  # --verbose: a line for each SetPO step's request


@pytest.mark.parametrize("flags", [["--group-size", "2"], ["--rewarded", "13"], ["--steps", "0"]])
def test_bad_flags_fail_clearly(flags, capsys):
    with pytest.raises(SystemExit):
        bandit.parse_args(["--url", "x", "--out", "x", *flags])
    assert "group-size >= 3" in capsys.readouterr().err


def test_embed_span_is_refused_the_bandit_has_no_texts(capsys):
    with pytest.raises(SystemExit):
        bandit.parse_args(["--url", "x", "--out", "x", "--embed-span", "<answer>(.*?)</answer>"])
    assert "--embed-span chooses what of a text is embedded; the bandit's responses are embedding vectors" in (
        capsys.readouterr().err
    )


def test_in_flight_reaches_every_runs_shaper_and_is_refused_below_1(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        bandit.parse_args(["--url", "x", "--out", "x", "--in-flight", "0"])
    assert "--in-flight must be >= 1 (requests in flight at once), got 0" in capsys.readouterr().err
    args = bandit.parse_args(["--url", "x", "--out", "x", "--seeds", "0", "--in-flight", "2"])
    seen = []
    monkeypatch.setattr(bandit, "train", lambda args, shaper, seed, progress: seen.append(shaper.in_flight) or {})
    with SetpoClient("http://127.0.0.1:1,http://127.0.0.1:2") as replicas:  # never asked: train is stubbed
        bandit.run_all(args, replicas)
    assert seen == [2, 2]  # GRPO's run and SetPO's


def test_the_scoped_form_with_keys_and_the_controller_keeps_rewarded_modes_alive(server, tmp_path):
    flags = [
        "--min-reward",
        "1",
        "--kernel",
        "key",
        "--normalize",
        "zscore",
        "--target-ratio",
        "0.3",
        "--weight",
        "0.3",
    ]
    bandit.main(["--url", server.url, "--out", str(tmp_path), "--seeds", "0", "1", "2", *flags])
    summary = json.loads((tmp_path / "results.json").read_text())
    args = bandit.parse_args(["--url", "x", "--out", "x"])
    for seed in ("0", "1", "2"):
        setpo = summary["runs"]["setpo"][seed]
        assert bandit.alive_rewarded(setpo["probs"][-1], args) >= 3
        assert sum(m["reward_mean"] for m in setpo["metrics"][-20:]) / 20 >= 0.95
        weights = [m["setpo/weight"] for m in setpo["metrics"]]
        assert weights[0] == 0.3 and len(set(weights)) > 10  # the controller moved lambda
        # at the start most responses are unrewarded and go unscored (without the scope the share would be 1)
        assert setpo["metrics"][0]["setpo/scored_share"] < 0.6


def test_bad_controller_flags_fail_before_the_service_starts(capsys):
    with pytest.raises(SystemExit):
        bandit.parse_args(["--url", "x", "--out", "x", "--target-ratio", "0.3", "--min-weight", "0"])
    assert "min_weight" in capsys.readouterr().err


def test_groups_larger_than_the_service_takes_stop_the_run_at_start(tmp_path):
    from setpo_server.local import LocalServer

    with LocalServer(max_group_size=4) as small, pytest.raises(SystemExit) as stopped:
        bandit.main(["--url", small.url, "--out", str(tmp_path), "--group-size", "6", "--seeds", "0", "--steps", "2"])
    assert "groups of 6 responses" in str(stopped.value) and "lower --group-size" in str(stopped.value)
    assert not (tmp_path / "results.json").exists()  # nothing trained

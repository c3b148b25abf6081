"""One run of the experiment: train one config for one seed, then evaluate the policy on one split. Each half is
skipped when its results are already on disk, so a stopped experiment resumes run by run. __main__ calls `run`
in-process (one at a time) or this module as a process (two at a time, one thread each):

    python -m experiments.countdown_lm.job --out out/countdown_lm --config '{"arm": "grpo"}' --seed 0 \\
        --split validation --url http://127.0.0.1:8000 [--quick]
"""

import argparse
import json
import logging
from pathlib import Path

import torch

from experiments.countdown_lm.arms import Config
from experiments.countdown_lm.plan import FULL, QUICK, Plan
from setpo_trainer.packaged_data import read_jsonl


def run_dir(out: Path, config: Config, seed: int) -> Path:
    return out / "runs" / config.name / f"seed{seed}"


def is_done(out: Path, config: Config, seed: int, split: str) -> bool:
    return (run_dir(out, config, seed) / f"eval-{split}" / "summary.json").exists()


def run(out: Path, plan: Plan, config: Config, seed: int, split: str, url: str, coverage: bool = False) -> dict:
    """Train (unless trained) and evaluate on `split` (unless evaluated); the run's train and eval summaries.
    coverage (experiment v4): plan.coverage_samples per puzzle, and on validation every plan.curve_every steps'
    checkpoint evaluated too (eval-validation-step<N>), and on test the training puzzles too (eval-train-seen), before
    the final policy, so a run whose final evaluation is written is done whole."""
    from experiments.countdown_lm.evaluate import evaluate
    from experiments.countdown_lm.rl import train

    where = run_dir(out, config, seed)
    trained = where / "train_summary.json"
    if trained.exists():
        summary = json.loads(trained.read_text())
    else:
        data = [row for _, row in read_jsonl(out / "data" / "train.jsonl")]  # written by __main__'s data stage
        every = plan.curve_every if coverage and split == "validation" else 0
        label = f"{config.name} seed {seed}"
        summary = train(out / "base", where, data, url, config, seed, plan.rl, label, every)
    evaluated = where / f"eval-{split}"
    samples = plan.coverage_samples if coverage else plan.samples
    split_file = out / "data" / f"{split}.jsonl"
    if not (evaluated / "summary.json").exists():
        for step in sorted((where / "steps").glob("step-*"), key=lambda path: int(path.name.split("-")[1])):
            curve = where / f"eval-{split}-{step.name.replace('-', '')}"
            if not (curve / "summary.json").exists():
                evaluate(step, split_file, curve, config.name, samples, plan.max_new_tokens, seed, None)
        seen = where / "eval-train-seen"  # v4's test runs: the training puzzles __main__ wrote to train-seen.jsonl
        if coverage and split == "test" and not (seen / "summary.json").exists():
            train_seen = out / "data" / "train-seen.jsonl"
            evaluate(where / "model", train_seen, seen, config.name, samples, plan.max_new_tokens, seed, None)
        evaluate(where / "model", split_file, evaluated, config.name, samples, plan.max_new_tokens, seed, None)
    return {"train": summary, "eval": json.loads((evaluated / "summary.json").read_text())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", required=True, help="arms.Config as JSON")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--split", choices=["validation", "test"], required=True)
    parser.add_argument("--url", required=True, help="the setpo service")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--coverage", action="store_true", help="experiment v4's evaluation protocol")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # two runs share two cores
    for noisy in ("httpx", "setpo_eval"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    fields = {k: v for k, v in json.loads(args.config).items() if k != "name"}
    run(args.out, QUICK if args.quick else FULL, Config(**fields), args.seed, args.split, args.url, args.coverage)


if __name__ == "__main__":
    main()

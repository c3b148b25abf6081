"""A follow-up to the sweep, on the validation split only: is lambda too small to matter? Trains SetPO+GRPO at a
larger lambda for every seed of the main run (same steps and settings) and evaluates it and the main run's GRPO
policies on validation, mean ± std over seeds. Run after `make experiment`, with the same --out:

    python -m experiments.countdown_lm.lambda_check --out out/countdown_lm --weight 16
"""

import argparse
import json
import logging
from pathlib import Path

from experiments.countdown_lm import puzzles, report
from experiments.countdown_lm.__main__ import evaluate_once, train_once
from experiments.countdown_lm.plan import FULL
from setpo_server.local import LocalServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/countdown_lm"))
    parser.add_argument("--weight", type=float, default=16.0)
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # setpo-eval's logging would print every request
    plan, check = FULL, args.out / "lambda_check"
    split = puzzles.splits(plan.data_seed, plan.validation_puzzles, plan.test_puzzles)
    validation = args.out / "data" / "validation.jsonl"
    rows = {"grpo": [], f"lambda={args.weight:g}": []}
    with LocalServer(threads=1) as server:
        for seed in plan.seeds:
            grpo = args.out / "runs" / f"grpo-seed{seed}" / "model"
            rows["grpo"].append(
                evaluate_once(grpo, validation, check / f"eval-grpo-seed{seed}", "grpo", plan, seed, None)
            )
            run = check / f"lambda-{args.weight:g}-seed{seed}"
            trained = train_once(
                args.out / "base",
                run,
                split["train"],
                server.url,
                args.weight,
                seed,
                plan.rl,
                f"lambda={args.weight:g} seed {seed}",
            )
            result = evaluate_once(run / "model", validation, run / "eval", f"lambda={args.weight:g}", plan, seed, None)
            rows[f"lambda={args.weight:g}"].append({**result, "train": trained})
    summary = {name: report.spread([report.run_metrics(r) for r in results]) for name, results in rows.items()}
    (check / f"lambda-{args.weight:g}.json").write_text(json.dumps(summary, indent=1))
    for key in ("pass@1", "pass@8", "pass@64", "distinct_correct_mean", "diversity_width", "average_mode"):
        print(key, "  ".join(f"{name}: {m[key][0]:.3f} ± {m[key][1]:.3f}" for name, m in summary.items()))


if __name__ == "__main__":
    main()

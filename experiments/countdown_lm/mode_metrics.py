"""Solution modes among a policy's samples: for each puzzle, how many distinct correct solutions it found under
ModeBench's identity (`setpo_client.keys.countdown_expression`), and pass@k, from setpo-eval's samples.jsonl.

    python -m experiments.countdown_lm.mode_metrics out/countdown_lm/eval/base/samples.jsonl
"""

import json
import sys
from pathlib import Path
from statistics import fmean

from setpo_client.keys import countdown_expression
from setpo_trainer.eval.metrics import pass_at_k
from setpo_trainer.packaged_data import read_jsonl


def per_puzzle(samples: Path) -> dict[str, dict]:
    """problem id -> n, correct samples and the set of their modes."""
    found: dict[str, dict] = {}
    for _, row in read_jsonl(samples):
        entry = found.setdefault(row["problem_id"], {"n": 0, "correct": 0, "modes": set()})
        entry["n"] += 1
        if row["correct"]:
            entry["correct"] += 1
            entry["modes"].add(countdown_expression(row["response"]))
    return found


def summary(samples: Path, ks: tuple[int, ...] = (1, 8, 64)) -> dict:
    """pass@k (unbiased), mean distinct correct modes per puzzle, and the share of puzzles with >= 2 and >= 3."""
    rows = list(per_puzzle(samples).values())
    modes = [len(r["modes"]) for r in rows]
    result = {f"pass@{k}": fmean(pass_at_k(r["n"], r["correct"], k) for r in rows) for k in ks if k <= rows[0]["n"]}
    return {
        **result,
        "modes_mean": fmean(modes),
        "share_2_modes": fmean(m >= 2 for m in modes),
        "share_3_modes": fmean(m >= 3 for m in modes),
        "puzzles": len(rows),
    }


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(path, json.dumps({k: round(v, 4) for k, v in summary(Path(path)).items()}))

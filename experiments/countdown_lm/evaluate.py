"""Evaluation through setpo-eval itself (its `run` command, called in-process to load torch once): n samples per
puzzle at the policy's own temperature, the project's scorer, pass@k, Avg@n, distinct correct expressions,
diversity width, average mode and, with a service URL, mean pairwise similarity and set score D."""

import json
from pathlib import Path

from setpo_trainer.eval import cli
from setpo_trainer.packaged_data import read_jsonl


def evaluate(
    model: Path, puzzles: Path, out: Path, label: str, samples: int, max_new_tokens: int, seed: int, url: str | None
) -> dict:
    argv = [
        "run",
        "--model",
        str(model),
        "--dataset",
        str(puzzles),
        "--kind",
        "countdown",
        "--prompt-field",
        "prompt",
        "--n",
        str(samples),
        "--temperature",
        "1.0",
        "--top-p",
        "1.0",
        "--max-new-tokens",
        str(max_new_tokens),
        "--chat",
        "no",
        "--seed",
        str(seed),
        "--method",
        label,
        "--out",
        str(out),
    ]
    cli.main(argv + (["--setpo-url", url] if url else []))
    return json.loads((out / "summary.json").read_text())


def correct_counts(out: Path) -> list[tuple[int, int]]:
    """(n, correct samples) per puzzle, from the samples setpo-eval wrote: for pass@k at every k, not only powers of 2."""
    by_puzzle: dict[str, list[bool]] = {}
    for _, row in read_jsonl(out / "samples.jsonl"):
        by_puzzle.setdefault(row["problem_id"], []).append(row["correct"])
    return [(len(rows), sum(rows)) for rows in by_puzzle.values()]

"""A step fanned out over replicas on this machine's CPU cores (issue 39, item 5): 128 prompts x 8 GSM8K-length
responses (GSM8K's worked solutions, ~100 tokens: what a policy answers) through SetpoShaper against one replica and against two, each
replica one thread, float32, interleaved paired rounds (benchmarks/gpu/replicas.py's measure, on the CPU).

    python -m benchmarks.replicas [--rounds 5] [--prompts 128] [--out out/bench/replicas.json]

Run it on a quiet machine: with 2 cores, two one-thread replicas are the whole machine.
"""

import argparse
import json
import time
from pathlib import Path

from benchmarks.gpu.replicas import measure
from benchmarks.http_vs_inprocess import gsm8k_rows
from setpo_server.backend import embedded_model_path

CPU_ARRANGEMENTS = [
    ("1 replica, serial", "a", 1),
    ("1 replica, 2 in flight", "a", 2),
    ("2 replicas, default (1 in flight each)", "ab", None),
    ("2 replicas, 4 in flight", "ab", 4),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--per-prompt", type=int, default=8)
    parser.add_argument("--budget", type=int, default=16384, help="each replica's SETPO_MAX_BATCH_TOKENS")
    parser.add_argument(
        "--out", type=Path, default=Path("out/bench/replicas.json")
    )  # docs/benchmarks.md, "How replicas scale"
    args = parser.parse_args()
    rows = gsm8k_rows()[: args.prompts * args.per_prompt]
    texts = [row["answer"] for row in rows]
    groups = [texts[i : i + args.per_prompt] for i in range(0, len(texts), args.per_prompt)]
    print(f"{len(groups)} prompts x {args.per_prompt}, {args.rounds} interleaved rounds, float32, 1 thread a replica")
    report = measure(
        embedded_model_path(), "cpu", "float32", groups, args.rounds, args.budget, CPU_ARRANGEMENTS, threads=1
    )
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""This checkout's setpo-server against the one at a git revision, side by side in one run (before/after figures).

The revision is checked out into a temporary git worktree and its server runs with that worktree's packages
first on PYTHONPATH, in the same environment. Both servers get the same requests in alternation (A B A B ...),
so the VM's drift (10-20 % over minutes) hits both alike; each workload prints the median throughput of each
and the paired ratio (the median of each round's own new/old ratio; > 1 = this checkout is faster).

Workloads: the three of http_vs_inprocess.py (one caller), and `concurrent-16`: the countdown groups split over
16 callers at once (what many trainers sharing a replica look like).

    python -m benchmarks.server_ab --baseline HEAD [--repeats 5] [--workloads countdown ...]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.http_vs_inprocess import workloads
from setpo_client import SetpoClient
from setpo_server.local import LocalServer

ROOT = Path(__file__).resolve().parents[1]


def timed_run(client: SetpoClient, groups: list[list[str]], callers: int) -> float:
    """Seconds to score all groups, split over `callers` concurrent requests."""
    parts = [groups[i::callers] for i in range(callers)]
    start = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(lambda part: client.diversity([{"texts": g} for g in part]), parts))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="HEAD", help="git revision of the server to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=None, help="subset of workload names")
    args = parser.parse_args()

    chosen = {name: (groups, 1) for name, groups in workloads().items()}
    chosen["concurrent-16"] = (chosen["countdown"][0], 16)
    chosen = {name: work for name, work in chosen.items() if not args.workloads or name in args.workloads}
    worktree = Path(tempfile.mkdtemp(prefix="setpo-baseline-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline],
        check=True,
        capture_output=True,
    )
    old_path = f"{worktree / 'services/embedding_server'}:{worktree / 'core'}"
    old = LocalServer(command=["env", f"PYTHONPATH={old_path}", sys.executable, "-m", "setpo_server.cli"])
    try:
        with (
            LocalServer() as new,
            old,
            SetpoClient(new.url, timeout=600) as new_client,
            SetpoClient(old.url, timeout=600) as old_client,
        ):
            print(
                f"baseline {args.baseline} = {subprocess.run(['git', '-C', str(worktree), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}"
            )
            print(
                f"{'workload':<14} {'texts':>6} {'callers':>7} {'old t/s':>8} {'new t/s':>8} {'ratio':>6} {'paired':>7}"
            )
            for name, (groups, callers) in chosen.items():
                texts = sum(len(g) for g in groups)
                timed_run(new_client, groups, callers), timed_run(old_client, groups, callers)  # warm both
                new_seconds, old_seconds = [], []
                for _ in range(args.repeats):
                    new_seconds.append(timed_run(new_client, groups, callers))
                    old_seconds.append(timed_run(old_client, groups, callers))
                new_tps, old_tps = texts / statistics.median(new_seconds), texts / statistics.median(old_seconds)
                paired = statistics.median(o / n for n, o in zip(new_seconds, old_seconds))  # seconds: new's speed-up
                print(
                    f"{name:<14} {texts:>6} {callers:>7} {old_tps:>8.1f} {new_tps:>8.1f} {new_tps / old_tps:>6.3f} {paired:>7.3f}"
                )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False, capture_output=True
        )


if __name__ == "__main__":
    main()

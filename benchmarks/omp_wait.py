"""Torch processes sharing the machine's cores, as in `make test` (a suite's own process, the servers and trainers it
starts, the suite beside it): in-process encode throughput with OpenMP's default wait policy (a thread spins for a
while waiting for the next parallel region) against OMP_WAIT_POLICY=PASSIVE (it sleeps), with two processes at once
and with one alone. Each process encodes the first 64 texts of a workload of benchmarks.http_vs_inprocess (Countdown's
short answers, or GSM8K solutions), batch 32, with torch's default threads (one per core). Rounds interleave the
four runs; the ratio is PASSIVE over the default, the median of the rounds' own ratios (this VM drifts over minutes).

    python -m benchmarks.omp_wait [--workload countdown|gsm8k-64x6] [--rounds 3] [--seconds 15]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def worker(workload: str, seconds: float) -> None:
    """Load the model, say ready, wait for go, encode the workload's first 64 texts for `seconds`, print texts/s."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from sentence_transformers import SentenceTransformer

    from benchmarks.http_vs_inprocess import workloads
    from setpo_server.backend import embedded_model_path

    texts = [text for group in workloads()[workload] for text in group][:64]
    model = SentenceTransformer(embedded_model_path(), device="cpu")
    model.encode(texts[:32])
    print("ready", flush=True)
    sys.stdin.readline()
    started, done = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        model.encode(texts, batch_size=32)
        done += len(texts)
    print(done / (time.perf_counter() - started), flush=True)


def run(processes: int, policy: str, workload: str, seconds: float) -> float:
    """Texts per second of `processes` workers encoding at the same time, all of them together."""
    env = {name: value for name, value in os.environ.items() if name != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    command = [
        sys.executable,
        "-m",
        "benchmarks.omp_wait",
        "--workload",
        workload,
        "--seconds",
        str(seconds),
        "--worker",
    ]
    workers = [
        subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    pipes = [(process.stdin, process.stdout) for process in workers]
    for _, out in pipes:  # every model loaded before any starts: the encodes overlap for the whole time
        assert out is not None and out.readline().strip() == "ready"
    for into, _ in pipes:
        assert into is not None
        into.write("go\n")
        into.flush()
    rates = [float(out.readline()) for _, out in pipes if out is not None]
    for process in workers:
        process.wait()
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="each run's encoding time")
    parser.add_argument("--workload", choices=["gsm8k-64x6", "countdown"], default="countdown")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.workload, args.seconds)
        return
    print(
        f"{os.cpu_count()} cores; in-process encode of {args.workload}'s first 64 texts, batch 32, texts/s of all processes"
    )
    runs = [(processes, policy) for processes in (2, 1) for policy in ("default", "PASSIVE")]
    rates: dict[tuple[int, str], list[float]] = {run_: [] for run_ in runs}
    for round_ in range(args.rounds):
        for processes, policy in runs if round_ % 2 == 0 else runs[::-1]:
            rates[processes, policy].append(run(processes, policy, args.workload, args.seconds))
            print(f"round {round_ + 1}: {processes} process(es), {policy:8s} {rates[processes, policy][-1]:7.1f}")
    for processes in (2, 1):
        ratios = [p / d for p, d in zip(rates[processes, "PASSIVE"], rates[processes, "default"])]
        print(
            f"{processes} process(es): default {statistics.median(rates[processes, 'default']):.1f} texts/s, "
            f"PASSIVE {statistics.median(rates[processes, 'PASSIVE']):.1f}; "
            f"PASSIVE / default {statistics.median(ratios):.2f} (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()

"""Where a short text's time goes in-process: the service's own forward (`Backend.encode`) over the batcher's
length-sorted token-budget chunks, at several budgets, against `SentenceTransformer.encode` (batch 32) of the same
texts, in each dtype, in interleaved rounds (this VM drifts; the paired ratio is the median of each round's own).

No HTTP, no JSON, no scoring: what is left between the service and in-process encode here is the batch shape and
the per-batch work (padding, the forward, the float32 normalisation); what a request adds on top is the difference
between this and `http_vs_inprocess.py` / `peer_infinity.py`. docs/benchmarks.md, "What a batch budget buys, on a CPU".

--attention eager also times each budget with transformers' eager attention instead of its default (sdpa, a fused
kernel): on short texts the fused CPU kernel is not always the faster (the same section).

    python -m benchmarks.batch_budget [--workload countdown] [--dtypes bfloat16 float32]
        [--budgets 1024 2048 4096] [--attention sdpa eager] [--repeats 3] [--texts N]
"""

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from transformers import PreTrainedModel

from benchmarks.http_vs_inprocess import workloads
from setpo_server.backend import Backend
from setpo_server.settings import Settings


def chunks(ids: list[np.ndarray], budget: int) -> list[list[int]]:
    """The batcher's chunking of one job: longest first, while the padded batch fits the budget (at least one)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    batches: list[list[int]] = [[]]
    longest = 0
    for i in order:
        if batches[-1] and (len(batches[-1]) + 1) * max(longest, len(ids[i])) > budget:
            batches.append([])
            longest = 0
        batches[-1].append(i)
        longest = max(longest, len(ids[i]))
    return batches


def forward_chunks(backend: Backend, ids: list[np.ndarray], batches: list[list[int]]) -> None:
    for batch in batches:
        backend.encode([ids[i] for i in batch])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="countdown")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--budgets", nargs="+", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--attention", nargs="+", default=["sdpa"], help="transformers attn_implementation values")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--texts", type=int, default=None, help="only the workload's first N texts")
    args = parser.parse_args()

    texts = [t for g in workloads()[args.workload] for t in g][: args.texts]
    print(f"{len(texts)} texts of {args.workload}; torch threads {torch.get_num_threads()}", flush=True)
    calls: dict[tuple[str, str], Callable[[], object]] = {}
    for d in args.dtypes:
        backend = Backend(Settings(dtype=d))
        ids = backend.tokenize(texts)[0]
        print(f"{d}: tokens/text mean {np.mean([len(row) for row in ids]):.1f}, max {max(map(len, ids))}", flush=True)
        calls[d, "encode, batch 32"] = partial(backend.model.encode, texts, convert_to_tensor=True)
        for attention in args.attention:
            served = backend  # sdpa: the backend above; another attention gets a backend of its own
            if attention != "sdpa":
                served = Backend(Settings(dtype=d))
                transformer = served.model[0].model
                assert isinstance(transformer, PreTrainedModel), type(transformer)
                transformer.set_attn_implementation(attention)
            for budget in args.budgets:
                batches = chunks(ids, budget)
                name = f"budget {budget} ({len(batches)} batches){'' if attention == 'sdpa' else ', ' + attention}"
                calls[d, name] = partial(forward_chunks, served, ids, batches)
    for call in calls.values():  # first-call costs
        call()
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in calls}  # this process's CPU-s: on a loaded
    # machine wall time is mostly waiting for a core, CPU time (OpenMP spinning included) less so
    for round_ in range(args.repeats):
        for key, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            seconds[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
        print(f"round {round_ + 1}/{args.repeats} done", flush=True)
    print(f"{'dtype':<9} {'path':<35} {'t/s':>7} {'paired vs encode':>17} {'CPU ms/text':>12}")
    for (d, path), values in seconds.items():
        base = seconds[d, "encode, batch 32"]
        ratio = statistics.median(b / v for b, v in zip(base, values))
        per_text = 1e3 * statistics.median(cpu[d, path]) / len(texts)
        print(f"{d:<9} {path:<35} {len(texts) / statistics.median(values):>7.1f} {ratio:>17.3f} {per_text:>12.2f}")


if __name__ == "__main__":
    main()

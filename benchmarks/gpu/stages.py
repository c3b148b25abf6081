"""Where a request's time goes inside the service, stage by stage, in one process (issue 28: on a GPU the service
ran at 0.14-0.47 of bare in-process encode, docs/benchmarks.md, "glibc's heaps").

Each stage runs the service's own code on the rollout texts as the plug-ins send them, one stage at a time:
  parse     DiversityRequest.model_validate_json of the request body (the admission thread)
  tokenize  Backend.tokenize in the batcher's slices (the request threads, one at a time: the tokenizer's lock)
  rust      the fast tokenizer's own encode_batch on the same slices: what the Python around it costs, and
            whether its thread pool runs the slice in parallel
  pad       tokenizer.pad of each batch the batcher would build at max_batch_tokens (the forward thread)
  forward   the model on those padded batches, to unit rows on the CPU (the forward thread, device synchronised)
Printed and returned as milliseconds a text, beside the thread counts the tokenizer and torch use.

`python -m benchmarks.gpu.stages MODEL TEXTS.json [--one-arena]`: Backend.tokenize alone in a fresh process,
with glibc's single heap (what runtime.keep_freed_memory sets on a CPU with few threads) or glibc's
default; `arenas` runs both, interleaved: the tokenizer's threads all allocate, and one heap has one lock.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from benchmarks.gpu import sync
from setpo_server.backend import Backend
from setpo_server.batcher import TOKENIZE_SLICE
from setpo_server.runtime import keep_freed_memory, use_threads
from setpo_server.schemas import DiversityRequest
from setpo_server.settings import Settings


def batches(ids: list, budget: int) -> list[list]:
    """The batcher's packing for one job: longest first, while (count + 1) x longest fits the budget."""
    ordered = sorted(ids, key=len, reverse=True)
    out: list[list] = [[]]
    for row in ordered:
        if out[-1] and (len(out[-1]) + 1) * len(out[-1][0]) > budget:
            out.append([])
        out[-1].append(row)
    return out


def measure(model_dir: str, device: str, dtype: str, groups: list[list[str]], budgets: list[int]) -> dict:
    backend = Backend(Settings(model=model_dir, device=device, dtype=dtype))
    backend.warm_up()
    groups = [[text[: backend.max_chars] for text in group] for group in groups]  # as the plug-ins send them (/info)
    texts = [text for group in groups for text in group]
    body = json.dumps({"groups": [{"texts": group} for group in groups]})
    ms: dict[str, float] = {}  # stage -> milliseconds a text

    def timed(stage: str, work):
        sync()
        start = time.perf_counter()
        result = work()
        sync()
        ms[stage] = 1000 * (time.perf_counter() - start) / len(texts)
        return result

    def forward(padded: list) -> None:
        with torch.inference_mode():
            for features in padded:
                rows = backend.model.forward({k: v.to(backend.device) for k, v in features.items()})
                torch.nn.functional.normalize(rows["sentence_embedding"].float(), dim=-1).cpu()

    slices = [texts[start : start + TOKENIZE_SLICE] for start in range(0, len(texts), TOKENIZE_SLICE)]
    timed("parse", lambda: DiversityRequest.model_validate_json(body))
    ids = timed("tokenize", lambda: [row for part in slices for row in backend.tokenize(part)[0]])
    rust = backend._tokenizer.backend_tokenizer  # the Rust tokenizer under the lock's copy, truncation as set there
    timed("rust", lambda: [rust.encode_batch(part) for part in slices])
    for budget in budgets:
        packed = batches(ids, budget)
        padded = timed(
            f"pad_{budget}",
            lambda: [backend.model.tokenizer.pad({"input_ids": b}, return_tensors="pt") for b in packed],
        )
        forward(padded[:2])  # this budget's shapes once before timing them
        timed(f"forward_{budget}", lambda: forward(padded))
    tokens = sum(map(len, ids))
    row = {
        "texts": len(texts),
        "tokens": tokens,
        "dtype": dtype,
        **{f"{stage}_ms_per_text": value for stage, value in ms.items()},
        "torch_threads": torch.get_num_threads(),
        "rayon_threads": os.environ.get("RAYON_NUM_THREADS", "unset (all cores)"),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "unset"),
        "cpus": len(os.sched_getaffinity(0)),
    }
    print(
        f"  {len(texts)} texts, {tokens / len(texts):.0f} tok/text, ms a text: "
        + "  ".join(f"{stage} {value:.3f}" for stage, value in ms.items())
        + f"; torch threads {row['torch_threads']}, rayon {row['rayon_threads']}, {row['cpus']} cpus",
        flush=True,
    )
    return row


def arenas(model_dir: str, groups: list[list[str]], rounds: int) -> dict:
    """Backend.tokenize's ms a text in fresh processes, one glibc heap against glibc's default, interleaved."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as texts:
        json.dump([text for group in groups for text in group], texts)
        texts.flush()
        ms: dict[str, list[float]] = {"one_arena": [], "default_arenas": []}
        for _ in range(rounds):
            for name, flag in (("one_arena", ["--one-arena"]), ("default_arenas", [])):
                command = [sys.executable, "-m", "benchmarks.gpu.stages", model_dir, texts.name, *flag]
                ms[name].append(float(subprocess.run(command, check=True, capture_output=True, text=True).stdout))
    row = {f"tokenize_ms_per_text_{name}": min(values) for name, values in ms.items()}
    print("  tokenize, fresh process: " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()) + " ms/text", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("texts", type=argparse.FileType())
    parser.add_argument("--one-arena", action="store_true")
    args = parser.parse_args()
    # --one-arena: glibc's one heap, as the CPU service on 2 threads has it (set before any thread starts)
    if args.one_arena and not keep_freed_memory("cpu", 1):
        raise SystemExit("one heap is a glibc setting; this is not glibc")
    use_threads("auto")  # as setpo-server sizes the tokenizer's pool
    backend = Backend(Settings(model=args.model, device="cpu", dtype="float32"))
    texts = [text[: backend.max_chars] for text in json.load(args.texts)]  # as measure() and the plug-ins
    backend.tokenize(texts[:TOKENIZE_SLICE])
    start = time.perf_counter()
    for first in range(0, len(texts), TOKENIZE_SLICE):
        backend.tokenize(texts[first : first + TOKENIZE_SLICE])
    print(1000 * (time.perf_counter() - start) / len(texts))


if __name__ == "__main__":
    main()

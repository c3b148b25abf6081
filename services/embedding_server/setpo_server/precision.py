"""SETPO_DTYPE=auto on CPU: bfloat16 only where the CPU runs it natively, a probe at start measures it faster, and its
embeddings stay within SETPO_BF16_MIN_COSINE of float32's. A flag alone does not decide: with avx512_bf16 but no AMX
it served slower than float32 (docs/benchmarks.md, "bfloat16 on a CPU"). The measurement, not the decision, is kept in
SETPO_DTYPE_PROBE_CACHE under what it depends on (CPU, threads, torch, the model's weights), so a restart skips it.
"""

import copy
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

log = logging.getLogger("setpo_server")

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer  # heavy: the backend imports it off the event loop

NATIVE_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs with bfloat16 matrix instructions
MIN_SPEEDUP = 1.2  # below this the gain is within this VM's drift; float32 is the safer of two equals
ROUNDS = 3  # interleaved timing rounds per precision; the fastest of each counts
# What SetPO embeds: short Countdown answers, GSM8K-style reasoning, and one long text, so that the timing covers
# the batch shapes requests bring and the cosine check covers short and long inputs.
PROBE = [
    *(
        f"plan : add {a} and {b} , then multiply by {c} . <answer> ( {a} + {b} ) * {c} </answer>"
        for a, b, c in [(3, 5, 2), (7, 1, 4), (12, 6, 3), (9, 9, 2), (4, 17, 5), (8, 2, 11), (6, 13, 7), (15, 3, 4)]
    ),
    *(
        f"Natalia sold {n} clips in April and half as many in May. In May she sold {n} / 2 = {n // 2} clips, "
        f"so altogether she sold {n} + {n // 2} = {n + n // 2} clips. The answer is {n + n // 2}."
        for n in (48, 36, 52, 60, 18, 24, 90, 72)
    ),
    *(
        f"Step {i}: the train leaves at {i} o'clock and travels {10 * i} km at {5 * i} km/h, so it arrives "
        "2 hours later; adding the {i} minute stop, the whole trip takes two hours and {i} minutes."
        for i in range(1, 9)
    ),
    " ".join(f"Then we check case {i} and find that it holds because both sides equal {i * i}." for i in range(40)),
]


@dataclass(frozen=True)
class Decision:
    dtype: torch.dtype
    reason: str  # what /info and the start-up log say, e.g. "auto: bfloat16 (native amx_bf16), 2.9x, min cos 0.99996"
    speedup: float | None = None  # float32 time / bfloat16 time on the probe; None when not measured
    min_cosine: float | None = None


def cpuinfo_values(field: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The value of each `field` line of /proc/cpuinfo ("flags", "model name"), one per CPU; [] where it cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return []
    return [
        value.strip() for name, _, value in (line.partition(":") for line in text.splitlines()) if name.strip() == field
    ]


def native_bf16_flag(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first of NATIVE_FLAGS this CPU reports, or None (also where /proc/cpuinfo cannot be read)."""
    flags = {word for value in cpuinfo_values("flags", cpuinfo) for word in value.split()}
    return next((flag for flag in NATIVE_FLAGS if flag in flags), None)


def probe_key(model: "SentenceTransformer", flag: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """What the probe's measurement depends on, as one string: the CPU, its flag, torch and its threads, and a
    digest of every weight (a fine-tuned model at the same path is another model)."""
    weights = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        weights.update(name.encode())
        weights.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    cpu = next(iter(cpuinfo_values("model name", cpuinfo)), "unknown")
    return json.dumps([cpu, flag, torch.__version__, torch.get_num_threads(), weights.hexdigest()])


def cached_probe(cache: Path, key: str) -> tuple[float, float] | None:
    """(speedup, min cosine) kept for key, or None (no file, no entry, or an entry that cannot be read as one)."""
    try:
        entry = json.loads(cache.read_text())[key]
        return float(entry["speedup"]), float(entry["min_cosine"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def keep_probe(cache: Path, key: str, speedup: float, worst: float) -> None:
    """Adds key's measurement to the cache file, written whole and renamed into place (servers starting at once
    each write a complete file). A cache that cannot be written (a read-only file system) is only logged."""
    try:
        kept = json.loads(cache.read_text())
    except (OSError, ValueError):
        kept = {}
    kept = kept if isinstance(kept, dict) else {}
    kept[key] = {
        "speedup": speedup,
        "min_cosine": worst,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, prefix=cache.name, delete=False) as file:
            json.dump(kept, file, indent=1)
        os.replace(file.name, cache)
    except OSError as exc:
        log.info("the bfloat16 probe's measurement is not kept in %s: %s", cache, exc)


def measure(model: "SentenceTransformer", candidate: "SentenceTransformer") -> tuple[float, float]:
    """(float32 time / bfloat16 time, the worst cosine between their embeddings) on the probe texts."""
    features = model.tokenize(PROBE)
    times: dict[torch.dtype, float] = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    embeddings = {}
    for _ in range(ROUNDS):  # interleaved, so a slow moment of the machine hits both precisions
        for dtype, each in ((torch.float32, model), (torch.bfloat16, candidate)):
            started = time.perf_counter()
            with torch.inference_mode():
                embeddings[dtype] = each.forward(dict(features))["sentence_embedding"].float()
            times[dtype] = min(times[dtype], time.perf_counter() - started)
    cosine = torch.nn.functional.cosine_similarity(embeddings[torch.float32], embeddings[torch.bfloat16], dim=-1)
    return times[torch.float32] / times[torch.bfloat16], float(cosine.min())


def choose_cpu_dtype(
    model: "SentenceTransformer", flag: str | None, min_cosine: float, cache: Path | None = None
) -> tuple[Decision, "SentenceTransformer"]:
    """The decision for a float32 SentenceTransformer on CPU, and the model to serve (a bfloat16 copy or `model`).
    With a cache file, a measurement kept there for this CPU, torch and model is used instead of probing."""
    if flag is None:
        return Decision(
            torch.float32, f"auto: float32 (no native bfloat16: no {' or '.join(NATIVE_FLAGS)} flag)"
        ), model
    candidate = copy.deepcopy(model).to(torch.bfloat16)
    key = probe_key(model, flag) if cache else ""
    kept = cached_probe(cache, key) if cache else None
    speedup, worst = kept or measure(model, candidate)
    if cache and kept is None:
        keep_probe(cache, key, speedup, worst)
    measured = f"native {flag}, {speedup:.1f}x, min cos {worst:.5f}{', kept from an earlier start' if kept else ''}"
    if worst < min_cosine:
        return Decision(torch.float32, f"auto: float32 (bfloat16 {measured} < {min_cosine})", speedup, worst), model
    if speedup < MIN_SPEEDUP:
        return Decision(torch.float32, f"auto: float32 (bfloat16 {measured}: not faster)", speedup, worst), model
    return Decision(torch.bfloat16, f"auto: bfloat16 ({measured})", speedup, worst), candidate

"""setpo against its peers at their best, same model folder, same texts, one run: infinity-emb (its own server on
127.0.0.1, its own --dtype) and in-process SentenceTransformer.encode (sentence-transformers' length-sorted
batches of 32: the model's ceiling on this machine), each in float32 and in bfloat16 (--dtypes).

Throughput: each workload's texts (http_vs_inprocess.workloads(): GSM8K and Countdown) in one request (setpo
/v1/diversity with its groups, infinity /embeddings) or one encode call, in interleaved rounds: every round runs
every path once in every dtype, one after another (each path first embeds the workload's first 16 groups once,
to warm up). This VM's speed drifts by 10-20 % over minutes, so a ratio is the median of each round's own ratio
("paired": one round's calls share the drift); t/s are medians over rounds.
The six ratios, with both dtypes:
  setpo/infinity      per dtype   the peer goal (>= 1.2x), at equal precision
  setpo/in-process    per dtype   what serving costs (or its token-budget batches gain) over the bare model
  bf16/f32 setpo, bf16/f32 in-process   what bfloat16 gives the service and the bare model on this CPU; below 1
                                  where the CPU emulates it, which is why SETPO_DTYPE=auto reads the CPU's flags
                                  and measures (setpo_server/precision.py). infinity's own follows from these.
First the CPU's model, its relevant flags and what auto picks on it (precision.py's reader and decision).
Latency: one group of 6 GSM8K solutions per request, sent one after another, p50 of --latency-requests.

--compile runs both servers with their torch.compile option (setpo SETPO_COMPILE=true, infinity --compile);
the in-process model is not compiled. --quick: 2 rounds of each workload's first 2 groups and 5 latency
requests (6 min on the busy 2-core VM): it checks that everything runs, it measures nothing.

    python -m benchmarks.peer_infinity [--dtypes float32 bfloat16] [--repeats 5] [--compile] [--quick]
    (needs .venv-infinity: make bench builds it)

Where bfloat16 is emulated (AVX2 only) its rounds dominate and the run takes hours: docs/benchmarks.md, "bfloat16 on a CPU"
says how long, measured.
"""

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import torch

from benchmarks.http_vs_inprocess import workloads
from setpo_server.backend import embedded_model_path
from setpo_server.local import LocalServer, free_port
from setpo_server.precision import choose_cpu_dtype, cpuinfo_values, native_bf16_flag
from setpo_server.settings import Settings

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

INFINITY = Path(__file__).resolve().parents[1] / ".venv-infinity" / "bin" / "infinity_emb"
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # wide float32 GEMMs, then bfloat16 in hardware
PATHS = ("setpo", "infinity", "in-process")
WARM_GROUPS = 16  # each path embeds a workload's first 16 groups before its rounds (first-call costs)
Calls = dict[tuple[str, str], Callable[[], object]]  # (dtype, path) -> one timed call


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def post(http: httpx.Client, url: str, **body: object) -> None:
    http.post(url, json=body).raise_for_status()


def describe_cpu() -> str:
    flags = {word for value in cpuinfo_values("flags") for word in value.split()}
    listed = " ".join(f"{flag}:{'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)
    model = next(iter(cpuinfo_values("model name")), "unknown")
    capability = torch.backends.cpu.get_cpu_capability()
    return f"CPU: {model}, {os.cpu_count()} cores; {listed}; torch kernels: {capability}; torch {torch.__version__}"


@contextmanager
def infinity_server(model: str, dtype: str, compile: bool) -> Iterator[str]:
    """infinity-emb serving `model` on a free port; yields its URL at once (wait_healthy before using it)."""
    port = free_port()
    command = [str(INFINITY), "v2", "--model-id", model, "--engine", "torch", "--device", "cpu"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", dtype] + ["--compile"] * compile
    env = {**os.environ, "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


def wait_healthy(http: httpx.Client, url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"infinity at {url} did not start"
        time.sleep(0.5)


def paired(seconds: dict[tuple[str, str], list[float]], over: tuple[str, str], under: tuple[str, str]) -> float:
    """Median over rounds of `over`'s throughput divided by `under`'s in the same round."""
    return statistics.median(b / a for a, b in zip(seconds[over], seconds[under]))


def ratios(dtypes: list[str]) -> dict[str, tuple[tuple[str, str], tuple[str, str]]]:
    """Each ratio's name and its two (dtype, path)s; the six of the docstring when both dtypes run."""
    chosen = {f"setpo/infinity {d}": ((d, "setpo"), (d, "infinity")) for d in dtypes}
    chosen |= {f"setpo/in-process {d}": ((d, "setpo"), (d, "in-process")) for d in dtypes}
    if {"float32", "bfloat16"} <= set(dtypes):
        for path in ("setpo", "in-process"):
            chosen[f"bf16/f32 {path}"] = (("bfloat16", path), ("float32", path))
    return chosen


@dataclass
class Peers:
    """The three paths in each dtype, started: the setpo and infinity servers' URLs and the in-process models."""

    http: httpx.Client
    model: str
    setpo: dict[str, str]
    infinity: dict[str, str]
    local: dict[str, "SentenceTransformer"]

    def throughput(self, groups: list[list[str]]) -> Calls:
        texts = [t for g in groups for t in g]
        calls: Calls = {}
        for d in self.setpo:
            calls[d, "setpo"] = partial(
                post, self.http, self.setpo[d] + "/v1/diversity", groups=[{"texts": g} for g in groups]
            )
            calls[d, "infinity"] = partial(
                post, self.http, self.infinity[d] + "/embeddings", model=self.model, input=texts
            )
            calls[d, "in-process"] = partial(
                self.local[d].encode, texts, convert_to_tensor=True, normalize_embeddings=True
            )
        return calls

    def latency(self, group: list[str]) -> Calls:
        calls: Calls = {}
        for d in self.setpo:
            calls[d, "setpo /v1/diversity"] = partial(
                post, self.http, self.setpo[d] + "/v1/diversity", groups=[{"texts": group}]
            )
            calls[d, "setpo /v1/embeddings"] = partial(post, self.http, self.setpo[d] + "/v1/embeddings", input=group)
            calls[d, "infinity /embeddings"] = partial(
                post, self.http, self.infinity[d] + "/embeddings", model=self.model, input=group
            )
        return calls


def throughput(peers: Peers, chosen: dict[str, list[list[str]]], rounds: int, warm_groups: int) -> None:
    """Per workload: every path once on its first warm_groups groups, then `rounds` interleaved rounds of all of
    it; prints each path's t/s (median over rounds), then the paired ratios."""
    dtypes = list(peers.setpo)
    print(f"{'workload':<12} {'dtype':<9} {'texts':>6} {'setpo t/s':>10} {'infinity t/s':>13} {'in-process t/s':>15}")
    by_ratio: dict[str, dict[str, float]] = {ratio: {} for ratio in ratios(dtypes)}
    for name, groups in chosen.items():
        for call in peers.throughput(groups[:warm_groups]).values():
            call()
        calls = peers.throughput(groups)
        seconds: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
        for _ in range(rounds):
            for key, call in calls.items():
                seconds[key].append(timed(call))
        texts = sum(map(len, groups))
        for d in dtypes:
            tps = [texts / statistics.median(seconds[d, path]) for path in PATHS]
            print(f"{name:<12} {d:<9} {texts:>6} {tps[0]:>10.1f} {tps[1]:>13.1f} {tps[2]:>15.1f}")
        for ratio, (over, under) in ratios(dtypes).items():
            by_ratio[ratio][name] = paired(seconds, over, under)

    print("\nratios, paired (median of each round's own):")
    print(f"{'':<24}" + "".join(f"{name:>12}" for name in chosen))
    for ratio, by_workload in by_ratio.items():
        print(f"{ratio:<24}" + "".join(f"{by_workload[name]:>12.2f}" for name in chosen))


def latency(peers: Peers, requests: int) -> None:
    calls = peers.latency(workloads()["gsm8k-64x6"][0])
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    for _ in range(requests):
        for key, call in calls.items():
            seconds[key].append(timed(call))
    print("\none group of 6 GSM8K solutions per request, sequential:")
    for (d, path), values in seconds.items():
        p50, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
        print(f"  {d:<9} {path:<22} p50 {p50 * 1e3:7.1f} ms   p90 {p90 * 1e3:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    dtypes = ["float32", "bfloat16"]
    parser.add_argument("--dtypes", "--dtype", nargs="+", choices=dtypes, default=dtypes)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--latency-requests", type=int, default=40)
    parser.add_argument("--compile", action="store_true", help="both servers torch.compile their model")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 rounds of 2 groups a workload")
    args = parser.parse_args()
    rounds, groups, latency_requests = (2, 2, 5) if args.quick else (args.repeats, None, args.latency_requests)
    chosen = {name: all_groups[:groups] for name, all_groups in workloads().items()}

    from sentence_transformers import SentenceTransformer

    model = embedded_model_path()
    print(describe_cpu())
    local = {
        d: SentenceTransformer(model, device="cpu", model_kwargs={"dtype": getattr(torch, d)}) for d in args.dtypes
    }
    if "float32" in local:
        min_cosine = Settings.model_fields["bf16_min_cosine"].default
        print("SETPO_DTYPE=" + choose_cpu_dtype(local["float32"], native_bf16_flag(), min_cosine)[0].reason)
    print(f"dtypes: {' '.join(args.dtypes)}; servers compiled: {args.compile}; {rounds} interleaved rounds\n")
    with ExitStack() as stack, httpx.Client(timeout=600) as http:
        infinity = {d: stack.enter_context(infinity_server(model, d, args.compile)) for d in args.dtypes}
        setpo = {d: stack.enter_context(LocalServer(compile=args.compile, dtype=d)).url for d in args.dtypes}
        for url in infinity.values():
            wait_healthy(http, url)
        peers = Peers(http, model, setpo, infinity, local)
        throughput(peers, chosen, rounds, warm_groups=WARM_GROUPS)
        latency(peers, latency_requests)


if __name__ == "__main__":
    main()

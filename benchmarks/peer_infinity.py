"""setpo vs infinity-emb serving the same model folder on 127.0.0.1, same requests, same run.

Throughput: each workload's texts in one request (setpo /v1/diversity with its groups, setpo /v1/embeddings,
infinity /embeddings), alternating, median of --repeats. This VM's speed drifts by 10-20 % over minutes, so
the ratio is also given as the median of each repeat's own ratio ("paired"): adjacent calls share the drift.
Latency: one group of 6 texts per request, sent one after another, p50 of --latency-requests.
Goal: setpo >= 1.2x infinity's throughput at equal or better p50.

--compile runs both servers with their torch.compile option (setpo SETPO_COMPILE=true, infinity --compile).
--dtype runs both in that precision (setpo SETPO_DTYPE, infinity --dtype): bfloat16 is what a CPU with AMX
should serve in (docs/benchmarks.md section 9).

    python -m benchmarks.peer_infinity [--compile] [--dtype bfloat16]   (needs .venv-infinity: make bench builds it)
"""

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import httpx

from benchmarks.http_vs_inprocess import workloads
from setpo_server.backend import embedded_model_path
from setpo_server.local import LocalServer, free_port

INFINITY = Path(__file__).resolve().parents[1] / ".venv-infinity" / "bin" / "infinity_emb"


def timed(post) -> float:
    start = time.perf_counter()
    response = post()
    response.raise_for_status()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-requests", type=int, default=40)
    parser.add_argument("--compile", action="store_true", help="both servers torch.compile their model")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32", help="both servers' model precision"
    )
    args = parser.parse_args()
    model = embedded_model_path()
    port = free_port()
    env = {**os.environ, "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    command = [
        str(INFINITY),
        "v2",
        "--model-id",
        model,
        "--engine",
        "torch",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        args.dtype,
    ]
    infinity = subprocess.Popen(
        command + ["--compile"] * args.compile, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    peer = f"http://127.0.0.1:{port}"
    try:
        with LocalServer(compile=args.compile, dtype=args.dtype) as setpo, httpx.Client(timeout=600) as http:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if http.get(peer + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "infinity did not start"
                time.sleep(0.5)
            print(f"both servers compiled: {args.compile}, dtype: {args.dtype}")
            print(
                f"{'workload':<12} {'texts':>6} {'setpo diversity t/s':>20} {'setpo embeddings t/s':>21} {'infinity t/s':>13} {'ratio':>6} {'paired':>7}"
            )
            for name, groups in workloads().items():
                texts = [t for g in groups for t in g]
                calls = {
                    "diversity": lambda: http.post(
                        setpo.url + "/v1/diversity", json={"groups": [{"texts": g} for g in groups]}
                    ),
                    "embeddings": lambda: http.post(setpo.url + "/v1/embeddings", json={"input": texts}),
                    "infinity": lambda: http.post(peer + "/embeddings", json={"model": model, "input": texts}),
                }
                for call in calls.values():  # warm up each path once
                    timed(call)
                seconds: dict[str, list[float]] = {key: [] for key in calls}
                for _ in range(args.repeats):
                    for key, call in calls.items():
                        seconds[key].append(timed(call))
                tps = {key: len(texts) / statistics.median(values) for key, values in seconds.items()}
                paired = statistics.median(peer / ours for ours, peer in zip(seconds["diversity"], seconds["infinity"]))
                print(
                    f"{name:<12} {len(texts):>6} {tps['diversity']:>20.1f} {tps['embeddings']:>21.1f} {tps['infinity']:>13.1f} "
                    f"{tps['diversity'] / tps['infinity']:>6.2f} {paired:>7.2f}"
                )

            group = workloads()["gsm8k-64x6"][0]
            small = {
                "setpo /v1/diversity": lambda: http.post(
                    setpo.url + "/v1/diversity", json={"groups": [{"texts": group}]}
                ),
                "setpo /v1/embeddings": lambda: http.post(setpo.url + "/v1/embeddings", json={"input": group}),
                "infinity /embeddings": lambda: http.post(peer + "/embeddings", json={"model": model, "input": group}),
            }
            latency: dict[str, list[float]] = {key: [] for key in small}
            for _ in range(args.latency_requests):
                for key, call in small.items():
                    latency[key].append(timed(call))
            print("\none group of 6 GSM8K solutions per request, sequential:")
            for key, values in latency.items():
                print(
                    f"  {key:<22} p50 {statistics.median(values) * 1e3:7.1f} ms   p90 {statistics.quantiles(values, n=10)[-1] * 1e3:7.1f} ms"
                )
    finally:
        infinity.terminate()
        infinity.wait(30)


if __name__ == "__main__":
    main()

"""Load: many concurrent callers mixing every data route at a rate that overloads the queue, 127.0.0.1 only,
bounded in time. Raw callers record every answer; retrying callers (the real client) must finish all their
work. Quick form: tests/reliability/test_load.py; full form (64 callers, 120 s, so memory can be watched from minute 1 on): `make soak`, i.e.

    python -m tests.reliability.load --duration 120 --callers 64 --out out/soak/load.json --plot docs/figures/soak_rss.png
"""

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from setpo_client import AsyncSetpoClient
from setpo_server.local import LocalServer
from tests.reliability.hostile import Outcome, Watch, resident_mb


@dataclass
class LoadReport:
    statuses: dict[str, int] = field(default_factory=dict)
    missing_retry_after: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    retrying_done: int = 0
    retrying_asked: int = 0
    rss_mb: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, resident MB)

    def summary(self) -> dict:
        ok = sorted(self.latencies_ms)
        return {
            "statuses": self.statuses,
            "missing_retry_after": self.missing_retry_after,
            "p50_ms": statistics.median(ok) if ok else None,
            "p99_ms": ok[int(0.99 * (len(ok) - 1))] if ok else None,
            "retrying_done": self.retrying_done,
            "retrying_asked": self.retrying_asked,
            "rss_growth": self.rss_growth(),
        }

    def rss_growth(self, after: float = 60.0, window: float = 20.0) -> float:
        """Relative growth of resident memory's peak: the last `window` seconds' against the `window` seconds from
        `after` on (or the first sample's). Resident memory saw-tooths by ~20 % between the batcher's trims, so two
        single samples differ by where in a tooth each fell; a leak raises the peaks."""
        end = self.rss_mb[-1][0]
        start = [mb for t, mb in self.rss_mb if after <= t < min(after + window, end - window)] or [self.rss_mb[0][1]]
        return max(mb for t, mb in self.rss_mb if t >= end - window) / max(start) - 1


def request(kind: str, rng: random.Random) -> tuple[str, dict]:
    size = rng.randint(3, 8)
    tag = rng.randint(0, 10**9)  # mostly distinct texts: dedup must not make the load trivial
    if kind == "texts":
        return "/v1/diversity", {
            "groups": [
                {
                    "texts": [f"answer {tag}.{i}: " + "step " * rng.randint(5, 60) for i in range(size)],
                    "rewards": [rng.random() for _ in range(size)],
                }
                for _ in range(rng.randint(1, 4))
            ]
        }
    if kind == "embeddings":
        return "/v1/diversity", {
            "groups": [{"embeddings": [[rng.gauss(0, 1) for _ in range(32)] for _ in range(size)]}]
        }
    return "/v1/embeddings", {"input": [f"text {tag}.{i} " + "word " * rng.randint(5, 60) for i in range(size)]}


async def raw_caller(url: str, deadline: float, report: LoadReport, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while time.monotonic() < deadline:
            path, body = request(rng.choice(["texts", "embeddings", "openai"]), rng)
            start = time.perf_counter()
            try:
                response = await http.post(path, json=body)
            except httpx.TimeoutException:  # counted as an answer of its own: no 200, 429 or 503 within 120 s
                report.statuses["timeout"] = report.statuses.get("timeout", 0) + 1
                continue
            report.statuses[str(response.status_code)] = report.statuses.get(str(response.status_code), 0) + 1
            if response.status_code == 200:
                report.latencies_ms.append((time.perf_counter() - start) * 1e3)
            elif response.status_code in (429, 503):
                report.missing_retry_after += "retry-after" not in response.headers
                await asyncio.sleep(float(response.headers.get("retry-after", 1)) * rng.random())


async def retrying_caller(url: str, work: int, report: LoadReport, seed: int) -> None:
    rng = random.Random(seed)
    async with AsyncSetpoClient(url, max_retries=50, backoff=0.2, max_backoff=5.0, timeout=120) as client:
        for _ in range(work):
            report.retrying_asked += 1
            _, body = request("texts", rng)
            result = await client.diversity(body["groups"])
            report.retrying_done += all(len(g.marginals) >= 3 for g in result.groups)


async def sample_rss(pid: int, deadline: float, report: LoadReport, start: float) -> None:
    while time.monotonic() < deadline:
        report.rss_mb.append((time.monotonic() - start, resident_mb(pid)))
        await asyncio.sleep(1.0)


async def run_load(server: LocalServer, duration: float, callers: int, retrying: int = 4, work: int = 5) -> LoadReport:
    report = LoadReport()
    start = time.monotonic()
    deadline = start + duration
    tasks = [raw_caller(server.url, deadline, report, seed) for seed in range(callers)]
    tasks += [retrying_caller(server.url, work, report, 1000 + seed) for seed in range(retrying)]
    tasks.append(sample_rss(server.process.pid, deadline, report, start))
    await asyncio.gather(*tasks)
    return report


def plot_rss(report: LoadReport, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(*zip(*report.rss_mb), lw=1.5)
    ax.axvline(
        60, color="grey", ls="--", lw=1, label=f"minute 1; peak growth after it {report.rss_growth():.1%} (goal < 10 %)"
    )
    ax.set(
        xlabel="seconds",
        ylabel="server resident memory (MB)",
        ylim=(0, None),
        title=f"{args.callers} callers overloading a queue of {args.max_queue_texts} texts",
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    print(f"plot: {args.plot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--duration", type=float, default=120.0, help="at least 60 s; memory is compared from minute 1 on"
    )
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--max-queue-texts", type=int, default=512, help="small, so the load overloads the queue")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="write the server's resident memory over the run to this PNG")
    parser.add_argument("--dtype", default="auto", help="the server's SETPO_DTYPE (auto: its own default)")
    args = parser.parse_args()
    health = Outcome("load")  # /health latency from a prober process while the load runs
    with LocalServer(max_queue_texts=args.max_queue_texts, dtype=args.dtype) as server, Watch(server, health):
        info = httpx.get(f"{server.url}/info").json()
        report = asyncio.run(run_load(server, args.duration, args.callers, retrying=8, work=20))
    summary = {
        "dtype": f"{info['dtype']} ({info['dtype_reason']})",
        **report.summary(),
        **{key: value for key, value in health.summary().items() if key.startswith("health")},
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**summary, "rss_mb": report.rss_mb}, indent=1))
    if args.plot:
        plot_rss(report, args)
    failures = [
        *(["a 5xx or unexpected status"] if set(report.statuses) - {"200", "429", "503"} else []),
        *(["a 429/503 without Retry-After"] if report.missing_retry_after else []),
        *(["retrying callers did not finish all their work"] if report.retrying_done != report.retrying_asked else []),
        *(
            ["resident memory grew 10 % or more after minute 1"]
            if args.duration > 60 and report.rss_growth() >= 0.10
            else []
        ),
    ]
    if failures:
        raise SystemExit("load suite failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()

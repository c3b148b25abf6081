"""Hostile clients against one real server (127.0.0.1, default limits, a key set), bounded in count and time.

Each scenario runs while a watcher samples the server's resident memory and probes /health every 50 ms. For
each: the answers by status (no 5xx allowed), whether the process survived, its peak resident memory, /health
p50/p99, and for the big-job scenario the small callers' latency. Quick form: tests/reliability/test_hostile.py;
full form (`make soak`):

    python -m tests.reliability.hostile --full --out out/soak/hostile.json
"""

import argparse
import contextlib
import json
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from setpo_server.local import LocalServer
from tests.metrics import scrape
from tests.raw_http import embeddings_request

KEY = "hostile-suite-key-9d2c"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
OVERLAY_MEMORY_LIMIT_MB = 3 * 1024  # deploy/k8s/overlays/cpu: the pod's memory limit
WRITE_TIMED_OUT = "setpo_connections_write_timed_out_total"
HELD_AFTER_MB = 64  # what unread answers may leave resident once cut off (test_hostile.py, round two hold it)


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def resident_mb_once_back(pid: int, baseline_mb: float) -> float:
    """The process's resident MB once back within HELD_AFTER_MB of `baseline_mb`, or as it is after 10 s.

    The forward thread's once-a-second trim returns freed pages: a second or two when quiet, more beside other suites
    (a fixed 2 s flaked there; docs/development.md). It returns rather than raises, so that the full soak can report
    what a server with the limit off still holds."""
    deadline = time.monotonic() + 10
    while (held := resident_mb(pid)) - baseline_mb >= HELD_AFTER_MB and time.monotonic() < deadline:
        time.sleep(0.25)
    return held


@dataclass
class Outcome:
    name: str
    statuses: Counter = field(default_factory=Counter)
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float | None = None  # where a scenario measures what stays held once its callers are done
    health_ms: list[float] = field(default_factory=list)
    small_callers_ms: list[float] = field(default_factory=list)
    forward_ms: float | None = None  # the mean forward pass meanwhile (setpo_forward_seconds), to compare with
    seconds: float = 0.0

    def summary(self) -> dict:
        def percentile(values: list[float], q: float) -> float | None:
            return round(sorted(values)[int(q * (len(values) - 1))], 1) if values else None

        return {
            "scenario": self.name,
            "statuses": dict(self.statuses),
            "seconds": round(self.seconds, 1),
            "rss_before_mb": round(self.rss_before_mb),
            "rss_peak_mb": round(self.rss_peak_mb),
            "rss_after_mb": None if self.rss_after_mb is None else round(self.rss_after_mb),
            "health_p50_ms": percentile(self.health_ms, 0.5),
            "health_p99_ms": percentile(self.health_ms, 0.99),
            "health_max_ms": percentile(self.health_ms, 1.0),
            "small_p50_ms": percentile(self.small_callers_ms, 0.5),
            "small_max_ms": percentile(self.small_callers_ms, 1.0),
            "forward_mean_ms": self.forward_ms,
        }


# The /health prober runs in its own process: in this one, the hostile callers' threads would delay it for the GIL
# and their latency would be charged to the server.
PROBER = """
import sys, time, httpx
url, out = sys.argv[1], open(sys.argv[2], "w", buffering=1)
with httpx.Client(timeout=30) as http:
    while True:
        started = time.perf_counter()
        try:
            http.get(url + "/health").raise_for_status()
            out.write(f"{1000 * (time.perf_counter() - started)}\\n")
        except httpx.HTTPError:
            out.write("failed\\n")
        time.sleep(0.05)
"""


class Watch:
    """Samples resident memory (here) and /health latency (a prober process) until stopped."""

    def __init__(self, server: LocalServer, outcome: Outcome):
        self.server, self.outcome, self.stopping = server, outcome, threading.Event()
        outcome.rss_before_mb = outcome.rss_peak_mb = resident_mb(server.process.pid)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.probes = Path(tempfile.mkstemp(prefix="setpo-health-", suffix=".txt")[1])

    def run(self) -> None:
        while not self.stopping.is_set():
            self.outcome.rss_peak_mb = max(self.outcome.rss_peak_mb, resident_mb(self.server.process.pid))
            self.stopping.wait(0.05)

    def __enter__(self) -> "Watch":
        self.started = time.perf_counter()
        self.prober = subprocess.Popen([sys.executable, "-c", PROBER, self.server.url, str(self.probes)])
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join()
        self.prober.kill()
        self.prober.wait()
        lines = self.probes.read_text().split()
        self.outcome.health_ms = [float(line) for line in lines if line != "failed"]
        self.outcome.statuses["health failed"] += lines.count("failed")
        if not self.outcome.statuses["health failed"]:
            del self.outcome.statuses["health failed"]
        self.probes.unlink()
        self.outcome.seconds = time.perf_counter() - self.started


def post(
    server: LocalServer, path: str, body: bytes | dict, outcome: Outcome, headers: dict = AUTH, timeout: float = 1800
) -> None:
    try:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = httpx.post(server.url + path, content=content, headers=headers, timeout=timeout)
        outcome.statuses[str(response.status_code)] += 1
    except httpx.HTTPError as exc:
        outcome.statuses[type(exc).__name__] += 1


def amplification(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """Small bodies asking for huge work: duplicates, many tiny groups, one very wide embedding group."""
    post(server, "/v1/embeddings", {"input": ["a"] * 32768}, outcome)
    post(server, "/v1/diversity", {"groups": [{"texts": ["a"] * 256}] * 1024}, outcome)
    post(server, "/v1/diversity", {"groups": [{"texts": [f"{b} {i}" for i in range(3)]} for b in range(4096)]}, outcome)
    # zeros are 2 bytes a value in JSON, the most values a body can carry: the widest legal group (16384 dims,
    # 7.9 MB at 240 rows), then rows too wide to accept (7.8 MB), refused while they parse
    rows, dims = (240, 16384) if full else (64, 16384)
    post(
        server,
        "/v1/diversity",
        b'{"groups": [{"embeddings": [' + b",".join([b"[" + b",".join([b"0"] * dims) + b"]"] * rows) + b"]}]}",
        outcome,
    )
    dims = 1_300_000 if full else 1_000_000
    post(
        server,
        "/v1/diversity",
        b'{"groups": [{"embeddings": [' + b",".join([b"[" + b",".join([b"0"] * dims) + b"]"] * 3) + b"]}]}",
        outcome,
    )


def wrong_key_bodies(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """Concurrent 60 MB bodies with a wrong key: each must be refused before it is read."""
    body = b'{"groups": [{"texts": ["' + b"x" * (60 * 1024 * 1024) + b'"]}]}'
    with ThreadPoolExecutor(16 if full else 8) as pool:
        for _ in range(32 if full else 8):
            pool.submit(
                post,
                server,
                "/v1/diversity",
                body,
                outcome,
                {"Authorization": "Bearer wrong", "Content-Type": "application/json"},
            )


def slowloris(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """Connections that send their headers, or their body, a few bytes at a time."""
    count, seconds = (200, 40) if full else (50, 8)
    limits = httpx.get(server.url + "/info", headers=AUTH).json()["limits"]
    assert limits["header_timeout"] < seconds, "the header senders must outlast SETPO_HEADER_TIMEOUT"
    heads, bodies = [], []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        if i % 2:
            sock.sendall(
                b"POST /v1/diversity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + KEY.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
            )
            bodies.append(sock)
        else:
            sock.sendall(b"POST /v1/diversity HTTP/1.1\r\n")
            heads.append(sock)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        answered = set(select.select(heads + bodies, [], [], 0)[0])  # sending after the answer would reset it
        for sock in set(heads + bodies) - answered:
            with contextlib.suppress(OSError):
                sock.sendall(b"X-a: b\r\n" if sock in heads else b" ")
        time.sleep(1)
    answer_by = time.monotonic() + max(limits["receive_timeout"], limits["header_timeout"]) + 15
    # body senders: SETPO_RECEIVE_TIMEOUT (408) or SETPO_MAX_CONCURRENT_REQUESTS (503); header senders: 408 from
    # SETPO_HEADER_TIMEOUT, well within the scenario
    for sock in heads + bodies:
        sock.settimeout(max(0.1, answer_by - time.monotonic()))
        try:
            outcome.statuses[sock.recv(64).split(b" ")[1].decode()] += 1
        except (OSError, IndexError):
            outcome.statuses["no answer"] += 1
    for sock in heads + bodies:
        sock.close()


def huge_job_and_small_callers(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """One request of many distinct ~100-token texts; meanwhile one-group requests, their latency recorded."""
    rows = 8192 if full else 512
    texts = [f"response {i}: " + " ".join(f"step{(i * 7 + j) % 997}" for j in range(40)) for i in range(rows)]
    groups = [{"texts": texts[i : i + 8]} for i in range(0, rows, 8)]
    forwards_before = forward_totals(server)
    big = threading.Thread(target=post, args=(server, "/v1/diversity", {"groups": groups}, outcome))
    queued = scrape(server).get("setpo_queue_texts", 0.0)
    big.start()
    while big.is_alive() and scrape(server).get("setpo_queue_texts", 0.0) <= queued:  # until the big job is admitted
        time.sleep(0.05)
    small = 0
    while big.is_alive() or not small:  # at least one, however fast the big job went
        started = time.perf_counter()
        post(server, "/v1/diversity", {"groups": [{"texts": [f"small {small} {i}" for i in range(6)]}]}, outcome)
        outcome.small_callers_ms.append(1000 * (time.perf_counter() - started))
        small += 1
        time.sleep(0.3)
    big.join()
    (seconds, count), (seconds_before, count_before) = forward_totals(server), forwards_before
    outcome.forward_ms = round(1000 * (seconds - seconds_before) / (count - count_before), 1)


def forward_totals(server: LocalServer) -> tuple[float, float]:
    """(setpo_forward_seconds_sum, setpo_forward_seconds_count) from /metrics."""
    values = scrape(server)  # one scrape: the sum and the count of the same moment
    return values["setpo_forward_seconds_sum"], values["setpo_forward_seconds_count"]


def nan_flood(server: LocalServer, outcome: Outcome, full: bool) -> None:
    bodies = [
        b'{"groups": [{"embeddings": [[NaN, 1], [1, 2], [3, 4]]}]}',
        b'{"groups": [{"texts": ["a", "b", "c"], "rewards": [1e999, 0, 1]}]}',
        b'{"groups": [{"embeddings": [[Infinity, 1], [1, 2], [3, 4]]}], "weight": -Infinity}',
    ]
    with ThreadPoolExecutor(16) as pool:
        for i in range(600 if full else 120):
            pool.submit(post, server, "/v1/diversity", bodies[i % 3], outcome)


def disconnect_storm(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """Callers that send a big request and hang up half a second later; afterwards the service still answers."""

    def hang_up(i: int) -> None:
        texts = [f"storm {i} {j} " + "word " * 50 for j in range(1000)]
        try:
            httpx.post(server.url + "/v1/embeddings", json={"input": texts}, headers=AUTH, timeout=0.5)
        except httpx.TimeoutException:
            outcome.statuses["hung up"] += 1

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(hang_up, range(64 if full else 16)))
    post(server, "/v1/diversity", {"groups": [{"texts": ["after", "the", "storm"]}]}, outcome)


def endless_headers(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """Callers streaming one endless header line as fast as they can, reconnecting whenever they are cut off
    (the issue's probe: 288 MB in 12 s)."""
    callers, seconds = (4, 12) if full else (4, 4)
    header_timeout = httpx.get(server.url + "/info", headers=AUTH).json()["limits"]["header_timeout"]
    deadline = time.monotonic() + seconds

    def stream() -> None:
        while time.monotonic() < deadline:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
                while time.monotonic() < deadline:
                    sock.sendall(b"a" * 65536)
            # a caller cut short by its deadline below SETPO_MAX_HEADER_BYTES is owed 408 by the header clock: wait
            # past it (a wait equal to it lost that race on a loaded CI machine)
            sock.settimeout(header_timeout + 5)
            try:
                outcome.statuses[sock.recv(64).split(b" ")[1].decode()] += 1
            except (OSError, IndexError):
                outcome.statuses["no answer"] += 1
            sock.close()

    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(lambda _: stream(), range(callers)))


def leftover_bodies(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """Answered GETs whose Content-Length body keeps trickling in a byte a second: do they pin their sockets? (Each byte
    stops uvicorn's keep-alive timer; the header clock closes them.)"""
    count = 200 if full else 20
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc")
        socks.append(sock)
    closed: list[socket.socket] = []
    header_timeout = httpx.get(server.url + "/info", headers=AUTH).json()["limits"]["header_timeout"]
    deadline = time.monotonic() + header_timeout + 10  # well past the header clock, which they cannot stop
    while len(closed) < count and time.monotonic() < deadline:
        time.sleep(1)
        for sock in [sock for sock in socks if sock not in closed]:
            with contextlib.suppress(OSError):
                sock.sendall(b"x")
            if closed_by_server(sock):
                closed.append(sock)
    outcome.statuses["closed"] += len(closed)
    if len(closed) < count:
        outcome.statuses["still open"] += count - len(closed)
    for sock in socks:
        sock.close()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed (or reset) the connection; reads, without waiting, what it sent before."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True  # b"": closed
    except BlockingIOError:
        return False  # nothing more now, but the connection is open
    except OSError:
        return True  # reset: the server aborted it


def unread_answers(server: LocalServer, outcome: Outcome, full: bool) -> None:
    """Callers that ask for 16 MB answers (2048 copies of one text: cheap to compute) and never read them."""
    callers = 60 if full else 12
    write_timeout = httpx.get(server.url + "/info", headers=AUTH).json()["limits"].get("write_timeout", 30)
    body = b'{"input": [' + b",".join([b'"the same short text"'] * 2048) + b"]}"
    timed_out = scrape(server).get(WRITE_TIMED_OUT, 0.0)
    socks = []
    for _ in range(callers):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(embeddings_request(KEY, body))
        socks.append(sock)
    # every answer computed and cut off at its write deadline (or, with that limit off, long past where it would be).
    # Answers are built one at a time (routes.py), so on a loaded machine the last starts many seconds after the
    # first: wait while the cut-offs keep coming, until none has come for a write deadline and 10 s.
    patience = min(write_timeout, 60) + 10
    seen, progress_at = timed_out, time.monotonic()
    while (cut_off := scrape(server).get(WRITE_TIMED_OUT, 0.0)) < timed_out + callers:
        if cut_off > seen:
            seen, progress_at = cut_off, time.monotonic()
        elif time.monotonic() - progress_at > patience:
            break
        time.sleep(0.5)
    outcome.rss_after_mb = resident_mb_once_back(server.process.pid, outcome.rss_before_mb)
    for sock in socks:
        outcome.statuses["dropped" if closed_by_server(sock) else "still held"] += 1
        sock.close()


SCENARIOS = [
    amplification,
    wrong_key_bodies,
    slowloris,
    huge_job_and_small_callers,
    nan_flood,
    disconnect_storm,
    endless_headers,
    leftover_bodies,
    unread_answers,
]


def run_hostile(
    full: bool = False, only: list[str] | None = None, settings: dict | None = None
) -> tuple[list[Outcome], bool, str]:
    """Every scenario (or those named) against one server; returns the outcomes, whether the process survived,
    and its log. `settings` override the server's (e.g. a limit turned off, to measure what it prevents)."""
    outcomes = []
    # the quick form cuts slow senders and unread answers off sooner, so that it fits in make test
    quick = {} if full else {"receive_timeout": 5, "header_timeout": 5, "write_timeout": 3}
    with LocalServer(api_key=KEY, **{**quick, **(settings or {})}) as server:
        for scenario in [s for s in SCENARIOS if only is None or s.__name__ in only]:
            outcome = Outcome(scenario.__name__)
            with Watch(server, outcome):
                scenario(server, outcome, full)
            outcomes.append(outcome)
        alive = server.process.poll() is None
    return outcomes, alive, server.log()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the soak's sizes (minutes); default: the quick form")
    parser.add_argument("--out", type=Path, help="write the outcomes as JSON here")
    parser.add_argument("--only", nargs="+", choices=[s.__name__ for s in SCENARIOS], help="these scenarios alone")
    parser.add_argument(
        "--setting", nargs="+", default=[], metavar="NAME=VALUE", help="server settings, e.g. write_timeout=100000"
    )
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.setting)
    outcomes, alive, _ = run_hostile(args.full, args.only, settings)
    summaries = [outcome.summary() for outcome in outcomes]
    for summary in summaries:
        print(json.dumps(summary))
    all_health = [ms for outcome in outcomes for ms in outcome.health_ms]
    print(
        json.dumps(
            {"process_survived": alive, "health_p99_ms_overall": round(statistics.quantiles(all_health, n=100)[98], 1)}
        )
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"alive": alive, "scenarios": summaries}, indent=1))


if __name__ == "__main__":
    main()

"""Replicas (issues 37 and 39): one training step's rollout through SetpoShaper, the serial path (one service, one
request after another) against the same step fanned out by SetpoShaper itself: several requests in flight to one
service, to two services (SETPO_URL with two URLs; the default, one in flight each; and four in flight), and to two
at half the token budget each. On a GPU (`python -m benchmarks.gpu --sections replicas`) and on this machine's
CPU cores (benchmarks/replicas.py).

Interleaved rounds; the paired ratio is the median of each round's own ratio to the serial path; the bonuses of
every arrangement are compared with the serial path's (several services pack batches differently: float noise only).
"""

import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from setpo_client import SetpoClient
from setpo_client.shaping import SetpoShaper, text_chars
from setpo_server.local import LocalServer

# (label, the services its requests go to, requests in flight; None: SetpoShaper's default): services a and b at
# the budget, c and d at half
ARRANGEMENTS = [
    ("1 service, serial", "a", 1),
    ("1 service, 2 in flight", "a", 2),
    ("2 services, default (1 in flight each)", "ab", None),
    ("2 services, 4 in flight", "ab", 4),
    ("2 services at half budget, default", "cd", None),
]


def measure(
    model_dir: Path | str,
    device: str,
    dtype: str,
    groups: list[list[str]],
    rounds: int,
    budget: int,
    arrangements: list[tuple[str, str, int | None]] = ARRANGEMENTS,
    threads: int | str = "auto",
) -> dict:
    """Seconds a step for each arrangement, over interleaved rounds, and its paired ratio to the serial path."""
    budgets = {"a": budget, "b": budget, "c": budget // 2, "d": budget // 2}
    names = sorted({name for _, services, _ in arrangements for name in services})
    with ExitStack() as stack:
        servers = {
            name: LocalServer(
                model=model_dir, device=device, dtype=dtype, max_batch_tokens=budgets[name], threads=threads
            )
            for name in names
        }
        for server in servers.values():  # the model loads at once
            stack.callback(server.stop)
            server.start(wait=False)
        for server in servers.values():
            ready = f"{server.url}/ready"
            server.wait_until(lambda: httpx.get(ready, timeout=5).status_code == 200, 300)
        shapers = {}
        for label, services, in_flight in arrangements:
            client = stack.enter_context(SetpoClient(",".join(servers[name].url for name in services), timeout=600))
            shapers[label] = SetpoShaper(client, weight=0.05, on_error="fail", in_flight=in_flight)
        with SetpoClient(servers[names[0]].url) as client:
            limit = text_chars(client.info())
        groups = [[text[:limit] for text in group] for group in groups]
        for label, _, _ in arrangements:  # warm every service at these shapes
            shapers[label].score(groups[:64])
        times: dict[str, list[float]] = {label: [] for label, _, _ in arrangements}
        bonuses: dict[str, list[list[float]]] = {}
        requests: dict[str, float] = {}
        for _ in range(rounds):
            for label, _, _ in arrangements:
                start = time.perf_counter()
                step = shapers[label].score(groups)
                times[label].append(time.perf_counter() - start)
                bonuses[label], requests[label] = step.bonus, step.metrics["setpo/requests"]
    serial = arrangements[0][0]
    texts = sum(map(len, groups))
    rows = []
    for label, services, in_flight in arrangements:
        row = {
            "arrangement": label,
            "services": len(services),
            "in_flight": in_flight or len(services),
            "requests": requests[label],
            "max_batch_tokens": budgets[services[0]],
            "step_s": statistics.median(times[label]),
            "step_s_rounds": times[label],
            "paired_over_serial": statistics.median(t / s for t, s in zip(times[label], times[serial])),
            "bonus_max_abs_diff": max(
                abs(a - b) for x, y in zip(bonuses[label], bonuses[serial]) for a, b in zip(x, y, strict=True)
            ),
        }
        print(
            f"  {label:<40} {row['step_s']:>7.2f} s a step ({texts} texts)  x{row['paired_over_serial']:.3f} of "
            f"the serial path  bonus differs by <= {row['bonus_max_abs_diff']:.1e}",
            flush=True,
        )
        rows.append(row)
    return {
        "model": Path(model_dir).name,
        "dtype": dtype,
        "threads": threads,
        "texts": texts,
        "rounds": rounds,
        "rows": rows,
    }

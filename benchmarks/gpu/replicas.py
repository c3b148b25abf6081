"""Replicas on one GPU (issue 37, item 2): one training step's rollout through SetpoShaper, today's path (one
service, one request after another) against the same step with several requests in flight: to one service, to
two services on the same GPU, and to two at half the token budget each.

SetpoShaper sends a step's requests one after another (the fan-out is issue 39's); here the step is cut into
`in_flight` contiguous parts of about equal characters, each scored by its own SetpoShaper in its own thread,
parts dealt to the services in turn: what a fan-out with that many requests in flight would put on them.
Interleaved rounds; the paired ratio is the median of each round's own ratio to today's path; the bonuses of
every arrangement are compared with today's (several services pack batches differently: float noise only).
"""

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from itertools import pairwise
from pathlib import Path

import httpx

from setpo_client import SetpoClient
from setpo_client.shaping import SetpoShaper, text_chars
from setpo_server.local import LocalServer

# (label, the services its requests go to, requests in flight): services a and b at the budget, c and d at half
ARRANGEMENTS = [
    ("1 service, 1 in flight", "a", 1),
    ("1 service, 2 in flight", "a", 2),
    ("2 services, 2 in flight", "ab", 2),
    ("2 services, 4 in flight", "ab", 4),
    ("2 services at half budget, 2 in flight", "cd", 2),
]


def split(groups: list[list[str]], parts: int) -> list[slice]:
    """Contiguous slices of the groups, each about 1/parts of their characters (none empty)."""
    sizes = [sum(map(len, group)) for group in groups]
    total, bounds, running = sum(sizes), [0], 0
    for index, size in enumerate(sizes):
        running += size
        if len(bounds) < parts and running >= total * len(bounds) / parts and index + 1 < len(groups):
            bounds.append(index + 1)
    bounds.append(len(groups))
    return [slice(a, b) for a, b in pairwise(bounds)]


def step(shapers: list[SetpoShaper], groups: list[list[str]], in_flight: int) -> list[list[float]]:
    """The step's bonuses, its parts scored at once, part k by shapers[k % len(shapers)]."""
    parts = split(groups, in_flight)
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        answers = list(pool.map(lambda k: shapers[k % len(shapers)].score(groups[parts[k]]), range(len(parts))))
    return [bonus for answer in answers for bonus in answer.bonus]


def measure(model_dir: Path, device: str, dtype: str, groups: list[list[str]], rounds: int, budget: int) -> dict:
    """Seconds a step for each arrangement, over interleaved rounds, and its paired ratio to today's path."""
    budgets = {"a": budget, "b": budget, "c": budget // 2, "d": budget // 2}
    with ExitStack() as stack:
        servers = {
            name: LocalServer(model=model_dir, device=device, dtype=dtype, max_batch_tokens=tokens)
            for name, tokens in budgets.items()
        }
        for server in servers.values():  # four model loads at once
            stack.callback(server.stop)
            server.start(wait=False)
        clients = {}
        for name, server in servers.items():
            ready = f"{server.url}/ready"
            server.wait_until(lambda: httpx.get(ready, timeout=5).status_code == 200, 300)
            clients[name] = stack.enter_context(SetpoClient(server.url, timeout=600))
        # a shaper a (service, slot): requests in flight to one service each get their own connection
        shapers = {
            label: [SetpoShaper(clients[names[k % len(names)]], weight=0.05, on_error="fail") for k in range(parts)]
            for label, names, parts in ARRANGEMENTS
        }
        limit = text_chars(clients["a"].info())
        groups = [[text[:limit] for text in group] for group in groups]
        for label, _, parts in ARRANGEMENTS:  # warm every service at these shapes
            step(shapers[label], groups[:64], parts)
        times: dict[str, list[float]] = {label: [] for label, _, _ in ARRANGEMENTS}
        bonuses: dict[str, list[list[float]]] = {}
        for _ in range(rounds):
            for label, _, parts in ARRANGEMENTS:
                start = time.perf_counter()
                bonuses[label] = step(shapers[label], groups, parts)
                times[label].append(time.perf_counter() - start)
    serial = ARRANGEMENTS[0][0]
    texts = sum(map(len, groups))
    rows = []
    for label, names, parts in ARRANGEMENTS:
        row = {
            "arrangement": label,
            "services": len(names),
            "in_flight": parts,
            "max_batch_tokens": budgets[names[0]],
            "step_s": statistics.median(times[label]),
            "step_s_rounds": times[label],
            "paired_over_serial": statistics.median(t / s for t, s in zip(times[label], times[serial])),
            "bonus_max_abs_diff": max(
                abs(a - b) for x, y in zip(bonuses[label], bonuses[serial]) for a, b in zip(x, y, strict=True)
            ),
        }
        print(
            f"  {label:<40} {row['step_s']:>7.2f} s a step ({texts} texts)  x{row['paired_over_serial']:.3f} of "
            f"today's path  bonus differs by <= {row['bonus_max_abs_diff']:.1e}",
            flush=True,
        )
        rows.append(row)
    return {"model": model_dir.name, "dtype": dtype, "texts": texts, "rounds": rounds, "rows": rows}

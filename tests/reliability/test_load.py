"""Quick form of the load suite (the full one is `make soak`): overload answers 429 + Retry-After, never 5xx."""

import asyncio

from setpo_server.local import LocalServer
from tests.reliability.load import run_load


def test_overload_is_answered_with_429_and_retry_after_and_retrying_clients_finish():
    with LocalServer(max_queue_texts=128) as server:
        report = asyncio.run(run_load(server, duration=12, callers=32, retrying=4, work=3))
    summary = report.summary()
    assert set(report.statuses) <= {"200", "429", "503"}, summary  # no 5xx, no other error
    assert report.statuses.get("429", 0) > 0, "the load never overloaded the queue: it tests nothing"
    assert report.statuses.get("200", 0) > 0 and report.missing_retry_after == 0
    assert report.retrying_done == report.retrying_asked == 12  # 100 % of the retrying callers' work
    # Resident memory from minute 1 to the end needs a longer run: `make soak` checks it (tests/reliability/load.py).

"""A dead batcher, a device error or a hung forward pass stops the service (503 to the callers, /ready 503, exit non-zero) instead of
leaving it alive behind a 200. The faults are injected into the real server through its own classes."""

import contextlib
import sys
import time

import httpx

from setpo_server.local import LocalServer


def serve_with(patch: str, **settings: object) -> LocalServer:
    """The real setpo-server, with `patch` (Python) applied to its modules first."""
    return LocalServer(
        command=[sys.executable, "-c", f"{patch}\nfrom setpo_server.cli import main\nmain()"], **settings
    )


DEVICE_ERROR = """
from setpo_server.backend import Backend
encode = Backend.encode
def failing(self, ids):  # the warm-up runs batches of 1 and 2 texts; the test sends 5
    if len(ids) == 5:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return encode(self, ids)
Backend.encode = failing
"""

FORWARD_HANG = """
import threading
from setpo_server.backend import Backend
encode = Backend.encode
def hanging(self, ids):  # a stuck device or driver: the forward pass never returns
    if len(ids) == 6:
        threading.Event().wait()
    return encode(self, ids)
Backend.encode = hanging
"""

BATCHER_BUG = """
from setpo_server.batcher import Batcher
next_batch = Batcher._next_batch
def failing(self):
    if any(len(job.texts) == 7 for job in self._jobs):
        raise KeyError("injected bug")
    return next_batch(self)
Batcher._next_batch = failing
"""


def test_a_device_error_fails_the_request_with_503_and_the_process_exits_non_zero():
    with serve_with(DEVICE_ERROR) as server:
        response = httpx.post(
            server.url + "/v1/embeddings", json={"input": [f"text {i}" for i in range(5)]}, timeout=60
        )
        assert response.status_code == 503 and "retry-after" in response.headers
        assert "CUDA error" in response.json()["error"]["message"]
        assert server.process.wait(timeout=60) == 1
    assert "batcher stopped" in server.log() and "fatal failure" in server.log()


def test_a_dead_batcher_turns_ready_503_and_the_process_exits_non_zero():
    with serve_with(BATCHER_BUG) as server:
        response = httpx.post(
            server.url + "/v1/diversity", json={"groups": [{"texts": [f"t{i}" for i in range(7)]}]}, timeout=60
        )
        assert response.status_code == 503 and "injected bug" in response.json()["error"]["message"]
        with contextlib.suppress(httpx.TransportError):  # the process is stopping; if /ready answers, it says 503
            assert httpx.get(server.url + "/ready", timeout=5).status_code == 503
        assert server.process.wait(timeout=60) == 1


def test_a_hung_forward_pass_fails_the_waiting_requests_with_503_and_the_process_exits_non_zero():
    """Without a deadline every request would wait behind the stuck pass forever while /ready said 200."""
    with serve_with(FORWARD_HANG, forward_timeout=3) as server:
        started = time.monotonic()
        response = httpx.post(
            server.url + "/v1/embeddings", json={"input": [f"text {i}" for i in range(6)]}, timeout=60
        )
        assert response.status_code == 503 and "retry-after" in response.headers
        assert "SETPO_FORWARD_TIMEOUT=3" in response.json()["error"]["message"]
        assert time.monotonic() - started < 20
        assert server.process.wait(timeout=60) == 1  # exits although the forward thread never returns
    assert "fatal failure" in server.log()

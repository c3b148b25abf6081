"""The client's retry policy against a real server that goes away and comes back."""

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from setpo_client import AsyncSetpoClient, SetpoAPIError, SetpoClient, SetpoConnectionError, SetpoTimeoutError
from setpo_client.client import backoff_delay
from setpo_server.local import LocalServer, free_port
from tests.metrics import metric

GROUP = {"texts": ["one way", "another way", "a third way"]}


def test_backoff_grows_exponentially_with_jitter_capped_and_honours_retry_after():
    for attempt in range(8):
        ceiling = min(4.0, 0.25 * 2**attempt)
        delays = [backoff_delay(attempt, 0.25, 4.0) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered, not lockstep
    assert backoff_delay(0, 0.25, 8.0, retry_after="7") == 7.0
    assert backoff_delay(0, 0.25, 4.0, retry_after="50000") == 4.0  # an estimate of hours is capped
    assert backoff_delay(0, 0.25, 4.0, retry_after="Wed, 21 Oct 2015 07:28:00 GMT") <= 0.25


def test_client_rides_out_a_server_restart():
    port = free_port()
    first = LocalServer(port=port, dtype="float32").start()
    with SetpoClient(first.url) as client:
        before = client.diversity([GROUP]).groups[0].marginals
    first.stop()

    outcome = {}

    def call():  # retries for as long as the model takes to load, on any CPU (up to 200 rounds of at most 2 s)
        with SetpoClient(first.url, max_retries=200, backoff=0.25, max_backoff=2.0) as client:
            outcome["marginals"] = client.diversity([GROUP]).groups[0].marginals

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(1.5)  # the caller is now retrying against a closed port
    assert caller.is_alive()
    second = LocalServer(port=port, dtype="float32").start(
        wait=False
    )  # answers 503 + Retry-After while it loads, then 200
    try:
        caller.join(timeout=600)
        assert outcome["marginals"] == pytest.approx(before, abs=1e-6)
    finally:
        second.stop()


def test_gives_up_after_a_bounded_number_of_retries():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    start = time.monotonic()
    with (
        SetpoClient(url, max_retries=3, backoff=0.2) as client,
        pytest.raises(SetpoConnectionError, match="after 4 attempts"),
    ):
        client.diversity([GROUP])
    assert 0.7 <= time.monotonic() - start < 10  # 0.1-0.2 + 0.2-0.4 + 0.4-0.8 s of backoff

    async def async_call():
        async with AsyncSetpoClient(url, max_retries=2, backoff=0.1) as client:
            await client.diversity([GROUP])

    with pytest.raises(SetpoConnectionError, match="after 3 attempts"):
        asyncio.run(async_call())


def test_a_4xx_is_raised_at_once_not_retried(service):
    def count_422() -> float:
        return metric(service, 'setpo_requests_total{route="/v1/diversity",status="422"}')

    before = count_422()
    with service.client(max_retries=5) as client, pytest.raises(SetpoAPIError, match="at least 3"):
        client.diversity([{"texts": ["a", "b"]}])
    assert count_422() - before == 1


def test_a_slow_answer_is_a_timeout_error_not_a_hang():
    """An answer that never comes (the server took the request and works on, or hangs): a SetpoTimeoutError at the
    read timeout, never a hang."""
    answered = threading.Event()

    class Silent(BaseHTTPRequestHandler):
        def do_POST(self):
            answered.wait(60)  # holds the request until the test is done with it

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Silent) as silent:
        threading.Thread(target=silent.serve_forever, daemon=True).start()
        start = time.monotonic()
        url = f"http://127.0.0.1:{silent.server_port}"
        with SetpoClient(url, timeout=httpx.Timeout(10.0, read=0.2)) as client, pytest.raises(SetpoTimeoutError):
            client.embeddings(["a text"])
        assert time.monotonic() - start < 30  # the read timeout, not the server's 60 s
        answered.set()
        silent.shutdown()


def test_local_type_errors_fail_before_any_request():
    with (
        SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=0) as client,
        pytest.raises(ValueError, match="lambda"),
    ):
        client.diversity([{**GROUP, "lambda": 0.1}])

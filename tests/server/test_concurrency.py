"""Many callers at once: same answers as one caller, batches coalesced and deduplicated, overload is a 429.
In-process (tests/inprocess.py: callers in threads and on their own event loop, the app's batcher on its loop); a
caller who hangs up needs a real connection to drop, so that one runs against the real server."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from setpo_client import SetpoAPIError, SetpoClient, SetpoTimeoutError
from tests.inprocess import InProcessService
from tests.metrics import metric


def requests_for(n: int) -> list[list[dict]]:
    return [
        [
            {
                "texts": [f"solution {i}.{j}: {'step ' * (i + j)}answer {i * j}" for j in range(6)],
                "rewards": [1, 0, 1, 0, 0, 1],
            }
        ]
        for i in range(n)
    ]


def test_concurrent_callers_get_the_answers_a_lone_caller_gets(service):
    requests = requests_for(12)
    with service.client() as client:
        alone = [client.diversity(groups).groups[0].advantages for groups in requests]

    def call(groups):
        with service.client() as client:
            return client.diversity(groups).groups[0].advantages

    with ThreadPoolExecutor(12) as pool:
        threaded = list(pool.map(call, requests))

    async def gather():
        async with service.async_client() as client:
            return [r.groups[0].advantages for r in await asyncio.gather(*(client.diversity(g) for g in requests))]

    for answers in (threaded, asyncio.run(gather())):
        assert all(a == pytest.approx(b, abs=1e-6) for a, b in zip(answers, alone))


# Far above what the slowest CPU a test runs on needs for the work a test here asks for: tests wait for events, and
# this bounds each wait only so that a broken service fails the test instead of hanging it.
PATIENCE = 600


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {PATIENCE} s"
        time.sleep(0.02)


def test_requests_queued_behind_a_running_batch_share_one_forward_and_dedup():
    with InProcessService(max_batch_tokens=2048) as service:
        long_texts = [f"draft {i} " + "step by step " * 120 for i in range(32)]  # 256 tokens each: 4 batches of 8
        forwards, dedup = metric(service, "setpo_batch_size_count"), metric(service, "setpo_texts_deduplicated_total")
        timed, model_seconds = (
            metric(service, "setpo_forward_seconds_count"),
            metric(service, "setpo_forward_seconds_sum"),
        )
        # The forward thread is held until every request below is queued. A fixed wait used to stand in for that;
        # under load the big job could end before the ten small requests had all come, and they took two forwards.
        gate = threading.Event()
        service.state.batcher._forward_thread.submit(gate.wait)
        big = threading.Thread(target=lambda: service.client(timeout=PATIENCE).embeddings(long_texts))
        shared = ["the same first answer", "the same second answer", "the same third answer"]
        small = [[{"texts": shared + [f"own answer {i}.{j}" for j in range(3)]}] for i in range(10)]
        with ThreadPoolExecutor(10) as pool:
            try:  # a failure here must not leave the forward thread, and so the service's close, waiting
                big.start()
                # the big job's first two batches are handed to the forward thread; the rest queue behind
                wait_for(lambda: metric(service, "setpo_queue_texts") >= 32, "the big job queued")
                answers = [
                    pool.submit(lambda groups=groups: service.client(timeout=PATIENCE).diversity(groups))
                    for groups in small
                ]
                wait_for(lambda: metric(service, "setpo_queue_texts") >= 32 + 10 * 6, "the small requests queued")
            finally:
                gate.set()
            results = [answer.result() for answer in answers]
        big.join()
        assert all(len(r.groups[0].marginals) == 6 for r in results)
        assert metric(service, "setpo_batch_size_count") - forwards == 4 + 1  # the ten small requests: one forward
        assert metric(service, "setpo_forward_seconds_count") - timed == 4 + 1  # each forward pass timed once
        assert metric(service, "setpo_forward_seconds_sum") > model_seconds
        assert metric(service, "setpo_texts_deduplicated_total") - dedup == 10 * 3 - 3


@pytest.fixture(scope="module")
def small_queue():
    # One text per forward pass keeps the model busy long enough to fill the queue on purpose.
    with InProcessService(max_queue_texts=64, max_batch_tokens=256) as service:
        yield service


def test_full_queue_is_429_with_retry_after_and_the_service_recovers(small_queue):
    """A running job counts against the queue until its last text is embedded: while 64 texts are in progress (the
    forward thread held, so that they are, however fast the CPU), a second request of 64 is refused, and admitted once
    they are done."""
    texts = lambda tag: [f"{tag} text number {i}" for i in range(64)]  # noqa: E731
    gate = threading.Event()
    small_queue.state.batcher._forward_thread.submit(gate.wait)
    running = threading.Thread(target=lambda: small_queue.client(timeout=PATIENCE).embeddings(texts("running")))
    try:
        running.start()
        wait_for(lambda: metric(small_queue, "setpo_queue_texts") == 64, "the first request queued")
        with small_queue.http() as http:
            refused = http.post("/v1/embeddings", json={"input": texts("second")})
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert "SETPO_MAX_QUEUE_TEXTS=64" in refused.json()["error"]["message"]
        with pytest.raises(SetpoAPIError) as caught:
            small_queue.client(max_retries=0).embeddings(texts("third"))
        assert caught.value.status == 429
    finally:
        gate.set()
    running.join()
    with small_queue.http(timeout=PATIENCE) as http:
        assert http.post("/v1/embeddings", json={"input": texts("second")}).status_code == 200


def test_retrying_clients_finish_all_their_work_through_overload(small_queue):
    before = metric(small_queue, 'setpo_requests_total{route="/v1/diversity",status="429"}')
    start = threading.Barrier(8)

    def worker(w: int) -> int:
        done = 0
        with small_queue.client(max_retries=30, backoff=0.1, max_backoff=1.0) as client:
            start.wait()
            for r in range(3):
                result = client.diversity([{"texts": [f"worker {w} request {r} answer {j}" for j in range(20)]}])
                done += len(result.groups[0].marginals) == 20
        return done

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(worker, range(8))) == 8 * 3
    assert (
        metric(small_queue, 'setpo_requests_total{route="/v1/diversity",status="429"}') > before
    )  # retries were needed


def test_work_of_a_caller_who_hangs_up_is_dropped_not_computed(server):
    texts = [f"abandoned {i} " + "word " * 250 for i in range(320)]  # 40 forward batches of 8 texts on CPU
    forwards = metric(server, "setpo_batch_size_count")
    hung_up = 'setpo_requests_total{route="/v1/embeddings",status="499"}'
    before = metric(server, hung_up)
    with SetpoClient(server.url, timeout=httpx.Timeout(10.0, read=0.3)) as client, pytest.raises(SetpoTimeoutError):
        client.embeddings(texts)
    server.wait_until(lambda: metric(server, hung_up) > before, timeout=PATIENCE)  # the server noticed
    noticed = metric(server, "setpo_batch_size_count")
    server.wait_until(lambda: metric(server, "setpo_queue_texts") == 0, timeout=PATIENCE)  # and dropped the job
    # the batches already handed to the forward thread (two) run; no other does
    assert metric(server, "setpo_batch_size_count") - noticed <= 2
    assert metric(server, "setpo_batch_size_count") - forwards < 40
    assert httpx.post(server.url + "/v1/embeddings", json={"input": "still serving"}).status_code == 200

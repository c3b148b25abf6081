"""Faults during real work: the service killed and restarted mid-training, SIGTERM with requests in flight,
a service slower than the client's timeout. Training must finish, lose no step, count its fallbacks."""

import signal
import sys
import threading
import time

import httpx
import pytest

from setpo_client import SetpoClient, SetpoError
from setpo_client.shaping import SetpoShaper
from setpo_server.local import LocalServer, free_port
from setpo_trainer import bandit
from tests.metrics import metric, scrape


class KillAndRestart:
    """Wraps the real shaper of a run: SIGKILLs the service before step `kill_at`, starts a new one on the same
    port at once (it answers 503 while it loads), and before step `ready_by` waits until that one is ready."""

    def __init__(self, shaper: SetpoShaper, server: LocalServer, kill_at: int, ready_by: int):
        self.shaper, self.server, self.kill_at, self.ready_by, self.calls = shaper, server, kill_at, ready_by, 0

    def score(self, groups, **policy_inputs):
        if self.calls == self.kill_at:
            self.server.stop(signal.SIGKILL)
            self.server.start(wait=False)
        if self.calls == self.ready_by:
            self.server.wait_until(lambda: httpx.get(self.server.url + "/ready").status_code == 200)
        self.calls += 1
        return self.shaper.score(groups, **policy_inputs)


def test_bandit_training_survives_the_service_being_killed_and_restarted():
    server = LocalServer(port=free_port()).start()
    try:
        client = SetpoClient(server.url, max_retries=1, backoff=0.05, max_backoff=0.1, timeout=30)
        shaper = SetpoShaper(client, weight=2.0, on_error="skip")
        args = bandit.parse_args(["--url", server.url, "--out", "unused", "--steps", "120"])
        run = bandit.train(args, KillAndRestart(shaper, server, kill_at=30, ready_by=90), seed=0)
    finally:
        server.stop()
    weights = [step["setpo/weight"] for step in run["metrics"]]
    assert len(run["probs"]) == 121 and len(weights) == 120  # every step ran: none lost
    assert weights[:30] == [2.0] * 30  # shaped before the kill
    assert 0.0 in weights[30:90]  # fell back while it was down
    assert weights[90:] == [2.0] * 30  # shaping resumed after the restart
    assert run["metrics"][-1]["setpo/fallback_steps"] == weights.count(0.0) == shaper.fallback_steps > 0


# Each forward pass of the server below takes a second more than its work: a request of four batches is still in
# flight when SIGTERM comes after its first, on any CPU, and the rest drains well within uvicorn's 30 s.
SLOW_FORWARDS = """
import time
from setpo_server.backend import Backend
encode = Backend.encode
def slow(self, ids):
    time.sleep(1.0)
    return encode(self, ids)
Backend.encode = slow
from setpo_server.cli import main
main()
"""


def test_sigterm_drains_requests_in_flight_before_exiting():
    server = LocalServer(command=[sys.executable, "-c", SLOW_FORWARDS], max_batch_tokens=256).start()
    texts = [f"draft {i} " + "word " * 50 for i in range(16)]  # 4 tokens short of 64: four a forward pass
    answer = {}
    caller = threading.Thread(
        target=lambda: answer.update(r=httpx.post(server.url + "/v1/embeddings", json={"input": texts}, timeout=120))
    )
    caller.start()
    server.wait_until(lambda: "setpo_queue_texts" in scrape(server) and _embedding(server))
    code = server.stop(signal.SIGTERM, timeout=120)
    caller.join(timeout=120)
    assert answer["r"].status_code == 200 and len(answer["r"].json()["data"]) == 16
    assert server.log().index("Shutting down") < server.log().index('"POST /v1/embeddings')  # drained, not done before
    assert code == -signal.SIGTERM  # exited cleanly, after the drain
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/health", timeout=2)


def _embedding(server: LocalServer) -> bool:
    """True once the model is busy with the request (its first forward pass has been counted)."""
    return metric(server, "setpo_batch_size_count") > 0


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_a_service_slower_than_the_client_timeout_gives_the_policy_not_a_hang(server, policy):
    slow = [[f"draft {g}.{i} " + "word " * 200 for i in range(40)] for g in range(4)]  # seconds to embed
    client = SetpoClient(server.url, timeout=httpx.Timeout(10.0, read=0.3))
    shaper = SetpoShaper(client, weight=0.1, on_error=policy)
    start = time.perf_counter()
    if policy == "skip":
        step = shaper.score(slow)
        assert step.metrics["setpo/weight"] == 0.0 and shaper.fallback_steps == 1
    else:
        with pytest.raises(SetpoError, match="on_error='fail'"):
            shaper.score(slow)
    assert time.perf_counter() - start < 5

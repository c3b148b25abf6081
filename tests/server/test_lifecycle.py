"""Start-up and shut-down: /health at once, /ready (and data routes) 503 until warm, bad models fail fast."""

import gc
import signal
import time

import httpx
import pytest

from setpo_server.local import LocalServer
from tests.metrics import metric


def test_ready_is_503_with_retry_after_until_the_model_is_warm():
    server = LocalServer().start(wait=False)
    try:
        server.wait_until(lambda: httpx.get(server.url + "/health").status_code == 200)
        # The port opens before the model starts loading (sentence-transformers alone takes seconds to import).
        early = httpx.get(server.url + "/ready")
        data = httpx.post(server.url + "/v1/diversity", json={"groups": [{"texts": ["a", "b", "c"]}]})
        assert early.status_code == 503 and int(early.headers["retry-after"]) > 0
        assert "loading" in early.json()["error"]["message"]
        assert data.status_code == 503 and "retry-after" in data.headers
        server.wait_until(lambda: httpx.get(server.url + "/ready").status_code == 200)
        assert (
            httpx.post(server.url + "/v1/diversity", json={"groups": [{"texts": ["a", "b", "c"]}]}).status_code == 200
        )
        assert metric(server, "setpo_ready") == 1
    finally:
        assert server.stop() == -signal.SIGTERM  # a graceful stop: uvicorn exits by the signal it was sent


def test_a_server_not_ready_in_time_is_stopped_not_left_running():
    """`with LocalServer()` never reaches __exit__ when start() raises: start() itself must not leave the process
    behind (a leaked server loads the machine for the rest of the run)."""
    server = LocalServer()
    with pytest.raises(TimeoutError):
        server.start(timeout=0.2)  # the model cannot load in 0.2 s
    assert server.process is not None and server.process.poll() is not None


def test_a_model_that_cannot_load_stops_the_server_with_the_reason():
    server = LocalServer(model="/nonexistent/embedding-model").start(wait=False)
    started = time.monotonic()
    code = server.process.wait(timeout=120)
    assert code != 0 and time.monotonic() - started < 120
    assert "cannot load model" in server.log() and "/nonexistent/embedding-model" in server.log()


def test_bad_setting_is_refused_before_start():
    server = LocalServer(max_batch_tokens=0, shape="cubic").start(wait=False)
    assert server.process.wait(timeout=60) != 0
    log = server.log()
    assert "SETPO_MAX_BATCH_TOKENS" in log and "SETPO_SHAPE" in log and "neg_log1p" in log


def test_misspelt_setting_is_named_in_a_warning():
    with LocalServer(max_group=5) as server:  # SETPO_MAX_GROUP: the setting is SETPO_MAX_GROUPS
        assert "not settings of setpo-server, ignored: SETPO_MAX_GROUP" in server.log()


def test_info_reports_model_and_limits(inprocess):
    info = inprocess.info()
    assert (info.model, info.dimension, info.max_tokens, info.device, info.dtype) == (
        "all-MiniLM-L6-v2",
        384,
        256,
        "cpu",
        "float32",
    )
    assert info.limits.max_group_size == 256 and info.default_weight == 0.05 and info.shape == "neg_log1p"
    assert info.limits.max_batch_tokens == 2048  # "auto" resolved for the CPU
    assert not info.compiled  # SETPO_COMPILE is opt-in


def test_the_log_file_lasts_as_long_as_its_server_object_and_no_longer():
    """Every LocalServer wrote a log under /tmp and left it there: a day of test runs left over a thousand."""
    server = LocalServer()
    path = server.log_path
    path.write_text("setpo-server: started\n")
    assert server.log() == "setpo-server: started\n"
    del server
    gc.collect()
    assert not path.exists()

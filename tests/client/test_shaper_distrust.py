"""SetpoShaper trusts no answer (issue 25, items 4 and 5): against fake services that answer wrongly, slowly or
hugely, a step fails as a step (lambda = 0 under skip, a clear error under fail) within one overall deadline;
and one bad member fails its own group, not the step."""

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from setpo_client import SetpoClient, SetpoError
from setpo_client.shaping import SetpoShaper
from setpo_server.backend import EMBEDDED_MODEL_NAME

GROUPS = [["a", "b", "c"], ["d", "e", "f"]]


class Fake(BaseHTTPRequestHandler):
    """/ready and /info as the real app's; /v1/diversity answered by `diversity(self, body)`."""

    info: ClassVar[dict] = {}
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.reply(200, {"status": "ready"} if self.path == "/ready" else self.info)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.diversity(body)

    def diversity(self, body):
        raise NotImplementedError

    def reply(self, status, payload, extra_headers=()):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in extra_headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def good_answer(body) -> dict:
    groups = [
        {
            "marginals": [0.1] * len(g["texts"]),
            "local_mass": [0.5] * len(g["texts"]),
            "set_score": -0.4,
            "saturation": 0.0,
            "scored": len(g["texts"]),
            "bonus": [0.1] * len(g["texts"]),
        }
        for g in body["groups"]
    ]
    return {
        "model": EMBEDDED_MODEL_NAME,  # what the fakes' /info (the real service's) says it serves
        "groups": groups,
        "usage": {"texts": 0, "unique_texts": 0, "tokens": 0, "truncated": 0},
        "weight": body.get("weight"),
    }


@pytest.fixture
def fake(inprocess):
    info = inprocess.info().model_dump()
    servers = []

    def serve(diversity, **client_options):
        handler = type("Handler", (Fake,), {"diversity": diversity, "info": info})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return SetpoClient(f"http://127.0.0.1:{server.server_port}", **{"max_retries": 0, **client_options})

    yield serve
    for server in servers:
        server.shutdown()


def test_a_redirect_is_a_failed_step_not_an_answer(fake):
    client = fake(lambda self, body: self.reply(302, good_answer(body), [("location", "http://elsewhere/")]))
    shaper = SetpoShaper(client, weight=0.5)
    step = shaper.score(GROUPS)
    assert step.marginals is None and shaper.fallback_steps == 1 and step.metrics["setpo/weight"] == 0
    with pytest.raises(SetpoError, match="302"):
        SetpoShaper(client, weight=0.5, on_error="fail").score(GROUPS)


def huge(self, body):
    self.send_response(200)
    self.send_header("content-type", "application/json")
    self.send_header("content-length", str(2 * 1024**3))  # 2 GB announced
    self.end_headers()
    chunk = b" " * 65536
    try:
        for _ in range(4096):  # 256 MB, if anyone reads that far
            self.wfile.write(chunk)
    except OSError:
        pass


def test_an_answer_larger_than_the_bound_is_refused_without_reading_it(fake):
    client = fake(huge)
    client.max_response_bytes = 1024 * 1024
    shaper = SetpoShaper(client, weight=0.5, on_error="fail")
    started = time.monotonic()
    with pytest.raises(SetpoError, match="max_response_bytes"):
        shaper.score(GROUPS)
    assert time.monotonic() - started < 30  # not 256 MB read


def trickle(self, body):
    data = json.dumps(good_answer(body)).encode()
    self.send_response(200)
    self.send_header("content-type", "application/json")
    self.send_header("content-length", str(len(data)))
    self.end_headers()
    try:
        for byte in data:  # 1 byte every 0.5 s: each read is well within the client's timeout
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(0.5)
    except OSError:
        pass


def test_an_answer_that_trickles_in_ends_the_step_at_its_deadline(fake):
    client = fake(trickle, timeout=2.0)
    shaper = SetpoShaper(client, weight=0.5)
    started = time.monotonic()
    step = shaper.score(GROUPS)
    elapsed = time.monotonic() - started
    assert step.marginals is None and shaper.fallback_steps == 1
    assert elapsed < 2 + 10, f"a 2 s budget took {elapsed:.1f} s"  # the whole answer would take minutes


def test_retries_and_their_waits_stay_within_the_steps_deadline(fake):
    client = fake(
        lambda self, body: self.reply(503, {"error": {"message": "busy", "type": "x"}}, [("retry-after", "5")]),
        timeout=2.0,
        max_retries=5,
    )
    started = time.monotonic()
    step = SetpoShaper(client, weight=0.5).score(GROUPS)
    assert step.marginals is None and time.monotonic() - started < 2 + 10  # not 5 retries x Retry-After 5 s


def test_a_step_deadline_can_be_set_apart_from_the_request_timeout(fake):
    client = fake(trickle, timeout=30.0)
    started = time.monotonic()
    SetpoShaper(client, weight=0.5, step_timeout=1.5).score(GROUPS)
    assert time.monotonic() - started < 1.5 + 10  # not the trickle's minutes, nor the 30 s timeout


@pytest.mark.parametrize(
    ("bad_group", "why"),
    [
        (["ok", "\ud800 a lone surrogate", "fine"], "lone surrogate"),
        ([[1.0, 0.0], [math.nan, 1.0], [0.5, 0.5]], "NaN"),
        ([1, 2, 3], "ints"),
        ([[[1.0]], [[2.0]], [[3.0]]], "2-D members"),
        (["text", [1.0, 2.0], "text"], "mixed kinds"),
    ],
    ids=["surrogate", "nan", "ints", "2d", "mixed"],
)
def test_one_bad_member_fails_its_group_and_the_rest_of_the_step_is_shaped(inprocess, bad_group, why):
    good = ["the answer is 5", "five", "2 + 3 = 5"]
    shaper = SetpoShaper(inprocess, weight=0.5)
    step = shaper.score([good, bad_group, good])
    assert step.marginals is not None, why
    assert step.bonus[1] == [0.0] * 3 and step.marginals[1] is None
    assert step.marginals[0] is not None and step.marginals[2] is not None and any(step.bonus[0])
    assert step.metrics["setpo/bad_groups"] == 1 and shaper.fallback_steps == 0


def test_a_bad_reward_fails_its_group(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.5, min_reward=1.0)
    good = ["the answer is 5", "five", "2 + 3 = 5"]
    step = shaper.score([good, good], rewards=[[1, 1, 1], [1, math.inf, 1]])
    assert step.marginals[0] is not None and step.marginals[1] is None and step.metrics["setpo/bad_groups"] == 1

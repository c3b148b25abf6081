"""Work is bounded before it is done: every row counts (duplicates, embedding rows, /v1/embeddings input), a wrong
key is refused before the body is read, slow senders (of headers or body) are cut off, and too many requests at
once get 503. What needs a socket (a body never sent, slow senders, connections held, /health within its own
timeout while a body is parsed) runs against the real server; the rest in-process (tests/inprocess.py)."""

import json
import re
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from setpo_server.local import LocalServer
from tests.inprocess import InProcessService
from tests.metrics import metric
from tests.raw_http import embeddings_request

KEY = "limits-test-key-51f0"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMITS = {
    "api_key": KEY,
    "max_request_rows": 64,
    "max_embedding_inputs": 16,
    "max_concurrent_requests": 2,
    "receive_timeout": 2,
    "header_timeout": 2,
    "max_queue_tokens": 400,
}
PIPELINED = 48  # answers of 16 embeddings each, about 6.5 MB: more than a socket's buffers take unread


@pytest.fixture(scope="module")
def limited():
    """The real server with these limits, for the tests that need its socket."""
    with LocalServer(**LIMITS) as server:
        yield server


@pytest.fixture(scope="module")
def limited_service():
    with InProcessService(**LIMITS) as service:
        yield service


@pytest.fixture
def limited_http(limited_service):
    """A plain httpx client of the same limits in-process, with the key."""
    with limited_service.http(headers=AUTH) as http:
        yield http


def error_of(response: httpx.Response) -> dict:
    return response.json()["error"]


def test_duplicate_inputs_count_against_the_embeddings_limit(limited_http):
    response = limited_http.post("/v1/embeddings", json={"input": ["a"] * 17})
    assert response.status_code == 400 and "SETPO_MAX_EMBEDDING_INPUTS=16" in error_of(response)["message"]
    assert error_of(response)["param"] == "input"
    assert limited_http.post("/v1/embeddings", json={"input": ["a"] * 16}).status_code == 200


def test_duplicate_texts_and_embedding_rows_count_against_the_request_rows_limit(limited_http):
    for groups in ([{"texts": ["a"] * 32}] * 3, [{"texts": ["a"] * 32}, {"embeddings": [[1.0, 0.0]] * 33}]):
        response = limited_http.post("/v1/diversity", json={"groups": groups})
        assert response.status_code == 422 and "SETPO_MAX_REQUEST_ROWS=64" in error_of(response)["message"]
    assert limited_http.post("/v1/diversity", json={"groups": [{"texts": ["a"] * 32}] * 2}).status_code == 200


def test_a_request_with_more_tokens_than_the_queue_holds_is_400_on_the_openai_route(limited_http):
    texts = [f"text {i} " + "word " * 40 for i in range(12)]  # ~45 tokens each, over 400 together
    response = limited_http.post("/v1/embeddings", json={"input": texts})
    # a request that can never fit is invalid: OpenAI's convention on /v1/embeddings is 400 (422 on our own routes)
    assert response.status_code == 400 and "SETPO_MAX_QUEUE_TOKENS=400" in error_of(response)["message"]


def test_wrong_key_is_refused_before_the_body_is_read(limited):
    """The body is announced (Content-Length) but never sent: only a server that does not wait for it answers."""
    with socket.create_connection(("127.0.0.1", limited.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/diversity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
            b"Content-Type: application/json\r\nContent-Length: 60000000\r\n\r\n"
        )
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401"), answer


def test_a_stalled_sender_gets_408_after_the_receive_timeout(limited):
    with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/diversity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + KEY.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"groups": ['
        )
        started = time.monotonic()
        answer = b""
        while b"}}" not in answer and (chunk := sock.recv(4096)):  # head and body may come in two reads
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"SETPO_RECEIVE_TIMEOUT" in answer
    assert time.monotonic() - started < 20  # cut off, not held until the caller gives up


@pytest.mark.parametrize(
    ("start", "trickle"),
    [
        (b"", False),
        (b"POST /v1/diversity HTTP/1.1\r\nHost: x\r\n", True),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\n", True),
    ],
    ids=["silent", "a-header-line-a-second", "second-request-on-keep-alive"],
)
def test_a_connection_whose_headers_do_not_arrive_in_time_gets_408_and_is_closed(limited, start, trickle):
    """Headers never sent, or trickled a line a second (slowloris), would each hold a connection and a file
    descriptor forever: cut after SETPO_HEADER_TIMEOUT, however often a byte comes."""
    timed_out = metric(limited, "setpo_connections_timed_out_total")
    with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(start)
        answer = b""
        while time.monotonic() - started < 8:
            if select.select([sock], [], [], 1)[0]:
                if not (chunk := sock.recv(4096)):
                    break  # closed by the server
                answer += chunk
            elif trickle:  # each line would reset a timer that only measured silence
                sock.sendall(b"X-a: b\r\n")
        took = time.monotonic() - started
    last = answer[answer.rfind(b"HTTP/1.1 ") :]
    assert last.startswith(b"HTTP/1.1 408"), answer
    assert b"SETPO_HEADER_TIMEOUT=2" in last and b"connection: close" in last.lower()
    # not before the timeout (the server's clock starts at the connection, a moment before ours), and not held
    # until the caller gives up
    assert 1.95 <= took < 5, took
    assert metric(limited, "setpo_connections_timed_out_total") == timed_out + 1


def test_a_pipelined_request_whose_headers_run_out_of_time_behind_answers_gets_them_whole_then_the_close(limited):
    """The header clock of a request pipelined behind answers the caller is slow to read runs out while they are
    still being sent: they go out whole (HTTP/1.1 answers in order), then the connection closes."""
    body = json.dumps({"input": [f"pipelined text {i}" for i in range(16)]}).encode()
    request = embeddings_request(KEY, body)
    timed_out = metric(limited, "setpo_connections_timed_out_total")
    with socket.socket() as sock:
        sock.settimeout(30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answers wait in the server's buffers
        sock.connect(("127.0.0.1", limited.port))
        sock.sendall(request * PIPELINED + b"GET /health HTTP/1.1\r\n")  # more answer than the buffers hold
        # the answers unread until the last request's SETPO_HEADER_TIMEOUT=2 has run out
        limited.wait_until(lambda: metric(limited, "setpo_connections_timed_out_total") > timed_out, 30)
        answer = b""
        while chunk := sock.recv(1 << 20):
            answer += chunk
    for _ in range(PIPELINED):
        head, _, answer = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE)[1])
        assert head.startswith(b"HTTP/1.1 200") and len(json.loads(answer[:length])["data"]) == 16, head
        answer = answer[length:]
    assert answer == b"", answer[:200]


def test_a_caller_still_sending_when_refused_reads_the_whole_answer_then_an_orderly_close(limited):
    """A slowloris caller's next line may be under way when its 408 goes out. Closing with that line unread sends a
    reset instead of a close, and the caller's read of the answer ends in ConnectionResetError (the flake of
    docs/development.md, "Tests that hold on a busy machine"). Eight callers send a header line every millisecond until their
    answer comes: each must read the whole 408, then the end of the stream."""

    def answer_of_a_fast_trickler() -> bytes:
        with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/diversity HTTP/1.1\r\nHost: x\r\n")
            while not select.select([sock], [], [], 0.001)[0]:
                sock.sendall(b"X-a: b\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            return answer

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: answer_of_a_fast_trickler(), range(8)))
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408") and answer.endswith(b"}"), answer


def test_a_caller_that_keeps_sending_after_its_answer_is_cut_off_soon_after(limited):
    """What a refused caller still sends is read and dropped only for a moment: one that keeps sending (a slowloris
    that ignores its 408) finds the connection closed within seconds, not held."""
    with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/diversity HTTP/1.1\r\nHost: x\r\n")
        select.select([sock], [], [], 10)
        answered = time.monotonic()
        with pytest.raises(OSError):  # a reset (or broken pipe) once the service has closed its end
            while time.monotonic() - answered < 10:
                sock.sendall(b"X-a: b\r\n")
                time.sleep(0.01)
        assert time.monotonic() - answered < 5


def test_headers_sent_in_time_are_served_however_long_the_connection_lives(limited):
    """The deadline is per request: a keep-alive connection making requests for longer than it is served."""
    with httpx.Client(base_url=limited.url) as client:
        started = time.monotonic()
        while time.monotonic() - started < 3:
            assert client.get("/health").status_code == 200
            time.sleep(0.5)


def test_requests_over_the_concurrency_limit_get_503_with_retry_after_before_their_body(limited):
    """Two stalled senders hold both places; a third request is refused at once, and /health still answers."""
    socks = []
    try:
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", limited.port), timeout=10)
            sock.sendall(
                b"POST /v1/diversity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + KEY.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
            socks.append(sock)
        # both are inside the route, waiting for their bodies
        limited.wait_until(lambda: metric(limited, "setpo_requests_in_progress") == 2, timeout=60)
        response = httpx.post(limited.url + "/v1/embeddings", json={"input": "x"}, headers=AUTH)
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        assert "SETPO_MAX_CONCURRENT_REQUESTS=2" in error_of(response)["message"]
        assert httpx.get(limited.url + "/health", timeout=2).status_code == 200
    finally:
        for sock in socks:
            sock.close()
    limited.wait_until(
        lambda: httpx.post(limited.url + "/v1/embeddings", json={"input": "x"}, headers=AUTH).status_code == 200, 30
    )


def test_long_texts_are_cut_before_tokenising_and_counted_as_truncated(limited_http):
    info = limited_http.get("/info").json()
    assert info["truncate_chars"] == 10 * info["max_tokens"]
    long = "x" * (info["truncate_chars"] * 3)  # one "word": without the cut, a single token of 7680 characters
    response = limited_http.post("/v1/embeddings", json={"input": [long, long[: info["truncate_chars"]]]})
    body = response.json()
    assert response.status_code == 200 and body["usage"]["truncated"] == 1
    # the cut text is what was embedded (equal up to float noise: two rows of one batch)
    assert body["data"][0]["embedding"] == pytest.approx(body["data"][1]["embedding"], abs=1e-5)


def test_probes_answer_while_a_big_body_is_parsed(limited):
    """/health is served from the event loop: a parse in a worker thread must not hold it."""
    body = b'{"groups": [' + b",".join([b'{"embeddings": [[0.5, 0.25, 0.125], [1, 2, 3], [3, 2, 1]]}'] * 15000) + b"]}"
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(
            r=httpx.post(
                limited.url + "/v1/diversity",
                content=body,
                headers={**AUTH, "Content-Type": "application/json"},
                timeout=60,
            )
        )
    )
    worker.start()
    while worker.is_alive():
        assert httpx.get(limited.url + "/health", timeout=2).status_code == 200
    assert result["r"].status_code == 422  # 45000 rows: over SETPO_MAX_REQUEST_ROWS once parsed

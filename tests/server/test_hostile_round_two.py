"""Hostile clients, round two (issue 25): header bytes, leftover bodies, descriptors, answers nobody reads, and
small leaks. One real server on a socket for every probe that needs one (bytes and their timing are the point),
started under a 256-descriptor limit as a small container would have; the rest in-process."""

import contextlib
import gzip
import json
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from setpo_server.local import LocalServer
from setpo_server.schemas import ANSWER_BYTES_PER_ROW
from tests.inprocess import InProcessService
from tests.metrics import metric
from tests.raw_http import chunked_embeddings_head, chunked_embeddings_request, embeddings_request
from tests.reliability.hostile import HELD_AFTER_MB, resident_mb, resident_mb_once_back

KEY = "round-two-key-77c1"
AUTH = {"Authorization": f"Bearer {KEY}"}
WRITE_TIMEOUT = 2
HEADER_TIMEOUT = 8


@pytest.fixture(scope="module")
def server():
    command = ["prlimit", "--nofile=256:256", sys.executable, "-m", "setpo_server.cli"]
    with LocalServer(
        command=command, api_key=KEY, write_timeout=WRITE_TIMEOUT, header_timeout=HEADER_TIMEOUT
    ) as running:
        yield running


def connect(server: LocalServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_answer(sock: socket.socket, timeout: float = 10) -> bytes:
    """What the server sends until it closes the connection (or the timeout)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def health_seconds(server: LocalServer) -> float:
    started = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    return time.monotonic() - started


@pytest.mark.parametrize("size", [40_000, 1_000_000], ids=["whole-in-one-read", "over-many-reads"])
def test_a_header_over_the_limit_gets_431_and_the_connection_closes(server, size):
    """Over the 32 KiB default, whether the whole header block comes in one read (and is complete when counted) or
    is still arriving."""
    sock = connect(server)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed while we still send: the limit at work
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
    answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
    assert b"SETPO_MAX_HEADER_BYTES" in answer


def test_a_header_over_the_limit_behind_a_pipelined_request_closes_the_connection_after_that_requests_answer(server):
    """HTTP/1.1 answers pipelined requests in the order they came: the request before the oversized one gets its whole
    answer, then the connection closes. A 431 sent at once would be read as part of the first request's answer."""
    body = b'{"input": ["a pipelined request"]}'
    first = embeddings_request(KEY, body)
    oversized = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"  # over the 32 KiB default
    too_large = metric(server, "setpo_headers_too_large_total")
    sock = connect(server)
    sock.sendall(first + oversized)  # in one write: the first request is still being answered when the second comes
    head, _, rest = read_answer(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE)[1])
    assert len(json.loads(rest[:length])["data"]) == 1 and rest[length:] == b""  # then the close, nothing else
    assert metric(server, "setpo_headers_too_large_total") == too_large + 1


def test_trailers_count_with_the_headers_and_a_flood_of_them_is_cut_off(server):
    """Trailer lines after a chunked body: uvicorn kept every one (about 14x its bytes) for as long as a caller sent
    them, past SETPO_MAX_HEADER_BYTES and with no key needed. A few are dropped unread and the request answered; more
    than the header limit cuts the connection before any answer."""
    body = b'{"input": ["a chunked request"]}'
    sock = connect(server)
    sock.sendall(chunked_embeddings_request(KEY, body, b"X-Checksum: 1\r\n"))
    assert read_answer(sock).startswith(b"HTTP/1.1 200")
    sock = connect(server)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # cut off while we still send: the limit at work
        sock.sendall(
            chunked_embeddings_request(KEY, body, b"X-T: 1\r\n" * 5000)
        )  # 40 000 bytes of trailers, over the 32 KiB default
    assert read_answer(sock) == b""
    assert health_seconds(server) < 5


def stream_one_header(server: LocalServer, seconds: float, sent: list[int]) -> None:
    """A caller streaming one endless header for `seconds` (288 MB in 12 s was the issue's probe)."""
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
    chunk, deadline = b"a" * 65536, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            sock.sendall(chunk)
            sent.append(len(chunk))
    except OSError:
        pass
    finally:
        sock.close()


def test_callers_streaming_endless_headers_take_neither_memory_nor_time(server):
    baseline = resident_mb(server.process.pid)
    sent: list[int] = []
    callers = [threading.Thread(target=stream_one_header, args=(server, 6, sent)) for _ in range(4)]
    for caller in callers:
        caller.start()
    time.sleep(1)
    probes = [health_seconds(server) for _ in range(5)]
    peak = resident_mb(server.process.pid)
    for caller in callers:
        caller.join()
    assert max(probes) < 1.0, probes
    assert peak - baseline < 64, f"resident memory grew {peak - baseline:.0f} MB"
    assert sum(sent) < 4 * 4 * 1024 * 1024  # each caller was cut off near the limit, not after seconds of bytes


def test_a_leftover_body_cannot_pin_a_connection(server):
    """GET with a Content-Length body the route never reads, its bytes trickling in after the answer (each would stop
    uvicorn's keep-alive timer): the connection is closed on the header clock, whatever the parser is waiting for."""
    socks = [connect(server) for _ in range(20)]
    for sock in socks:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
    started = time.monotonic()
    closed: set[int] = set()
    while time.monotonic() - started < 3 * HEADER_TIMEOUT and len(closed) < len(socks):
        for i, sock in enumerate(socks):
            if i in closed:
                continue
            try:
                sock.sendall(b"x")  # one more leftover byte a second keeps uvicorn's keep-alive timer from firing
                sock.settimeout(0.02)
                while chunk := sock.recv(65536):
                    assert chunk
                closed.add(i)  # recv returned b"": the server closed it
            except TimeoutError:
                pass
            except OSError:
                closed.add(i)
        time.sleep(1)
    elapsed = time.monotonic() - started
    assert len(closed) == len(socks), f"{len(socks) - len(closed)} connections still open after {elapsed:.0f} s"
    assert elapsed < HEADER_TIMEOUT + 3  # the header clock, from the first leftover byte, and a second's polling


def test_near_the_descriptor_limit_idle_connections_make_room_and_health_answers(server):
    idle = []
    try:
        for _ in range(240):  # with 256 descriptors, the model's files and the listener, this is past the limit
            sock = connect(server)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            idle.append(sock)
        time.sleep(0.5)
        assert health_seconds(server) < 2
        assert metric(server, "setpo_connections_reclaimed_total") > 0
    finally:
        for sock in idle:
            sock.close()


def test_when_every_connection_is_busy_a_new_one_gets_503_not_silence(server):
    refused = metric(server, "setpo_connections_refused_total")
    busy = []
    try:
        for _ in range(240):  # each in the middle of its headers (the header clock gives them 8 s)
            sock = connect(server)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            busy.append(sock)
        # Until the server has read every busy connection's first bytes, one of them is idle to it, and closed to
        # make room: ask until it has (it takes milliseconds; past the header clock they would no longer be busy)
        deadline = time.monotonic() + HEADER_TIMEOUT
        while True:
            sock = connect(server)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = read_answer(sock, timeout=5)
            sock.close()
            if not answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after" in answer.lower(), answer[:200]
        assert b"SETPO_MAX_CONNECTIONS" in answer
    finally:
        for sock in busy:
            sock.close()
    server.wait_until(lambda: metric(server, "setpo_connections_refused_total") > refused, timeout=60)
    assert health_seconds(server) < 2  # room again once they are gone


def ask_and_never_read(server: LocalServer, key: str = KEY, then: bytes = b"") -> socket.socket:
    """A request for a 16 MB answer, never read; `then`: bytes pipelined behind it (another request)."""
    body = b'{"input": [' + b",".join([b'"the same short text"'] * 2048) + b"]}"
    sock = connect(server)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(embeddings_request(key, body) + then)
    return sock


def test_a_body_whose_framing_breaks_mid_request_gets_its_400_at_once_and_frees_its_place(server):
    """A chunk size that is not hex, after the request was admitted: uvicorn's parser stops there, answers 400 and
    closes, and the handler that waited for the rest of the body is told its caller went, not left holding its place
    until SETPO_RECEIVE_TIMEOUT (30 s here) to answer 408."""
    sock = connect(server)
    sock.sendall(chunked_embeddings_head(KEY) + b'5\r\n{"inp\r\n')
    server.wait_until(lambda: metric(server, "setpo_requests_in_progress") == 1, timeout=30)
    sock.sendall(b"zz\r\nnot a chunk\r\n")
    answer = read_answer(sock, timeout=10)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    server.wait_until(lambda: metric(server, "setpo_requests_in_progress") == 0, timeout=10)


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate, chunked"])
def test_a_transfer_coding_the_service_does_not_implement_gets_501_naming_it(server, coding):
    """RFC 9112 section 6.1: a transfer coding the server does not understand gets 501. httptools undid the chunking,
    passed the still-compressed bytes on, and they were answered 400 as JSON that does not parse."""
    body = gzip.compress(b'{"input": "hi"}')
    request_head = chunked_embeddings_head(KEY).replace(b"chunked", coding.encode(), 1)
    sock = connect(server)
    sock.sendall(request_head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    head, _, answer = read_answer(sock).partition(b"\r\n\r\n")
    sock.close()
    assert head.startswith(b"HTTP/1.1 501 "), head
    assert f"Transfer-Encoding {coding!r}" in json.loads(answer)["error"]["message"]


def test_answers_nobody_reads_are_dropped_at_the_write_deadline_and_memory_returns(server):
    baseline = resident_mb(server.process.pid)
    peak = baseline
    readers = [ask_and_never_read(server) for _ in range(24)]  # 16 MB of float JSON each, deduplicated to one text

    def all_but_a_few_dropped() -> bool:
        nonlocal peak
        peak = max(peak, resident_mb(server.process.pid))
        return metric(server, "setpo_connections_write_timed_out_total") >= 20

    try:
        server.wait_until(all_but_a_few_dropped, timeout=60)
        after = resident_mb_once_back(server.process.pid, baseline)
    finally:
        for sock in readers:
            sock.close()
    # answers are built one at a time (routes.py), each held until its write deadline: on a loaded machine only two
    # or three are held at once
    assert peak - baseline > 32, "the probe did not make the server hold its answers"
    assert after - baseline < HELD_AFTER_MB, f"resident memory still {after - baseline:.0f} MB above its start"


ALICE, BOB = "alice-key-0b7d41a9", "bob-key-5ce902f3d1"


@pytest.fixture(scope="module")
def two_callers(tmp_path_factory):
    """A server whose keys name two callers, with four places: each may hold two of them (the auto default, half)."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"alice={ALICE}\nbob={BOB}\n")
    with LocalServer(api_key_file=str(keys), max_concurrent_requests=4, write_timeout=60) as running:
        yield running


def embed(server: LocalServer, key: str) -> httpx.Response:
    body = {"input": ["one more"]}
    return httpx.post(server.url + "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_answers_their_callers_leave_unread_count_as_requests_in_progress_until_they_go(two_callers):
    """One caller asking again and again, never reading, used to pin an answer per request (1 GB in 12 s): a request's
    place was freed when its handler returned, its answer still held. Now a request holds its place until its answer
    is sent or dropped, and the caller's going gives the place back: one caller's unread answers take at most its
    share of the places, and everyone's at most all of them."""
    server = two_callers
    # one of them with a request pipelined behind it: queued, it takes no place until the answer before it is sent
    readers = [ask_and_never_read(server, ALICE), ask_and_never_read(server, ALICE, b"GET /health HTTP/1.1\r\n\r\n")]
    try:
        server.wait_until(lambda: metric(server, "setpo_answers_unsent") == 2, timeout=60)
        assert metric(server, "setpo_requests_in_progress") == 2
        refused = embed(server, ALICE)
        assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text[:300]
        assert "'alice' holds 2" in refused.json()["error"]["message"]
        assert "SETPO_MAX_REQUESTS_PER_CALLER=2" in refused.json()["error"]["message"]
        readers += [ask_and_never_read(server, BOB) for _ in range(2)]
        server.wait_until(lambda: metric(server, "setpo_answers_unsent") == 4, timeout=60)
        refused = embed(server, BOB)
        assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text[:300]
        assert "4 requests in progress or being answered" in refused.json()["error"]["message"]
    finally:
        for sock in readers:
            sock.close()
    server.wait_until(lambda: metric(server, "setpo_requests_in_progress") == 0, timeout=30)
    assert metric(server, "setpo_answers_unsent") == 0
    for key in (ALICE, BOB):
        answered = embed(server, key)
        assert answered.status_code == 200, answered.text[:300]


def test_one_callers_stalled_bodies_take_at_most_its_share_of_the_places(two_callers):
    """A place is taken before the body is read (what bounds the bodies held at once), so four requests whose bodies
    never come took every place and refused everyone else until SETPO_RECEIVE_TIMEOUT. Now a caller holds at most
    its share (SETPO_MAX_REQUESTS_PER_CALLER, half of four here): its next ones are refused, the other's answered."""
    server = two_callers
    stalled = []
    try:
        for count in range(4):
            sock = connect(server)
            sock.sendall(embeddings_request(ALICE, b'{"input": ["never ends"' + b" " * 100)[:-100])  # 100 bytes owed
            stalled.append(sock)
            if count < 2:  # admitted, and waiting for the rest of its body
                server.wait_until(lambda: metric(server, "setpo_requests_in_progress") == len(stalled), timeout=30)
        refusals = [read_answer(sock) for sock in stalled[2:]]
        assert all(b" 503 " in answer and b"SETPO_MAX_REQUESTS_PER_CALLER=2" in answer for answer in refusals)
        assert metric(server, "setpo_requests_in_progress") == 2  # the first two, still waiting for their bodies
        answered = embed(server, BOB)
        assert answered.status_code == 200, answered.text[:300]
    finally:
        for sock in stalled:
            sock.close()
    server.wait_until(lambda: metric(server, "setpo_requests_in_progress") == 0, timeout=30)
    assert embed(server, ALICE).status_code == 200


def test_an_answer_over_max_response_bytes_is_refused_before_the_work():
    with InProcessService(max_response_bytes=1024 * 1024) as small, small.http() as client:
        response = client.post("/v1/embeddings", json={"input": ["some text"] * 400})
        assert response.status_code == 400, response.text  # OpenAI's status for an invalid request here
        assert "SETPO_MAX_RESPONSE_BYTES=1048576" in response.json()["error"]["message"]
        assert "base64" in response.json()["error"]["message"]  # what to do: the compact encoding, or fewer inputs
        fits = {"input": ["some text"] * 400, "encoding_format": "base64"}
        assert client.post("/v1/embeddings", json=fits).status_code == 200


def test_a_diversity_answer_stays_within_max_response_bytes_by_the_rows_info_reports():
    """/info's max_request_rows is what SETPO_MAX_REQUEST_ROWS and SETPO_MAX_RESPONSE_BYTES allow together, so a
    client packs by it alone: that many rows are answered within the bytes, one group more is refused naming the
    setting."""

    def group(g: int, size: int) -> dict:
        return {"texts": [f"answer {g}.{i}" for i in range(size)], "rewards": [i % 2 for i in range(size)]}

    with InProcessService(max_response_bytes=4096) as small, small.http() as client:
        rows = client.get("/info").json()["limits"]["max_request_rows"]
        assert rows == 4096 // ANSWER_BYTES_PER_ROW
        sizes = [3] * (rows // 3 - 1) + [3 + rows % 3]
        body = {"groups": [group(g, n) for g, n in enumerate(sizes)], "min_reward": 0, "normalize": "zscore"}
        answered = client.post("/v1/diversity", json=body)
        assert answered.status_code == 200 and len(answered.content) <= 4096, answered.text
        body["groups"].append(group(len(sizes), 3))
        refused = client.post("/v1/diversity", json=body)
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "groups", refused.text
        assert "SETPO_MAX_RESPONSE_BYTES=4096" in refused.json()["error"]["message"]


def test_a_key_sent_in_the_query_string_reaches_no_log(server):
    httpx.get(server.url + "/info?api_key=query-secret-5521", headers=AUTH)
    httpx.get(server.url + "/health?token=query-secret-5521")
    server.wait_until(lambda: "GET /info" in server.log(), timeout=60)  # the request is still logged
    assert "query-secret-5521" not in server.log()  # its query string is not


def test_openapi_and_docs_need_the_key_when_one_is_set(server):
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(server.url + path).status_code == 401, path
    assert httpx.get(server.url + "/openapi.json", headers=AUTH).status_code == 200
    assert httpx.get(server.url + "/docs", headers=AUTH).status_code == 200


def test_docs_stay_open_when_a_setting_says_so():
    with InProcessService(api_key=KEY, public_docs=True) as open_docs, open_docs.http() as client:
        assert client.get("/openapi.json").status_code == 200


def test_a_non_ascii_key_is_refused_at_start_with_a_clear_message():
    run = subprocess.run(
        [sys.executable, "-m", "setpo_server.cli"],
        env={"SETPO_API_KEY": "ключ-секрет", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "SETPO_API_KEY" in run.stderr and "ASCII" in run.stderr
    assert "ключ-секрет" not in run.stderr  # the refusal does not print the secret


def test_an_error_echoes_no_more_than_a_few_hundred_characters(http):
    response = http.post("/v1/embeddings", json={"input": "hi", "model": "m" * 100_000})
    assert response.status_code in (400, 422)
    assert len(response.json()["error"]["message"]) < 500
    retrieved = http.get("/v1/models/" + "n" * 50_000)
    assert retrieved.status_code == 404 and len(retrieved.json()["error"]["message"]) < 500

"""SETPO_API_KEY_FILE (issue 41, item 5): several keys, each naming its caller, re-read while the service runs, so
keys rotate without a restart and without a step trained at lambda = 0. A file caught empty, half-written or
unreadable keeps the keys in force; a caller's name (never its key) is in the access log and on the request
metrics. In-process (tests/inprocess.py), but for the rotation run: a real server, whose access log is uvicorn's."""

import logging
import time
from collections.abc import Callable

import httpx
import pytest
from pydantic import ValidationError

from setpo_client import SetpoClient
from setpo_client.shaping import SetpoShaper
from setpo_server.local import LocalServer
from tests.inprocess import GivenSettings, InProcessService
from tests.metrics import metric

KEY_A = "trainer-a-key-0123456789abcdef"
KEY_B = "trainer-b-key-fedcba9876543210"
BARE = "a-bare-key-without-a-name-42"
ENV_KEY = "the-environments-key-5e1d7"
GROUP = {"texts": ["one way", "another way", "a third way"]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def eventually(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """Polls until condition() holds; the server re-reads its key file every second, so this takes a few (the timeout
    is only for a server that never takes the change)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.05)


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "api-keys"
    path.write_text(f"# one key a line: name=key, or a bare key\n\ntrainer-a={KEY_A}\n{BARE}\n")
    return path


def test_every_key_of_the_file_and_the_environment_is_accepted_under_its_callers_name(key_file):
    with InProcessService(api_key_file=str(key_file), api_key=ENV_KEY) as service, service.http() as http:
        for key, caller in ((KEY_A, "trainer-a"), (BARE, "key-4"), (ENV_KEY, "default")):
            counted = f'setpo_requests_total{{route="/v1/diversity",status="200",caller="{caller}"}}'
            before = metric(service, counted)
            assert http.post("/v1/diversity", json={"groups": [GROUP]}, headers=bearer(key)).status_code == 200
            assert http.get("/info", headers=bearer(key)).status_code == 200
            assert metric(service, counted) == before + 1, caller
        for headers in ({}, bearer("trainer-a"), bearer(KEY_A + "x"), bearer(KEY_B)):
            assert http.post("/v1/diversity", json={"groups": [GROUP]}, headers=headers).status_code == 401
        assert http.get("/openapi.json").status_code == 401  # the API's description is behind the key too
        exposed = http.get("/metrics").text
        assert 'caller="anonymous"' in exposed  # the refusals and the probes: no key named them
        assert not any(key in exposed for key in (KEY_A, BARE, ENV_KEY))


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "cannot read"),
        ("", "no key"),
        ("# only a comment\n\n", "no key"),
        (f"trainer a={KEY_A}\n", "line 1"),  # a name with a space
        (f"trainer-a={KEY_A}\ntrainer-b=k3y\n", "line 2"),  # a key cut mid-write, or a typo
        ("c2VjcmV0LWtleS1iYXNlNjQ==\n", "line 1"),  # base64 padding would read as name=key: never name a key by itself
        (f"trainer-a={KEY_A}\ntrainer-b={KEY_A}\n", "line 2"),  # one key, two names
    ],
    ids=["missing", "empty", "comments-only", "bad-name", "short-key", "bare-key-with-equals", "duplicate-key"],
)
def test_a_missing_empty_or_unparseable_key_file_stops_the_service_at_start(tmp_path, content, problem):
    path = tmp_path / "api-keys"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValidationError) as caught:
        GivenSettings(api_key_file=str(path))
    message = str(caught.value)
    assert problem in message and "api_key_file" in message
    for secret in (KEY_A, "k3y", "c2VjcmV0"):  # the refusal names the line, never what is on it
        assert secret not in message


def test_setpo_server_refuses_to_start_on_an_empty_key_file(tmp_path):
    empty = tmp_path / "api-keys"
    empty.write_text("")
    server = LocalServer(api_key_file=str(empty))
    with pytest.raises(RuntimeError, match="SETPO_API_KEY_FILE") as caught:
        server.start()
    assert "no key" in str(caught.value)


def test_the_file_is_reread_and_a_broken_update_keeps_the_keys_in_force(key_file, caplog):
    """A Kubernetes Secret mounted as a volume changes in place; a writer may leave the file empty or half-written
    for a moment, or remove it: none of that locks the callers out, turns the key off or lets a new key in."""
    caplog.set_level(logging.WARNING, logger="setpo_server")
    with InProcessService(api_key_file=str(key_file)) as service, service.http() as http:

        def status(key: str | None) -> int:
            return http.get("/info", headers=bearer(key) if key else {}).status_code

        assert (status(KEY_A), status(KEY_B)) == (200, 401)
        key_file.write_text(f"trainer-a={KEY_A}\ntrainer-b={KEY_B}\n")
        eventually(lambda: status(KEY_B) == 200)

        half_written = f"trainer-a={KEY_A}\ntrainer-b={KEY_B[:9]}"
        for broken in ("", "# nothing yet\n", half_written, f"trainer-a {KEY_A}\n", None):
            caplog.clear()
            if broken is None:
                key_file.unlink()
            else:
                key_file.write_text(broken)
            eventually(lambda: "SETPO_API_KEY_FILE" in caplog.text)  # the service has read it, and said so
            assert (status(KEY_A), status(KEY_B)) == (200, 200), broken  # nobody locked out
            assert (status(None), status(KEY_B[:9]), status("x")) == (401, 401, 401), broken  # nobody let in
        assert KEY_A not in caplog.text and KEY_B not in caplog.text

        key_file.write_text(f"trainer-b={KEY_B}\n")  # the rotation's end: the old key goes
        eventually(lambda: status(KEY_A) == 401)
        assert status(KEY_B) == 200


def test_keys_rotated_during_a_training_run_lose_no_step(tmp_path):
    """A real server and real SetpoShaper steps: the file holds the old key, then old and new (the overlap), the
    trainer moves to the new key, then the file holds the new key only and the old one is refused. No step falls
    back to lambda = 0, and the access log names the caller, never its keys."""
    old, new = "old-key-for-the-rotation-0001", "new-key-for-the-rotation-0002"
    key_file = tmp_path / "api-keys"
    key_file.write_text(f"trainer={old}\n")
    steps = [[f"answer {step} {i}: " + "a b c d"[: 1 + i] for i in range(4)] for step in range(3)]
    scored = 0

    with LocalServer(api_key_file=str(key_file), dtype="float32") as server:
        shaper = SetpoShaper(SetpoClient(server.url, api_key=old, max_retries=0), weight=0.05, on_error="skip")

        def step() -> None:
            nonlocal scored
            shaped = shaper.score(steps)
            assert shaped.marginals is not None and all(m is not None for m in shaped.marginals)
            scored += 1

        def accepts(key: str) -> bool:
            step()  # the run goes on meanwhile
            return httpx.get(server.url + "/info", headers=bearer(key)).status_code == 200

        step()
        key_file.write_text(f"trainer={old}\ntrainer={new}\n")  # the overlap: both keys
        eventually(lambda: accepts(new))
        shaper.client.close()
        shaper.client = SetpoClient(server.url, api_key=new, max_retries=0)  # as a trainer restarted with the new key
        step()
        key_file.write_text(f"trainer={new}\n")  # the overlap ends
        eventually(lambda: not accepts(old))
        step()
        shaper.client.close()
        assert shaper.fallback_steps == 0 and scored >= 4
        assert httpx.get(server.url + "/info", headers=bearer(old)).status_code == 401
        served = metric(server, 'setpo_requests_total{route="/v1/diversity",status="200",caller="trainer"}')
        assert served >= scored
        server.wait_until(lambda: ' - "GET /info HTTP/1.1" 401' in server.log(), timeout=60)  # the last request's line
        log = server.log()
    assert ' trainer "POST /v1/diversity HTTP/1.1" 200' in log
    assert ' - "GET /info HTTP/1.1" 401' in log  # the refused old key: no caller
    assert old not in log and new not in log

"""SETPO_API_KEY: data routes need the bearer key; health, ready and metrics stay open; the key never leaks.
In-process (tests/inprocess.py), but for the log: uvicorn's access log is written by the real server only."""

import httpx
import openai
import pytest

from setpo_client import SetpoAPIError
from setpo_server.local import LocalServer
from tests.inprocess import InProcessService

KEY = "s3cret-key-for-tests-7c1d"
GROUP = {"texts": ["one way", "another way", "a third way"]}


@pytest.fixture(scope="module")
def guarded_service():
    with InProcessService(api_key=KEY) as service:
        yield service


@pytest.fixture
def guarded(guarded_service):
    """A plain httpx client of the guarded service."""
    with guarded_service.http() as http:
        yield http


@pytest.fixture(scope="module")
def guarded_server():
    with LocalServer(api_key=KEY, log_level="debug") as server:
        yield server


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}]
)
def test_data_routes_refuse_missing_or_wrong_key(guarded, headers):
    for path, body in [("/v1/diversity", {"groups": [GROUP]}), ("/v1/embeddings", {"input": "x"})]:
        response = guarded.post(path, json=body, headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in response.json()["error"]["message"]
    assert guarded.get("/info", headers=headers).status_code == 401


def test_right_key_is_accepted(guarded):
    headers = {"Authorization": f"Bearer {KEY}"}
    assert guarded.post("/v1/diversity", json={"groups": [GROUP]}, headers=headers).status_code == 200
    assert guarded.get("/info", headers=headers).status_code == 200


def test_health_ready_and_metrics_stay_open(guarded):
    for path in ("/health", "/ready", "/metrics"):
        assert guarded.get(path).status_code == 200


def test_probes_answer_head_as_they_answer_get_without_a_body_or_a_key(guarded_server):
    """Balancers and uptime checks may probe with HEAD, which TEI's routes answer: 200 as GET, no body, and the
    kept-alive connection still in step for the next request."""
    with httpx.Client(base_url=guarded_server.url) as http:
        for path in ("/health", "/ready"):
            head = http.head(path)
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-length"] == http.get(path).headers["content-length"]
        assert http.get("/health").json() == {"status": "ok"}


def test_client_sends_the_key_from_argument_or_environment(guarded_service, monkeypatch):
    with guarded_service.client(api_key=KEY) as client:
        assert client.diversity([GROUP]).groups[0].marginals
    monkeypatch.setenv("SETPO_API_KEY", KEY)
    with guarded_service.client() as client:
        assert client.info().model == "all-MiniLM-L6-v2"
    monkeypatch.delenv("SETPO_API_KEY")
    with guarded_service.client(max_retries=0) as client, pytest.raises(SetpoAPIError) as caught:
        client.diversity([GROUP])
    assert caught.value.status == 401


def test_key_never_appears_in_logs_or_answers(guarded_server):
    headers = {"Authorization": f"Bearer {KEY}"}
    answers = [
        httpx.get(guarded_server.url + "/info", headers=headers).text,
        httpx.get(guarded_server.url + "/metrics").text,
        httpx.get(guarded_server.url + "/openapi.json").text,
        httpx.post(
            guarded_server.url + "/v1/diversity", json={"groups": [GROUP]}, headers={"Authorization": "Bearer nope"}
        ).text,
    ]
    assert all(KEY not in answer for answer in answers)
    assert "GET /info" in guarded_server.log()  # the debug log did record the requests...
    assert KEY not in guarded_server.log()  # ...but not the key


def openai_of(service: InProcessService, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=service.URL + "/v1", api_key=api_key, max_retries=0, http_client=service.http())


def test_openai_tooling_sends_the_key_and_is_refused_without_it(guarded_service):
    with (
        openai_of(guarded_service, "wrong") as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.models.list()
    with openai_of(guarded_service, KEY) as client:
        assert [m.id for m in client.models.list().data] == ["all-MiniLM-L6-v2"]

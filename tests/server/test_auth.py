"""SETPO_API_KEY: data routes need the bearer key; health, ready and metrics stay open; the key never leaks."""

import httpx
import openai
import pytest

from setpo_client import SetpoAPIError, SetpoClient
from setpo_server.local import LocalServer

KEY = "s3cret-key-for-tests-7c1d"
GROUP = {"texts": ["one way", "another way", "a third way"]}


@pytest.fixture(scope="module")
def guarded():
    with LocalServer(api_key=KEY, log_level="debug") as server:
        yield server


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}]
)
def test_data_routes_refuse_missing_or_wrong_key(guarded, headers):
    for path, body in [("/v1/diversity", {"groups": [GROUP]}), ("/v1/embeddings", {"input": "x"})]:
        response = httpx.post(guarded.url + path, json=body, headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in response.json()["error"]["message"]
    assert httpx.get(guarded.url + "/info", headers=headers).status_code == 401


def test_right_key_is_accepted(guarded):
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(guarded.url + "/v1/diversity", json={"groups": [GROUP]}, headers=headers).status_code == 200
    assert httpx.get(guarded.url + "/info", headers=headers).status_code == 200


def test_health_ready_and_metrics_stay_open(guarded):
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(guarded.url + path).status_code == 200


def test_client_sends_the_key_from_argument_or_environment(guarded, monkeypatch):
    with SetpoClient(guarded.url, api_key=KEY) as client:
        assert client.diversity([GROUP]).groups[0].marginals
    monkeypatch.setenv("SETPO_API_KEY", KEY)
    with SetpoClient(guarded.url) as client:
        assert client.info().model == "all-MiniLM-L6-v2"
    monkeypatch.delenv("SETPO_API_KEY")
    with SetpoClient(guarded.url, max_retries=0) as client, pytest.raises(SetpoAPIError) as caught:
        client.diversity([GROUP])
    assert caught.value.status == 401


def test_key_never_appears_in_logs_or_answers(guarded):
    headers = {"Authorization": f"Bearer {KEY}"}
    answers = [
        httpx.get(guarded.url + "/info", headers=headers).text,
        httpx.get(guarded.url + "/metrics").text,
        httpx.get(guarded.url + "/openapi.json").text,
        httpx.post(
            guarded.url + "/v1/diversity", json={"groups": [GROUP]}, headers={"Authorization": "Bearer nope"}
        ).text,
    ]
    assert all(KEY not in answer for answer in answers)
    assert "GET /info" in guarded.log()  # the debug log did record the requests...
    assert KEY not in guarded.log()  # ...but not the key


def test_openai_tooling_sends_the_key_and_is_refused_without_it(guarded):
    with (
        openai.OpenAI(base_url=guarded.url + "/v1", api_key="wrong", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.models.list()
    with openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0) as client:
        assert [m.id for m in client.models.list().data] == ["all-MiniLM-L6-v2"]

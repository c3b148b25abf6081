"""Every kind of bad input gets a clear 4xx naming what is wrong; none is a 500; the server keeps serving."""

import gzip
import json

import httpx
import pytest

from setpo_client import SetpoAPIError
from tests.inprocess import InProcessService
from tests.metrics import metric, scrape

OK_GROUP = {"texts": ["one way", "another way", "a third way"]}


def post(service: InProcessService, path: str, body) -> httpx.Response:
    with service.http(timeout=30) as http:
        if isinstance(body, (dict, list)):
            return http.post(path, json=body)
        return http.post(path, content=body, headers={"content-type": "application/json"})


CASES = [
    # (what, body, status, param, words the message must contain)
    ("not JSON", b'{"groups": [', 400, None, "not valid JSON"),
    ("no groups", {"groups": []}, 422, "groups", "at least 1"),
    ("unknown field", {"groups": [OK_GROUP], "lambda": 0.1}, 422, "lambda", "Extra inputs"),
    ("texts not strings", {"groups": [{"texts": ["a", 5, "c"]}]}, 422, "groups[0].texts[1]", "valid string"),
    (
        "reward as string",
        {"groups": [{**OK_GROUP, "rewards": [1, "0.5", 0]}]},
        422,
        "groups[0].rewards[1]",
        "valid number",
    ),
    ("weight as string", {"groups": [OK_GROUP], "weight": "0.1"}, 422, "weight", "valid number"),
    ("negative weight", {"groups": [OK_GROUP], "weight": -1}, 422, "weight", "greater than or equal to 0"),
    (
        "NaN embedding",
        b'{"groups": [{"embeddings": [[NaN, 1], [1, 2], [3, 4]]}]}',
        422,
        "groups[0].embeddings[0][0]",
        "finite",
    ),
    (
        "infinite reward",
        b'{"groups": [{"texts": ["a", "b", "c"], "rewards": [1e999, 0, 1]}]}',
        422,
        "groups[0].rewards[0]",
        "finite",
    ),
    ("ragged embeddings", {"groups": [OK_GROUP, {"embeddings": [[1, 2], [3], [4, 5]]}]}, 422, "groups[1]", "ragged"),
    ("empty embeddings", {"groups": [{"embeddings": [[], [], []]}]}, 422, "groups[0]", "no dimensions"),
    (
        "texts and embeddings",
        {"groups": [{**OK_GROUP, "embeddings": [[1], [2], [3]]}]},
        422,
        "groups[0]",
        "exactly one",
    ),
    ("neither", {"groups": [{"rewards": [1, 0, 1]}]}, 422, "groups[0]", "exactly one"),
    (
        "rewards of wrong length",
        {"groups": [OK_GROUP, {**OK_GROUP, "rewards": [1, 0]}]},
        422,
        "groups[1]",
        "3 members but 2 rewards",
    ),
    ("group of two", {"groups": [OK_GROUP, OK_GROUP, {"texts": ["a", "b"]}]}, 422, "groups[2]", "at least 3"),
    (
        "rewards overflowing the advantage",
        {"groups": [OK_GROUP, {**OK_GROUP, "rewards": [1.5e308, 1.5e308, -1.5e308]}]},
        422,
        "groups[1].rewards",
        "overflow",
    ),
    ("groups not a list", {"groups": {"texts": ["a", "b", "c"]}}, 422, "groups", "valid list"),
]


@pytest.mark.parametrize("what,body,status,param,words", CASES, ids=[case[0] for case in CASES])
def test_bad_diversity_request_is_a_clear_4xx(service, what, body, status, param, words):
    response = post(service, "/v1/diversity", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert error["param"] == param
    assert post(service, "/v1/diversity", {"groups": [OK_GROUP]}).status_code == 200  # still serving


EMBEDDING_CASES = [
    ("token ids", {"input": [101, 2023, 102]}, "input", "token-id input is not supported"),
    ("empty list", {"input": []}, "input", "empty list"),
    ("wrong model", {"input": "hi", "model": "text-embedding-3-small"}, "model", "serves model 'all-MiniLM-L6-v2'"),
    ("too many dimensions", {"input": "hi", "dimensions": 1000}, "dimensions", "more than the model's 384"),
    ("unknown encoding", {"input": "hi", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
]


@pytest.mark.parametrize("what,body,param,words", EMBEDDING_CASES, ids=[case[0] for case in EMBEDDING_CASES])
def test_bad_embeddings_request_is_a_clear_400_as_openai_answers(service, what, body, param, words):
    response = post(service, "/v1/embeddings", body)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("path", ["/v1/diversity", "/v1/embeddings"])
@pytest.mark.parametrize("encoding", ["gzip", "br, gzip"])
def test_a_compressed_body_is_refused_naming_its_encoding_not_as_bad_json(service, path, encoding):
    body = {"groups": [OK_GROUP]} if path == "/v1/diversity" else {"input": "hi"}
    with service.http() as http:
        sent = {"content-type": "application/json", "content-encoding": encoding}
        response = http.post(path, content=gzip.compress(json.dumps(body).encode()), headers=sent)
        assert response.status_code == 415, response.text  # RFC 7694: an unsupported content coding
        assert response.headers["accept-encoding"] == "identity"
        error = response.json()["error"]
        assert f"Content-Encoding {encoding!r}" in error["message"] and error["param"] == "body"
        identity = {"content-type": "application/json", "content-encoding": "identity"}
        assert http.post(path, content=json.dumps(body).encode(), headers=identity).status_code == 200


def test_unknown_route_and_method_are_json_errors(http):
    assert http.get("/v2/diversity").json()["error"]["type"] == "not_found"
    response = http.get("/v1/diversity")
    assert response.status_code == 405 and response.json()["error"]["type"] == "method_not_allowed"


def test_client_raises_with_the_servers_message(inprocess):
    with pytest.raises(SetpoAPIError) as caught:
        inprocess.diversity([OK_GROUP, {"texts": ["only", "two"]}])
    assert caught.value.status == 422 and caught.value.param == "groups[1]" and "at least 3" in caught.value.message


@pytest.fixture(scope="module")
def limited():
    with InProcessService(
        max_groups=2, max_group_size=4, max_text_chars=40, max_body_bytes=2048, max_queue_texts=10
    ) as service:
        yield service


LIMIT_CASES = [
    ("too many groups", {"groups": [OK_GROUP] * 3}, 422, "groups", "SETPO_MAX_GROUPS=2"),
    (
        "group too large",
        {"groups": [OK_GROUP, {"embeddings": [[1.0]] * 5}]},
        422,
        "groups[1]",
        "SETPO_MAX_GROUP_SIZE=4",
    ),
    (
        "text too long",
        {"groups": [{"texts": ["a", "b", "x" * 41]}]},
        422,
        "groups[0].texts[2]",
        "SETPO_MAX_TEXT_CHARS=40",
    ),
    (
        "body too large",
        {"groups": [{"embeddings": [[0.123456789] * 100] * 3}]},
        413,
        "body",
        "SETPO_MAX_BODY_BYTES=2048",
    ),
]


@pytest.mark.parametrize("what,body,status,param,words", LIMIT_CASES, ids=[case[0] for case in LIMIT_CASES])
def test_request_over_a_limit_names_the_limit(limited, what, body, status, param, words):
    response = post(limited, "/v1/diversity", body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"] and response.json()["error"]["param"] == param
    assert post(limited, "/v1/diversity", {"groups": [OK_GROUP]}).status_code == 200


def test_request_with_more_distinct_texts_than_the_queue_holds_is_refused_not_429(limited):
    body = {"groups": [{"texts": list("abcd")}, {"texts": list("efgh")}]}
    assert post(limited, "/v1/diversity", body).status_code == 200  # 8 distinct texts fit in 10
    response = post(limited, "/v1/embeddings", {"input": list("abcdefghijk")})
    # it can never fit, so it is invalid (400 on the OpenAI route), not a 429 to retry
    assert response.status_code == 400 and "SETPO_MAX_QUEUE_TEXTS=10" in response.json()["error"]["message"]


def test_body_streamed_without_content_length_is_limited_too(limited):
    def chunks():
        yield b'{"groups": [{"texts": ["'
        for _ in range(100):
            yield b"x" * 100
        yield b'", "b", "c"]}]}'

    with limited.http() as http:
        response = http.post("/v1/diversity", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "SETPO_MAX_BODY_BYTES" in response.json()["error"]["message"]


def test_no_bad_request_produced_a_server_error(service, limited):
    # in-process, both count into the process's one registry: no 500 from either (nor any other in-process service)
    for running, seen in ((service, "400"), (limited, "413")):
        assert metric(running, f'setpo_requests_total{{route="/v1/diversity",status="{seen}"}}') > 0  # errors count
        assert not any('status="500"' in name for name in scrape(running))
    assert limited.client().diversity([OK_GROUP]).groups[0].marginals

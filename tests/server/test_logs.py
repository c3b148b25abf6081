"""The service's log (issue 27, item 7): one format for the service's lines and uvicorn's, JSON on request, probes
only at debug, no query strings and no progress bars."""

import json

import httpx

from setpo_server.local import LocalServer

LONG = "/v1/" + "x" * 20_000  # within SETPO_MAX_HEADER_BYTES: a 404 whose path could fill a log line


def requests_then_log(server: LocalServer) -> str:
    for path in ("/health", "/ready", "/metrics", "/info?token=abc", LONG):
        httpx.get(server.url + path)
    server.wait_until(lambda: "GET /v1/xxx" in server.log(), timeout=60)  # the last request's line is written
    return server.log()


def test_text_log_is_one_format_without_probes_queries_or_progress_bars():
    with LocalServer() as server:
        lines = requests_then_log(server).splitlines()
    assert lines and all(line[:4].isdigit() for line in lines), lines[:5]  # every line opens with its time
    assert any("uvicorn.error: Started server process" in line for line in lines)  # uvicorn's lines, our format
    assert any('"GET /info HTTP/1.1" 200' in line for line in lines)
    assert not any(probe in line for line in lines for probe in ("GET /health", "GET /ready", "GET /metrics"))
    assert not any("%|" in line or "it/s]" in line for line in lines)  # no progress bars
    assert not any("token=abc" in line for line in lines)
    logged = [line for line in lines if '"GET /v1/xxx' in line]
    assert len(logged) == 1 and len(logged[0]) < 400 and '" 404' in logged[0]  # the path cut, the line kept


def test_json_log_is_one_object_a_line_and_debug_brings_the_probes_back():
    with LocalServer(log_format="json", log_level="debug") as server:
        log = requests_then_log(server)
    records = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(record) for record in records)
    assert any(record["logger"] == "setpo_server" and record["message"] == "ready" for record in records)
    assert any("GET /health" in record["message"] for record in records)

"""Prometheus metrics, served at GET /metrics, and the middleware that times every request."""

import time

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from setpo_server.api_keys import ANONYMOUS
from setpo_server.logs import ACCESS_CALLER

# caller: the name of the key the request sent (api_keys.py), so as many values as the key file has names, or ANONYMOUS
REQUESTS = Counter("setpo_requests_total", "HTTP requests answered", ["route", "status", "caller"])
LATENCY = Histogram(
    "setpo_request_duration_seconds",
    "HTTP request latency",
    ["route", "status", "caller"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
QUEUE_TEXTS = Gauge("setpo_queue_texts", "Texts admitted and not yet embedded")
QUEUE_TOKENS = Gauge("setpo_queue_tokens", "Tokens admitted and not yet embedded")
REQUESTS_IN_PROGRESS = Gauge(
    "setpo_requests_in_progress", "Data requests (/v1/*) being served, answers being sent included"
)
ANSWERS_UNSENT = Gauge(
    "setpo_answers_unsent",
    "Answers whose socket stopped taking them, until it takes more or SETPO_WRITE_TIMEOUT drops them",
)
BATCH_SIZE = Histogram(
    "setpo_batch_size", "Texts per forward pass", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
)
BATCH_TOKENS = Histogram(
    "setpo_batch_tokens",
    "Padded tokens per forward pass",
    buckets=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
)
# Model time alone (pad, forward, normalise): against request latency it tells serving overhead from compute
FORWARD_SECONDS = Histogram(
    "setpo_forward_seconds",
    "Seconds of one forward pass",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TEXTS_EMBEDDED = Counter("setpo_texts_embedded_total", "Texts run through the model")
TEXTS_DEDUPLICATED = Counter(
    "setpo_texts_deduplicated_total", "Texts not embedded: an identical text was in the same request or batch"
)
TEXTS_TRUNCATED = Counter("setpo_texts_truncated_total", "Texts cut to the model's maximum length")
CONNECTIONS_TIMED_OUT = Counter(
    "setpo_connections_timed_out_total", "Connections closed with 408: request headers not in by SETPO_HEADER_TIMEOUT"
)
HEADERS_TOO_LARGE = Counter(
    "setpo_headers_too_large_total",
    "Connections closed for request headers over SETPO_MAX_HEADER_BYTES: with 431, or cut off by a trailer flood",
)
CONNECTIONS_OPEN = Gauge("setpo_connections_open", "Client connections open")
CONNECTIONS_RECLAIMED = Counter(
    "setpo_connections_reclaimed_total", "Idle connections closed to make room at SETPO_MAX_CONNECTIONS"
)
CONNECTIONS_REFUSED = Counter(
    "setpo_connections_refused_total", "Connections answered 503 and closed: SETPO_MAX_CONNECTIONS, all busy"
)
CONNECTIONS_WRITE_TIMED_OUT = Counter(
    "setpo_connections_write_timed_out_total",
    "Connections dropped with their answer: the caller did not take it within SETPO_WRITE_TIMEOUT",
)
READY = Gauge("setpo_ready", "1 once the model is loaded and warmed up")


class RequestMetrics:
    """Counts and times each request by route template (not raw path, to keep label cardinality bounded) and caller,
    and hands the caller to uvicorn's access line (logs.access_line), which is written while the answer starts."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500  # if the app dies before answering, that is what the caller saw

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                ACCESS_CALLER.set(scope.get("state", {}).get("caller"))  # auth.require_key put it there
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")
            caller = scope.get("state", {}).get("caller", ANONYMOUS)
            labels = (getattr(route, "path", "unmatched"), str(status), caller)
            REQUESTS.labels(*labels).inc()
            LATENCY.labels(*labels).observe(time.perf_counter() - start)

"""Admission and limits: who gets in (a warm model, one of SETPO_MAX_CONCURRENT_REQUESTS places), a body within
SETPO_MAX_BODY_BYTES and SETPO_RECEIVE_TIMEOUT, and what a request may cost (text lengths, answer size).

Data routes read their own body: FastAPI would parse and validate it on the event loop (an 8 MB body of
numbers holds the loop for a second or more); here it is read within the limits, then parsed by pydantic's
JSON parser in a worker thread, which lets the loop run meanwhile, and refused if an object gives a name twice.
The queue's own bounds (texts, tokens) are the batcher's.
"""

import asyncio
import math
from collections.abc import AsyncIterator
from typing import TypeVar

import jiter
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from setpo_server import metrics
from setpo_server.auth import caller
from setpo_server.batcher import Batcher
from setpo_server.errors import LOADING_RETRY_AFTER, ApiError, echoed
from setpo_server.settings import Settings
from setpo_server.state import ServiceState, service

# Bodies above this parse at most BIG_BODIES_AT_ONCE at a time: parsing costs up to ~37 bytes a JSON number
# (docs/reliability.md), so this bounds the memory concurrent big bodies can claim together.
BIG_BODY_BYTES = 1024 * 1024
BIG_BODIES_AT_ONCE = 2

Body = TypeVar("Body", bound=BaseModel)


async def ready_batcher(request: Request) -> Batcher:
    """The batcher once the model is warm; before that, or once the service failed, 503 saying why."""
    state = service(request)
    batcher = state.batcher
    if batcher is not None and batcher.failure is None:
        return batcher
    if state.load_error:
        message = f"model failed to load: {state.load_error}"
    elif batcher is not None:
        message = f"the service failed and is restarting: {batcher.failure}"
    else:
        message = "model is loading and warming up; retry shortly"
    raise ApiError(503, message, "unavailable", retry_after=LOADING_RETRY_AFTER)


async def limit_in_progress(request: Request) -> AsyncIterator[None]:
    """At most SETPO_MAX_CONCURRENT_REQUESTS data requests at once, an answer its caller has not taken yet counted
    as one, and of those at most SETPO_MAX_REQUESTS_PER_CALLER from one caller; the next gets 503 before its body
    is read."""
    state = service(request)
    limit, who, per_caller = state.settings.max_concurrent_requests, caller(request), places_per_caller(state)
    busy = state.in_progress + state.unsent_answers >= limit
    if busy or state.held.get(who, 0) >= per_caller:
        retry = state.batcher.retry_after() if state.batcher is not None else LOADING_RETRY_AFTER
        message = (
            f"server is busy ({state.in_progress} requests in progress, {state.unsent_answers} answers not yet taken "
            f"by their callers, SETPO_MAX_CONCURRENT_REQUESTS={limit}); retry after {retry} s"
            if busy
            else f"caller {who!r} holds {state.held[who]} of the service's places (requests in progress and answers "
            f"not yet taken), SETPO_MAX_REQUESTS_PER_CALLER={per_caller}; retry after {retry} s"
        )
        raise ApiError(503, message, "overloaded", retry_after=retry, unread_body=True)
    state.in_progress += 1
    state.hold(who, 1)
    metrics.REQUESTS_IN_PROGRESS.set(state.in_progress)
    try:
        yield
    finally:
        state.in_progress -= 1
        state.hold(who, -1)
        metrics.REQUESTS_IN_PROGRESS.set(state.in_progress)


def places_per_caller(state: ServiceState) -> int:
    """SETPO_MAX_REQUESTS_PER_CALLER, auto resolved against the keys in force (the key file may name more meanwhile)."""
    setting, limit = state.settings.max_requests_per_caller, state.settings.max_concurrent_requests
    if setting != "auto":
        return setting
    return math.ceil(limit / 2) if state.keys.callers >= 2 else limit


def body_too_large(limit: int) -> ApiError:
    message = f"request body is larger than SETPO_MAX_BODY_BYTES={limit} bytes; split the request"
    return ApiError(413, message, "invalid_request_error", "body", unread_body=True)


async def read_body(request: Request, model: type[Body]) -> Body:
    """The body, uncompressed (415), within SETPO_MAX_BODY_BYTES (413) and SETPO_RECEIVE_TIMEOUT (408), validated
    in a worker thread."""
    state = service(request)
    settings = state.settings
    encoding = request.headers.get("content-encoding", "identity")
    if encoding.strip().lower() != "identity":  # else a compressed body is answered as JSON that does not parse
        message = f"Content-Encoding {echoed(encoding)} is not supported; send the body uncompressed"
        refused = ApiError(415, message, "invalid_request_error", "body", unread_body=True)
        refused.headers["Accept-Encoding"] = "identity"  # RFC 7694: the codings this service reads
        raise refused
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > settings.max_body_bytes:
        raise body_too_large(settings.max_body_bytes)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(settings.receive_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > settings.max_body_bytes:
                    raise body_too_large(settings.max_body_bytes)
                chunks.append(chunk)
    except TimeoutError:
        message = (
            f"the body did not arrive within SETPO_RECEIVE_TIMEOUT={settings.receive_timeout} s ({size} bytes received)"
        )
        raise ApiError(408, message, "timeout", "body", unread_body=True) from None
    except ClientDisconnect:
        raise ApiError(499, "client closed the request while sending it", "client_closed") from None
    body = b"".join(chunks)
    del chunks
    try:
        if size <= BIG_BODY_BYTES:
            return await run_in_threadpool(parse, model, body)
        async with state.big_bodies:
            return await run_in_threadpool(parse, model, body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None


def parse(model: type[Body], body: bytes) -> Body:
    """The body validated, refused (422) if an object in it gives one name twice: the parser would keep the last
    value and drop the others unsaid (TEI refuses these too).

    Each name given has its colon; every other colon is in a string, whose parsed value holds it too unless it was
    written \\u003a. So a body whose colons are one per field set plus its strings', less its \\u003a, gave each
    name once, for the price of a few counts. Any other (a duplicate; a text holding a backslash and u003a, counted
    as an escape) is parsed again by jiter to look; docs/reliability.md says what each costs."""
    parsed = model.model_validate_json(body)
    # searched for only where a backslash is: bodies of numbers have none, and each search costs as much as the count
    escaped_colons = body.count(b"\\u003a") + body.count(b"\\u003A") if b"\\" in body else 0
    if body.count(b":") == colons_once(parsed) - escaped_colons:
        return parsed
    try:
        jiter.from_json(body, catch_duplicate_keys=True)
    except ValueError as exc:  # the body parsed above, so this is the duplicate
        raise ApiError(422, f"{exc}; a JSON object may give each name once", "invalid_request_error", "body") from None
    return parsed


def colons_once(value: object) -> int:
    """The colons a parsed value's JSON holds if it gave each name once: a name per field set, and its strings'."""
    if isinstance(value, BaseModel):
        return sum(1 + colons_once(getattr(value, field)) for field in value.model_fields_set)
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return sum(colons_once(item) for item in value)
    if isinstance(value, list):  # of strings, numbers or nulls: one count over the strings, not a call each
        return "".join(item for item in value if isinstance(item, str)).count(":")
    return value.count(":") if isinstance(value, str) else 0


def check_text_lengths(texts: list[str], settings: Settings, param: str) -> None:
    for j, text in enumerate(texts):
        if len(text) > settings.max_text_chars:
            message = f"text has {len(text)} characters, more than SETPO_MAX_TEXT_CHARS={settings.max_text_chars}"
            raise ApiError(422, message, "invalid_request_error", f"{param}[{j}]")


def check_answer_size(estimate: int, settings: Settings, param: str, advice: str) -> None:
    """Refuse, before any work, an answer larger than SETPO_MAX_RESPONSE_BYTES: what a caller may make us hold
    while it reads (slowly, or never) is bounded like what it may send."""
    if estimate > settings.max_response_bytes:
        message = (
            f"the answer would take about {estimate} bytes, more than SETPO_MAX_RESPONSE_BYTES="
            f"{settings.max_response_bytes}; {advice}send fewer inputs, or split the request"
        )
        raise ApiError(422, message, "invalid_request_error", param)

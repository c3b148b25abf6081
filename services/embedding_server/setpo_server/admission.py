"""Admission: who gets in (a warm model; one of SETPO_MAX_CONCURRENT_REQUESTS places, at most
SETPO_MAX_REQUESTS_PER_CALLER of them one caller's), and the body that becomes a typed request: read within its limits,
then parsed by pydantic in a worker thread (on the event loop a big body of numbers would hold it for a second or more),
where the schemas hold it to the limits and the contract (schemas.Served).
"""

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from setpo_server import metrics
from setpo_server.auth import Caller
from setpo_server.backend import Backend
from setpo_server.batcher import Batcher
from setpo_server.errors import LOADING_RETRY_AFTER, ApiError
from setpo_server.schemas import Served, echoed
from setpo_server.state import Service, ServiceState

# Bodies above this parse at most BIG_BODIES_AT_ONCE at a time: a body of numbers takes many times its size while it
# parses (docs/reliability.md, "What one request can cost"), so this bounds what concurrent big bodies claim together.
BIG_BODY_BYTES = 1024 * 1024
BIG_BODIES_AT_ONCE = 2

Body = TypeVar("Body", bound=BaseModel)


async def ready_batcher(state: Service) -> Batcher:
    """The batcher once the model is warm; before that, or once the service failed, 503 saying why."""
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


Ready = Annotated[Batcher, Depends(ready_batcher)]


async def limit_in_progress(state: Service, caller: Caller) -> AsyncIterator[None]:
    """At most SETPO_MAX_CONCURRENT_REQUESTS data requests at once, and of those at most SETPO_MAX_REQUESTS_PER_CALLER
    from one caller; the next gets 503 before its body is read. A request holds its place until its answer is sent
    (routes.SlicedAnswer), so answers their callers leave unread count too, until SETPO_WRITE_TIMEOUT drops them."""
    limit, per_caller = state.settings.max_concurrent_requests, places_per_caller(state)
    held = state.held.get(caller, 0)
    if state.in_progress >= limit or held >= per_caller:
        retry = state.batcher.retry_after() if state.batcher is not None else LOADING_RETRY_AFTER
        message = (
            f"server is busy ({state.in_progress} requests in progress or being answered, "
            f"SETPO_MAX_CONCURRENT_REQUESTS={limit}); retry after {retry} s"
            if state.in_progress >= limit
            else f"caller {caller!r} holds {held} of the service's places (requests in progress or being answered), "
            f"SETPO_MAX_REQUESTS_PER_CALLER={per_caller}; retry after {retry} s"
        )
        raise ApiError(503, message, "overloaded", retry_after=retry, unread_body=True)
    state.in_progress += 1
    state.held[caller] = held + 1
    metrics.REQUESTS_IN_PROGRESS.set(state.in_progress)
    try:
        yield
    finally:
        state.in_progress -= 1
        state.held[caller] -= 1
        if not state.held[caller]:
            del state.held[caller]
        metrics.REQUESTS_IN_PROGRESS.set(state.in_progress)


# the place is given back after the answer is sent, not when the handler returns
DATA_ROUTE = [Depends(limit_in_progress, scope="request")]


def places_per_caller(state: ServiceState) -> int:
    """SETPO_MAX_REQUESTS_PER_CALLER, auto resolved against the keys in force (the key file may name more meanwhile)."""
    setting, limit = state.settings.max_requests_per_caller, state.settings.max_concurrent_requests
    if setting != "auto":
        return setting
    return math.ceil(limit / 2) if state.keys.callers >= 2 else limit


def body_too_large(limit: int) -> ApiError:
    message = f"request body is larger than SETPO_MAX_BODY_BYTES={limit} bytes; split the request"
    return ApiError(413, message, "invalid_request_error", "body", unread_body=True)


async def read_request(request: Request, model: type[Body], state: ServiceState, backend: Backend) -> Body:
    """The body as a typed request: uncompressed (else 415), within SETPO_MAX_BODY_BYTES (413) and
    SETPO_RECEIVE_TIMEOUT (408), parsed and held to the limits and the contract in a worker thread."""
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
    served = Served(settings, backend.served_names, backend.model_path, backend.dimension)
    try:
        async with state.big_bodies if size > BIG_BODY_BYTES else contextlib.nullcontext():
            return await run_in_threadpool(model.model_validate_json, body, context=served)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None

"""HTTP routes (the first stage of a request): the key before the body, limits, status codes, response models.

Data routes read their own body: FastAPI would parse and validate it on the event loop (an 8 MB body of
numbers holds the loop for a second or more); here it is read within SETPO_MAX_BODY_BYTES and
SETPO_RECEIVE_TIMEOUT, then parsed by pydantic's JSON parser in a worker thread, which lets the loop run
meanwhile. Probes are `async def`: they answer from the event loop and never wait for the worker threads.
"""

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from setpo_core.diversity import unit_rows
from setpo_server import CONTRACT_VERSION, __version__, metrics
from setpo_server.batcher import Batcher, BatcherFailed, Overloaded, TooLarge
from setpo_server.errors import ApiError, body_too_large, echoed
from setpo_server.schemas import (
    DiversityRequest,
    DiversityResponse,
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    ErrorResponse,
    Info,
    Limits,
    Model,
    ModelList,
)
from setpo_server.scoring import ScoringError, embed_texts, score_request
from setpo_server.settings import Settings

LOADING_RETRY_AFTER = 5  # seconds; loading and warming a model takes about this long on CPU
DISCONNECT_POLL_SECONDS = 0.25  # how often a waiting request checks that its caller is still there
# Bodies above this parse at most BIG_BODIES_AT_ONCE at a time: parsing costs up to ~37 bytes a JSON number
# (docs/reliability.md), so this bounds the memory concurrent big bodies can claim together.
BIG_BODY_BYTES = 1024 * 1024
BIG_BODIES_AT_ONCE = 2

router = APIRouter()
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 408, 413, 422, 429, 503)
}
Body = TypeVar("Body", bound=BaseModel)


async def require_key(request: Request) -> None:
    """Runs before the body is read: a wrong key costs the server a header compare, not a parse."""
    key = request.app.state.settings.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), key.get_secret_value().encode()):
        message = "missing or wrong API key: send the header 'Authorization: Bearer <SETPO_API_KEY>'"
        raise ApiError(401, message, "authentication_error", unread_body=True)


async def ready_batcher(request: Request) -> Batcher:
    batcher = request.app.state.batcher
    if batcher is None or batcher.failure is not None:
        raise ApiError(503, not_ready_message(request), "unavailable", retry_after=LOADING_RETRY_AFTER)
    return batcher


def not_ready_message(request: Request) -> str:
    if request.app.state.load_error:
        return f"model failed to load: {request.app.state.load_error}"
    batcher = request.app.state.batcher
    if batcher is not None and batcher.failure is not None:
        return f"the service failed and is restarting: {batcher.failure}"
    return "model is loading and warming up; retry shortly"


async def limit_in_progress(request: Request) -> AsyncIterator[None]:
    """At most SETPO_MAX_CONCURRENT_REQUESTS data requests at once; the next gets 503 before its body is read."""
    state, limit = request.app.state, request.app.state.settings.max_concurrent_requests
    if state.in_progress >= limit:
        retry = state.batcher.retry_after() if state.batcher is not None else LOADING_RETRY_AFTER
        message = f"server is busy ({state.in_progress} requests in progress, SETPO_MAX_CONCURRENT_REQUESTS={limit}); retry after {retry} s"
        raise ApiError(503, message, "overloaded", retry_after=retry, unread_body=True)
    state.in_progress += 1
    metrics.REQUESTS_IN_PROGRESS.set(state.in_progress)
    try:
        yield
    finally:
        state.in_progress -= 1
        metrics.REQUESTS_IN_PROGRESS.set(state.in_progress)


DATA_ROUTE = [Depends(require_key), Depends(limit_in_progress)]  # in this order: the key first


async def read_body(request: Request, model: type[Body]) -> Body:
    """The body within SETPO_MAX_BODY_BYTES (413) and SETPO_RECEIVE_TIMEOUT (408), validated in a worker thread."""
    settings: Settings = request.app.state.settings
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
            return await run_in_threadpool(model.model_validate_json, body)
        async with request.app.state.big_bodies:
            return await run_in_threadpool(model.model_validate_json, body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None


async def until_done_or_gone(request: Request, work: Awaitable[Any], param: str) -> Any:
    """Await `work`, mapping the later stages' refusals to HTTP; a caller that disconnects has it cancelled."""
    task = asyncio.ensure_future(work)
    while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS))[0]:
        if await request.is_disconnected():
            task.cancel()
            raise ApiError(499, "client closed the request; its work was dropped", "client_closed")
    try:
        return task.result()
    except Overloaded as exc:
        limit = getattr(request.app.state.settings, exc.setting.removeprefix("SETPO_").lower())
        message = (
            f"server is busy ({exc.queued_texts} texts, {exc.queued_tokens} tokens queued, {exc.setting}={limit}); "
            f"retry after {exc.retry_after} s"
        )
        raise ApiError(429, message, "overloaded", retry_after=exc.retry_after) from None
    except TooLarge as exc:
        raise ApiError(422, str(exc), "invalid_request_error", param) from None
    except BatcherFailed as exc:
        raise ApiError(
            503, f"the service failed and is restarting: {exc}", "unavailable", retry_after=LOADING_RETRY_AFTER
        ) from None
    except ScoringError as exc:
        raise ApiError(422, exc.message, "invalid_request_error", exc.param) from None


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


@router.get("/health")
async def health() -> dict:
    """Alive: the process answers. Says nothing about the model (see /ready)."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"model": ErrorResponse}})
async def ready(request: Request) -> dict:
    """200 once the model is loaded and warmed up, 503 with Retry-After before (and once the service failed)."""
    await ready_batcher(request)
    return {"status": "ready"}


@router.get("/metrics", response_class=Response)
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/info", dependencies=[Depends(require_key)], responses=ERRORS)
async def info(request: Request, batcher: Batcher = Depends(ready_batcher)) -> Info:
    settings, backend = request.app.state.settings, batcher.backend
    limits = Limits(
        **{**settings.model_dump(include=set(Limits.model_fields)), "max_batch_tokens": batcher.max_batch_tokens}
    )
    return Info(
        version=__version__,
        contract=CONTRACT_VERSION,
        model=backend.name,
        model_path=backend.model_path,
        dimension=backend.dimension,
        max_tokens=backend.max_tokens,
        device=backend.device,
        dtype=str(backend.dtype).removeprefix("torch."),
        dtype_reason=backend.dtype_reason,
        compiled=settings.compile,
        threads=request.app.state.threads,
        truncate_chars=backend.max_chars,
        truncation_side=settings.truncation_side,
        shape=settings.shape,
        default_weight=settings.weight,
        limits=limits,
    )


@router.get("/v1/models", dependencies=[Depends(require_key)], responses=ERRORS)
async def models(request: Request, batcher: Batcher = Depends(ready_batcher)) -> ModelList:
    """OpenAI's model list: the model this server embeds with, under each name it answers to."""
    return ModelList(data=[served_model(name, batcher) for name in served_names(request, batcher)])


@router.get(
    "/v1/models/{model:path}", dependencies=[Depends(require_key)], responses={**ERRORS, 404: {"model": ErrorResponse}}
)
async def model(model: str, request: Request, batcher: Batcher = Depends(ready_batcher)) -> Model:
    """OpenAI's model retrieval; the served model by a name it answers to or by the path or hub id it was loaded from."""
    check_model_name(model, request, batcher, 404, "not_found")
    return served_model(model if model != batcher.backend.model_path else served_names(request, batcher)[0], batcher)


def served_names(request: Request, batcher: Batcher) -> list[str]:
    """SETPO_SERVED_MODEL_NAME (as vLLM's --served-model-name), else the model's own name; the first names answers."""
    return request.app.state.settings.served_model_name or [batcher.backend.name]


def check_model_name(name: str, request: Request, batcher: Batcher, status: int, kind: str) -> None:
    names = served_names(request, batcher)
    if name not in (*names, batcher.backend.model_path):
        message = f"this server serves model {' / '.join(map(repr, names))}, not {echoed(name)}"
        raise ApiError(status, message, kind, "model")


def served_model(name: str, batcher: Batcher) -> Model:
    return Model(id=name, created=batcher.backend.created, owned_by="setpo")


def request_body(model: type[BaseModel]) -> dict:
    """OpenAPI for a body the route reads itself (publish_request_bodies adds the schema to the components)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def publish_request_bodies(app: FastAPI) -> None:
    """/openapi.json with the request models of the routes that read their own body (clients test against it)."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        schema = app.openapi_schema
        if schema is None:
            schema = default_openapi()  # also kept as app.openapi_schema
            _, definitions = models_json_schema(
                [(DiversityRequest, "validation"), (EmbeddingsRequest, "validation")],
                ref_template="#/components/schemas/{model}",
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions["$defs"])
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema


@router.post(
    "/v1/diversity",
    dependencies=DATA_ROUTE,
    response_model=DiversityResponse,
    responses=ERRORS,
    openapi_extra=request_body(DiversityRequest),
)
async def diversity(request: Request, batcher: Batcher = Depends(ready_batcher)) -> Response:
    """Leave-one-out marginals, local masses and set scores per group; shaped advantages where rewards are given.
    Contract v1.1 (keys, min_reward, kernel, normalize) adds each group's `scored` and `bonus` and the `weight`."""
    settings: Settings = request.app.state.settings
    body = await read_body(request, DiversityRequest)
    if len(body.groups) > settings.max_groups:
        message = f"request has {len(body.groups)} groups, more than SETPO_MAX_GROUPS={settings.max_groups}; split it"
        raise ApiError(422, message, "invalid_request_error", "groups")
    rows = 0
    for b, group in enumerate(body.groups):
        if group.size > settings.max_group_size:
            message = f"group has {group.size} members, more than SETPO_MAX_GROUP_SIZE={settings.max_group_size}"
            raise ApiError(422, message, "invalid_request_error", f"groups[{b}]")
        if group.texts is not None:
            check_text_lengths(group.texts, settings, f"groups[{b}].texts")
        if group.keys is not None:
            check_text_lengths([key or "" for key in group.keys], settings, f"groups[{b}].keys")
        rows += group.size
    if rows > settings.max_request_rows:
        message = f"request has {rows} texts and embedding rows, more than SETPO_MAX_REQUEST_ROWS={settings.max_request_rows}; split it"
        raise ApiError(422, message, "invalid_request_error", "groups")
    check_answer_size(rows * 5 * 24 + len(body.groups) * 160, settings, "groups", "")  # <= 5 numbers a member

    weight = settings.weight if body.weight is None else body.weight
    results, usage = await until_done_or_gone(request, score_request(body, batcher, weight, settings.shape), "groups")
    response = DiversityResponse(
        model=served_names(request, batcher)[0], groups=results, usage=usage, weight=None if body.is_v1 else weight
    )
    # serialised in a worker thread: thousands of groups must not hold the event loop
    return Response(await run_in_threadpool(response.model_dump_json, exclude_none=True), media_type="application/json")


@router.post(
    "/v1/embeddings",
    dependencies=DATA_ROUTE,
    response_model=EmbeddingsResponse,
    responses=ERRORS,
    openapi_extra=request_body(EmbeddingsRequest),
)
async def embeddings(request: Request, batcher: Batcher = Depends(ready_batcher)) -> Response:
    """OpenAI-compatible embeddings: unit-length vectors, as floats or base64 little-endian float32."""
    settings: Settings = request.app.state.settings
    body = await read_body(request, EmbeddingsRequest)
    backend = batcher.backend
    if body.model is not None:
        check_model_name(body.model, request, batcher, 422, "invalid_request_error")
    if body.dimensions is not None and body.dimensions > backend.dimension:
        message = f"dimensions={body.dimensions} is more than the model's {backend.dimension}"
        raise ApiError(422, message, "invalid_request_error", "dimensions")
    texts = [body.input] if isinstance(body.input, str) else body.input
    if len(texts) > settings.max_embedding_inputs:
        message = f"input has {len(texts)} texts, more than SETPO_MAX_EMBEDDING_INPUTS={settings.max_embedding_inputs}; split it"
        raise ApiError(422, message, "invalid_request_error", "input")
    check_text_lengths(texts, settings, "input")
    dims = body.dimensions or backend.dimension
    # per vector: base64 of float32 is 4 * ceil(4 d / 3) characters, a JSON float at most ~24; 48 for the rest
    per_vector = 4 * -(-4 * dims // 3) if body.encoding_format == "base64" else 24 * dims
    check_answer_size(len(texts) * (per_vector + 48), settings, "input", "ask for encoding_format 'base64', ")

    embedded = await until_done_or_gone(request, embed_texts(batcher, texts), "input")

    def serialised() -> str:  # in a worker thread: thousands of vectors must not hold the event loop
        rows = embedded.embeddings  # (n, dim)
        if body.dimensions is not None:
            rows = unit_rows(rows[:, : body.dimensions])
        if body.encoding_format == "base64":
            vectors = [base64.b64encode(row.numpy().astype("<f4").tobytes()).decode() for row in rows]
        else:
            vectors = rows.tolist()
        tokens = sum(embedded.tokens)
        return EmbeddingsResponse(
            data=[Embedding(index=i, embedding=vector) for i, vector in enumerate(vectors)],
            model=served_names(request, batcher)[0],
            usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens, truncated=sum(embedded.truncated)),
        ).model_dump_json(exclude_none=True)

    return Response(await run_in_threadpool(serialised), media_type="application/json")

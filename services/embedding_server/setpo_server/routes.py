"""HTTP routes (the first stage of a request), handlers only: each reads its request (admission.read_request, where its
content is checked), calls the scoring stage and sends the answer. Probes are `async def`: they answer from the event
loop and never wait for the worker threads.
"""

import base64
import threading
from collections.abc import Callable

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from setpo_core.diversity import unit_rows
from setpo_server import CONTRACT_VERSION, __version__
from setpo_server.admission import DATA_ROUTE, Ready, places_per_caller, read_request, ready_batcher
from setpo_server.auth import Caller, require_key
from setpo_server.errors import ApiError, until_done_or_gone
from setpo_server.openapi import ERRORS, request_body
from setpo_server.runtime import MALLOC_TRIM
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
    echoed,
    max_request_rows,
)
from setpo_server.scoring import embed_texts, score_request
from setpo_server.state import Service

router = APIRouter()
KEY = [Depends(require_key)]
# One /v1/embeddings answer built at a time: torch's tolist and pydantic hold the GIL in long C calls, and a dozen at
# once kept the event loop, /health included, from running (docs/reliability.md, "What one request can cost").
SERIALISING = threading.Lock()
ANSWER_SLICE_BYTES = 64 * 1024
BIG_ANSWER_BYTES = 1024 * 1024  # its pages go back to the OS once it is sent


class SlicedAnswer(Response):
    """JSON sent a slice at a time, each once the socket took the one before: the request keeps its place
    (SETPO_MAX_CONCURRENT_REQUESTS, the caller's share) until its caller has read the answer or SETPO_WRITE_TIMEOUT
    drops it (protocol.py)."""

    media_type = "application/json"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, self.body = self.body, b""  # this call holds the answer's only reference: freed when it returns
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        for start in range(0, max(len(body), 1), ANSWER_SLICE_BYTES):
            end = start + ANSWER_SLICE_BYTES
            await send({"type": "http.response.body", "body": body[start:end], "more_body": end < len(body)})
        if len(body) > BIG_ANSWER_BYTES and MALLOC_TRIM is not None:
            del body  # glibc keeps freed memory for the next forward pass (runtime.keep_freed_memory): give it back
            await run_in_threadpool(MALLOC_TRIM, 0)


async def answer(serialise: Callable[[], str]) -> SlicedAnswer:
    """Serialised in a worker thread: thousands of groups or vectors must not hold the event loop."""
    return SlicedAnswer(await run_in_threadpool(serialise))


# The probes answer HEAD too, as TEI's do (a balancer's or uptime check's probe); uvicorn sends no body for it.
@router.head("/health", include_in_schema=False)
@router.get("/health")
async def health() -> dict:
    """Alive: the process answers. Says nothing about the model (see /ready)."""
    return {"status": "ok"}


@router.head("/ready", include_in_schema=False)
@router.get("/ready", responses={503: {"model": ErrorResponse}}, dependencies=[Depends(ready_batcher)])
async def ready() -> dict:
    """200 once the model is loaded and warmed up, 503 with Retry-After before (and once the service failed)."""
    return {"status": "ready"}


@router.get("/metrics", response_class=Response)
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/info", dependencies=KEY, responses=ERRORS)
async def info(state: Service, batcher: Ready) -> Info:
    settings, backend = state.settings, batcher.backend
    resolved = {
        "max_batch_tokens": batcher.max_batch_tokens,
        "max_requests_per_caller": places_per_caller(state),
        "max_request_rows": max_request_rows(settings),
    }
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
        threads=state.threads,
        truncate_chars=backend.max_chars,
        truncation_side=settings.truncation_side,
        shape=settings.shape,
        default_weight=settings.weight,
        limits=Limits(**{**settings.model_dump(include=set(Limits.model_fields)), **resolved}),
    )


@router.get("/v1/models", dependencies=KEY, responses=ERRORS)
async def models(batcher: Ready) -> ModelList:
    """OpenAI's model list: the model this server embeds with, under each name it answers to."""
    backend = batcher.backend
    return ModelList(data=[Model(id=name, created=backend.created, owned_by="setpo") for name in backend.served_names])


@router.get("/v1/models/{model:path}", dependencies=KEY, responses={**ERRORS, 404: {"model": ErrorResponse}})
async def model(model: str, batcher: Ready) -> Model:
    """OpenAI's model retrieval; the served model by a name it answers to or by the path or hub id it was loaded from."""
    backend = batcher.backend
    if model not in (*backend.served_names, backend.model_path):
        names = " / ".join(map(repr, backend.served_names))
        raise ApiError(404, f"this server serves model {names}, not {echoed(model)}", "not_found", "model")
    name = backend.served_names[0] if model == backend.model_path else model
    return Model(id=name, created=backend.created, owned_by="setpo")


@router.post(
    "/v1/diversity",
    dependencies=DATA_ROUTE,
    response_model=DiversityResponse,
    responses=ERRORS,
    openapi_extra=request_body(DiversityRequest),
)
async def diversity(request: Request, state: Service, batcher: Ready, caller: Caller) -> Response:
    """Leave-one-out marginals, local masses and set scores per group; shaped advantages where rewards are given.
    Contract v1.1 (keys, min_reward, kernel, normalize) adds each group's `scored` and `bonus` and the `weight`."""
    body = await read_request(request, DiversityRequest, state, batcher.backend)
    weight = state.settings.weight if body.weight is None else body.weight
    scored = score_request(body, batcher, weight, state.settings.shape, caller)
    results, usage = await until_done_or_gone(request, scored, "groups")
    response = DiversityResponse(
        model=batcher.backend.served_names[0], groups=results, usage=usage, weight=None if body.is_v1 else weight
    )
    return await answer(lambda: response.model_dump_json(exclude_none=True))


@router.post(
    "/v1/embeddings",
    dependencies=DATA_ROUTE,
    response_model=EmbeddingsResponse,
    responses=ERRORS,
    openapi_extra=request_body(EmbeddingsRequest),
)
async def embeddings(request: Request, state: Service, batcher: Ready, caller: Caller) -> Response:
    """OpenAI-compatible embeddings: unit-length vectors, as floats or base64 little-endian float32."""
    body = await read_request(request, EmbeddingsRequest, state, batcher.backend)
    embedded = await until_done_or_gone(request, embed_texts(batcher, body.texts, caller), "input")

    def serialised() -> str:  # one at a time (SERIALISING)
        with SERIALISING:
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
                model=batcher.backend.served_names[0],
                usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens, truncated=sum(embedded.truncated)),
            ).model_dump_json(exclude_none=True)

    return await answer(serialised)

"""HTTP routes (the first stage of a request), handlers only: each reads its body, checks the request's limits,
calls the scoring stage and shapes the answer. The key (auth.py), admission and body limits (admission.py),
the mapping of errors to HTTP (errors.py) and the OpenAPI additions (openapi.py) live in their own modules.

Probes are `async def`: they answer from the event loop and never wait for the worker threads.
"""

import base64
import threading

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from setpo_core.diversity import unit_rows
from setpo_server import CONTRACT_VERSION, __version__
from setpo_server.admission import (
    check_answer_size,
    check_text_lengths,
    limit_in_progress,
    places_per_caller,
    read_body,
    ready_batcher,
)
from setpo_server.auth import caller, require_key
from setpo_server.batcher import Batcher
from setpo_server.errors import ApiError, echoed, until_done_or_gone
from setpo_server.openapi import ERRORS, request_body
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
from setpo_server.scoring import embed_texts, score_request
from setpo_server.state import service

router = APIRouter()
DATA_ROUTE = [Depends(require_key), Depends(limit_in_progress)]  # in this order: the key first
# One /v1/embeddings answer built at a time: torch's tolist and pydantic hold the GIL in long C calls, and a dozen at
# once kept the event loop from it, /health included, for up to 1.9 s (docs/reliability.md, big answers).
SERIALISING = threading.Lock()


# The probes answer HEAD too, as TEI's do (a balancer's or uptime check's probe); uvicorn sends no body for it.
@router.head("/health", include_in_schema=False)
@router.get("/health")
async def health() -> dict:
    """Alive: the process answers. Says nothing about the model (see /ready)."""
    return {"status": "ok"}


@router.head("/ready", include_in_schema=False)
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
    state, backend = service(request), batcher.backend
    settings = state.settings
    resolved = {"max_batch_tokens": batcher.max_batch_tokens, "max_requests_per_caller": places_per_caller(state)}
    limits = Limits(**{**settings.model_dump(include=set(Limits.model_fields)), **resolved})
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
    settings = service(request).settings
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
    # <= 5 numbers a member; SetpoShaper packs a step's requests by the same estimate (setpo_client.shaping)
    check_answer_size(rows * 5 * 24 + len(body.groups) * 160, settings, "groups", "")

    weight = settings.weight if body.weight is None else body.weight
    results, usage = await until_done_or_gone(
        request, score_request(body, batcher, weight, settings.shape, caller(request)), "groups"
    )
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
    settings = service(request).settings
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

    embedded = await until_done_or_gone(request, embed_texts(batcher, texts, caller(request)), "input")

    def serialised() -> str:  # in a worker thread, one at a time: thousands of vectors must not hold the event loop
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
                model=served_names(request, batcher)[0],
                usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens, truncated=sum(embedded.truncated)),
            ).model_dump_json(exclude_none=True)

    return Response(await run_in_threadpool(serialised), media_type="application/json")


# The names the model routes answer to, shared by the handlers above.
def served_names(request: Request, batcher: Batcher) -> list[str]:
    """SETPO_SERVED_MODEL_NAME (as vLLM's --served-model-name), else the model's own name; the first names answers."""
    return service(request).settings.served_model_name or [batcher.backend.name]


def check_model_name(name: str, request: Request, batcher: Batcher, status: int, kind: str) -> None:
    names = served_names(request, batcher)
    if name not in (*names, batcher.backend.model_path):
        message = f"this server serves model {' / '.join(map(repr, names))}, not {echoed(name)}"
        raise ApiError(status, message, kind, "model")


def served_model(name: str, batcher: Batcher) -> Model:
    return Model(id=name, created=batcher.backend.created, owned_by="setpo")

"""HTTP routes (the first stage of a request): validate, check limits, embed through the batcher, score."""

import asyncio
import base64
import secrets

import torch
from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from setpo_core.diversity import cosine_kernel, kernel_saturation, set_diversity, shaped_advantages, unit_rows
from setpo_server import __version__, metrics
from setpo_server.batcher import Batcher, Embedded, Overloaded
from setpo_server.errors import ApiError
from setpo_server.schemas import (
    DiversityRequest,
    DiversityResponse,
    DiversityUsage,
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    ErrorResponse,
    Group,
    GroupResult,
    Info,
    Limits,
)
from setpo_server.settings import Settings

LOADING_RETRY_AFTER = 5  # seconds; loading and warming a model takes about this long on CPU
DISCONNECT_POLL_SECONDS = 0.25  # how often a waiting request checks that its caller is still there

router = APIRouter()
ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 413, 422, 429, 503)}


def require_key(request: Request) -> None:
    key = request.app.state.settings.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), key.get_secret_value().encode()):
        raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer <SETPO_API_KEY>'", "authentication_error")


def ready_batcher(request: Request) -> Batcher:
    if request.app.state.batcher is None:
        raise ApiError(503, not_ready_message(request), "unavailable", retry_after=LOADING_RETRY_AFTER)
    return request.app.state.batcher


def not_ready_message(request: Request) -> str:
    if request.app.state.load_error:
        return f"model failed to load: {request.app.state.load_error}"
    return "model is loading and warming up; retry shortly"


async def embed_texts(request: Request, batcher: Batcher, texts: list[str], param: str) -> Embedded:
    """Both data routes embed through here: each distinct text once, results in the order of `texts`.
    The request-size check, overload mapping and the watch for callers who hang up live here too: a
    caller that disconnects has its work cancelled, not computed."""
    settings: Settings = request.app.state.settings
    unique = list(dict.fromkeys(texts))
    metrics.TEXTS_DEDUPLICATED.inc(len(texts) - len(unique))
    if len(unique) > settings.max_queue_texts:
        message = f"request has {len(unique)} distinct texts, more than SETPO_MAX_QUEUE_TEXTS={settings.max_queue_texts}; split it"
        raise ApiError(422, message, "invalid_request_error", param)
    work = asyncio.ensure_future(batcher.embed(unique))
    while not (await asyncio.wait({work}, timeout=DISCONNECT_POLL_SECONDS))[0]:
        if await request.is_disconnected():
            work.cancel()
            raise ApiError(499, "client closed the request; its work was dropped", "client_closed")
    try:
        embedded = work.result()
    except Overloaded as exc:
        message = f"server is busy ({exc.queued_texts} texts queued, SETPO_MAX_QUEUE_TEXTS={settings.max_queue_texts}); retry after {exc.retry_after} s"
        raise ApiError(429, message, "overloaded", retry_after=exc.retry_after) from None
    row_of = {text: i for i, text in enumerate(unique)}
    rows = [row_of[text] for text in texts]
    return Embedded(embedded.embeddings[rows], [embedded.tokens[i] for i in rows], [embedded.truncated[i] for i in rows])


def check_text_lengths(texts: list[str], settings: Settings, param: str) -> None:
    for j, text in enumerate(texts):
        if len(text) > settings.max_text_chars:
            message = f"text has {len(text)} characters, more than SETPO_MAX_TEXT_CHARS={settings.max_text_chars}"
            raise ApiError(422, message, "invalid_request_error", f"{param}[{j}]")


@router.get("/health")
def health() -> dict:
    """Alive: the process answers. Says nothing about the model (see /ready)."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"model": ErrorResponse}})
def ready(request: Request) -> dict:
    """200 once the model is loaded and warmed up, 503 with Retry-After before."""
    ready_batcher(request)
    return {"status": "ready"}


@router.get("/metrics", response_class=Response)
def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/info", dependencies=[Depends(require_key)], responses=ERRORS)
def info(request: Request, batcher: Batcher = Depends(ready_batcher)) -> Info:
    settings, backend = request.app.state.settings, batcher.backend
    limits = Limits(**{**settings.model_dump(include=set(Limits.model_fields)), "max_batch_tokens": batcher.max_batch_tokens})
    return Info(
        version=__version__,
        model=backend.name,
        model_path=backend.model_path,
        dimension=backend.dimension,
        max_tokens=backend.max_tokens,
        device=backend.device,
        dtype=str(backend.dtype).removeprefix("torch."),
        compiled=settings.compile,
        truncation_side=settings.truncation_side,
        shape=settings.shape,
        default_weight=settings.weight,
        limits=limits,
    )


@router.post(
    "/v1/diversity",
    dependencies=[Depends(require_key)],
    response_model=DiversityResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
)
async def diversity(body: DiversityRequest, request: Request, batcher: Batcher = Depends(ready_batcher)):
    """Leave-one-out marginals, local masses and set scores per group; shaped advantages where rewards are given."""
    settings: Settings = request.app.state.settings
    if len(body.groups) > settings.max_groups:
        message = f"request has {len(body.groups)} groups, more than SETPO_MAX_GROUPS={settings.max_groups}; split it"
        raise ApiError(422, message, "invalid_request_error", "groups")
    for b, group in enumerate(body.groups):
        if group.size > settings.max_group_size:
            message = f"group has {group.size} members, more than SETPO_MAX_GROUP_SIZE={settings.max_group_size}"
            raise ApiError(422, message, "invalid_request_error", f"groups[{b}]")
        if group.texts is not None:
            check_text_lengths(group.texts, settings, f"groups[{b}].texts")

    texts = [text for group in body.groups if group.texts is not None for text in group.texts]
    embedded = await embed_texts(request, batcher, texts, "groups") if texts else None
    weight = settings.weight if body.weight is None else body.weight
    results = await run_in_threadpool(score_groups, body.groups, embedded, weight, settings.shape)
    usage = DiversityUsage(
        texts=len(texts),
        unique_texts=len(set(texts)),
        tokens=sum(embedded.tokens) if embedded else 0,
        truncated=sum(embedded.truncated) if embedded else 0,
    )
    return DiversityResponse(model=batcher.backend.name, groups=results, usage=usage)


def score_groups(groups: list[Group], embedded: Embedded | None, weight: float, shape: str) -> list[GroupResult]:
    """Runs in a worker thread. `embedded` holds the text groups' rows, group after group, in request order.

    Groups are scored in buckets of one size and width, each a padding-free (B, G, d) batch through
    setpo_core: padding every group to the request's largest would let one big group among thousands of
    small ones ask for gigabytes.
    """
    members, next_row = [], 0
    for group in groups:
        if group.texts is not None:
            members.append(embedded.embeddings[next_row : next_row + group.size])
            next_row += group.size
        else:  # float64 so extreme norms survive until cosine_kernel scales each row
            members.append(torch.tensor(group.embeddings, dtype=torch.float64))
    buckets: dict[tuple, list[int]] = {}
    for b, rows in enumerate(members):
        buckets.setdefault((*rows.shape, rows.dtype), []).append(b)
    results: list[GroupResult | None] = [None] * len(groups)
    for indices in buckets.values():
        kernel = cosine_kernel(torch.stack([members[b] for b in indices]))  # (B, G, G)
        scored = set_diversity(kernel, shape=shape)
        saturation = kernel_saturation(kernel).tolist()
        # float64: rewards of any finite size keep a finite advantage (float32 overflows past 3e38)
        rewards = torch.tensor([groups[b].rewards or [0.0] * groups[b].size for b in indices], dtype=torch.float64)
        advantages = shaped_advantages(rewards, scored.marginals.double(), weight)  # (B, G)
        finite = advantages.isfinite().all(dim=-1).tolist()
        # one conversion per bucket, not per group: thousands of groups share a bucket
        marginals, masses, scores = scored.marginals.tolist(), scored.local_mass.tolist(), scored.set_score.tolist()
        advantages = advantages.tolist()
        for row, b in enumerate(indices):
            if groups[b].rewards is not None and not finite[row]:
                message = "shaped advantages overflow float64; rescale the rewards or lower the weight"
                raise ApiError(422, message, "invalid_request_error", f"groups[{b}].rewards")
            results[b] = GroupResult(
                marginals=marginals[row],
                local_mass=masses[row],
                set_score=scores[row],
                saturation=saturation[row],
                advantages=advantages[row] if groups[b].rewards is not None else None,
            )
    return results


@router.post("/v1/embeddings", dependencies=[Depends(require_key)], responses=ERRORS)
async def embeddings(body: EmbeddingsRequest, request: Request, batcher: Batcher = Depends(ready_batcher)) -> EmbeddingsResponse:
    """OpenAI-compatible embeddings: unit-length vectors, as floats or base64 little-endian float32."""
    settings: Settings = request.app.state.settings
    backend = batcher.backend
    if body.model is not None and body.model not in (backend.name, backend.model_path):
        raise ApiError(422, f"this server serves model {backend.name!r}, not {body.model!r}", "invalid_request_error", "model")
    if body.dimensions is not None and body.dimensions > backend.dimension:
        message = f"dimensions={body.dimensions} is more than the model's {backend.dimension}"
        raise ApiError(422, message, "invalid_request_error", "dimensions")
    texts = [body.input] if isinstance(body.input, str) else body.input
    check_text_lengths(texts, settings, "input")

    embedded = await embed_texts(request, batcher, texts, "input")
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
        model=backend.name,
        usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens, truncated=sum(embedded.truncated)),
    )

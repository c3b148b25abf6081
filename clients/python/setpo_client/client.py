"""Sync and async clients for the setpo service, with bounded retries.

Retried, with exponential backoff and jitter: connection failures (refused, reset, dropped mid-answer)
and the answers 429, 502, 503 and 504, whose Retry-After is honoured as a floor (up to max_backoff). Not retried: any other
4xx (the request itself is wrong; the exception carries the server's message) and read timeouts (the
server may still be working on it; sending it again would only add load).
"""

import asyncio
import json
import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import TypeVar

import httpx
from pydantic import BaseModel

from setpo_client.errors import SetpoAPIError, SetpoConnectionError, SetpoTimeoutError
from setpo_client.types import (
    DiversityRequest,
    DiversityResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    ErrorResponse,
    Group,
    Info,
    Kernel,
    ModelList,
    Normalize,
)

DEFAULT_URL = "http://127.0.0.1:8000"
T = TypeVar("T", bound=BaseModel)
JSON_HEADERS = {"content-type": "application/json"}
RETRY_STATUSES = frozenset({429, 502, 503, 504})
RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


def backoff_delay(attempt: int, backoff: float, max_backoff: float, retry_after: str | None = None) -> float:
    """Seconds to wait before retry number `attempt` (0-based): uniform in [d/2, d] with
    d = min(max_backoff, backoff * 2**attempt), so many callers don't retry in lockstep; never less
    than the server's Retry-After, but never more than max_backoff either: an estimate of hours must not
    stall a training step for hours."""
    ceiling = min(max_backoff, backoff * 2**attempt)
    delay = random.uniform(ceiling / 2, ceiling)
    try:
        return max(delay, min(float(retry_after), max_backoff)) if retry_after else delay
    except ValueError:  # an HTTP-date Retry-After: fall back to our own backoff
        return delay


def api_error(response: httpx.Response) -> SetpoAPIError:
    try:
        detail = ErrorResponse.model_validate_json(response.content).error
        return SetpoAPIError(response.status_code, detail.message, detail.type, detail.param)
    except ValueError:
        return SetpoAPIError(response.status_code, response.text[:500] or response.reason_phrase)


def parsed(model: type[T], response: httpx.Response) -> T:
    """The answer as `model`; an answer outside the contract is the server's fault, reported as such."""
    try:
        return model.model_validate_json(response.content)
    except ValueError as exc:
        raise SetpoAPIError(response.status_code, f"answer does not match the setpo contract: {exc}") from exc


def json_body(payload: object) -> bytes:
    """The exact bytes sent for a JSON body: SetpoShaper measures requests with this same function, so a step
    it fits under the service's max_body_bytes is never refused for its size (UTF-8, compact, no NaN)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def diversity_payload(
    groups: Sequence[Group | Mapping],
    weight: float | None,
    min_reward: float | None = None,
    kernel: Kernel | None = None,
    normalize: Normalize | None = None,
) -> dict:
    request = DiversityRequest(
        groups=[g if isinstance(g, Group) else Group.model_validate(g) for g in groups],
        weight=weight,
        min_reward=min_reward,
        kernel=kernel,
        normalize=normalize,
    )
    payload = request.model_dump(exclude_none=True)
    for group, sent in zip(request.groups, payload["groups"]):
        if group.keys is not None:
            sent["keys"] = group.keys  # a null key means "no solution identity": it must be sent, not dropped
    return payload


def embeddings_payload(input: str | Sequence[str], encoding_format: str, dimensions: int | None) -> dict:
    text = input if isinstance(input, str) else list(input)
    request = EmbeddingsRequest(input=text, encoding_format=encoding_format, dimensions=dimensions)
    return request.model_dump(exclude_none=True)


class _ClientConfig:
    """What both clients share: where the server is, how to authenticate, and how hard to retry."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
        backoff: float,
        max_backoff: float,
    ):
        self.base_url = base_url.rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("SETPO_API_KEY")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout, self.max_retries, self.backoff, self.max_backoff = timeout, max_retries, backoff, max_backoff

    def give_up(self, failure: httpx.Response | Exception | None, attempts: int) -> Exception:
        if isinstance(failure, httpx.Response):
            return api_error(failure)
        return SetpoConnectionError(
            f"cannot reach the setpo server at {self.base_url} after {attempts} attempts: {failure!r}"
        )


class SetpoClient(_ClientConfig):
    """Blocking client. `SetpoClient(url, api_key=..., timeout=...)`; use as a context manager or call close().

    api_key defaults to the SETPO_API_KEY environment variable.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport)

    def _request(self, method: str, path: str, payload: dict | None = None) -> httpx.Response:
        body = json_body(payload) if payload is not None else None
        retry_after: str | None = None
        failure: httpx.Response | Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(backoff_delay(attempt - 1, self.backoff, self.max_backoff, retry_after))
                retry_after = None
            try:
                response = self._http.request(
                    method, path, content=body, headers=JSON_HEADERS if body is not None else None
                )
            except RETRY_ERRORS as exc:
                failure = exc
                continue
            except httpx.TimeoutException as exc:
                raise SetpoTimeoutError(
                    f"{method} {path}: no answer within the client timeout ({self.timeout})"
                ) from exc
            if response.status_code not in RETRY_STATUSES:
                if response.is_error:
                    raise api_error(response)
                return response
            failure, retry_after = response, response.headers.get("retry-after")
        raise self.give_up(failure, attempt + 1)

    def diversity(
        self,
        groups: Sequence[Group | Mapping],
        weight: float | None = None,
        *,
        min_reward: float | None = None,
        kernel: Kernel | None = None,
        normalize: Normalize | None = None,
    ) -> DiversityResponse:
        """Marginals, local masses, set scores (and shaped advantages for groups with rewards). Contract v1.1:
        `min_reward` scores only members with reward >= it, `kernel` 'embedding' | 'hybrid' | 'key' (groups give
        `keys`), `normalize` 'none' | 'zscore'; the answer then also has each group's `scored` and `bonus`."""
        payload = diversity_payload(groups, weight, min_reward, kernel, normalize)
        return parsed(DiversityResponse, self._request("POST", "/v1/diversity", payload))

    def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        response = self._request("POST", "/v1/embeddings", embeddings_payload(input, encoding_format, dimensions))
        return parsed(EmbeddingsResponse, response)

    def info(self) -> Info:
        return parsed(Info, self._request("GET", "/info"))

    def models(self) -> ModelList:
        """The served model, as OpenAI's model list (one entry)."""
        return parsed(ModelList, self._request("GET", "/v1/models"))

    def ready(self) -> bool:
        """True when the model is loaded and warmed up. A server that cannot be reached is not ready."""
        try:
            return self._http.get("/ready").status_code == 200
        except httpx.TransportError:
            return False

    def wait_until_ready(self, timeout: float = 120.0, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise SetpoConnectionError(f"setpo server at {self.base_url} not ready after {timeout} s")
            time.sleep(poll)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "SetpoClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSetpoClient(_ClientConfig):
    """Asyncio client with the same methods as SetpoClient, awaited. Use `async with` or `await close()`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport
        )

    async def _request(self, method: str, path: str, payload: dict | None = None) -> httpx.Response:
        body = json_body(payload) if payload is not None else None
        retry_after: str | None = None
        failure: httpx.Response | Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(backoff_delay(attempt - 1, self.backoff, self.max_backoff, retry_after))
                retry_after = None
            try:
                response = await self._http.request(
                    method, path, content=body, headers=JSON_HEADERS if body is not None else None
                )
            except RETRY_ERRORS as exc:
                failure = exc
                continue
            except httpx.TimeoutException as exc:
                raise SetpoTimeoutError(
                    f"{method} {path}: no answer within the client timeout ({self.timeout})"
                ) from exc
            if response.status_code not in RETRY_STATUSES:
                if response.is_error:
                    raise api_error(response)
                return response
            failure, retry_after = response, response.headers.get("retry-after")
        raise self.give_up(failure, attempt + 1)

    async def diversity(
        self,
        groups: Sequence[Group | Mapping],
        weight: float | None = None,
        *,
        min_reward: float | None = None,
        kernel: Kernel | None = None,
        normalize: Normalize | None = None,
    ) -> DiversityResponse:
        payload = diversity_payload(groups, weight, min_reward, kernel, normalize)
        return parsed(DiversityResponse, await self._request("POST", "/v1/diversity", payload))

    async def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        response = await self._request("POST", "/v1/embeddings", embeddings_payload(input, encoding_format, dimensions))
        return parsed(EmbeddingsResponse, response)

    async def info(self) -> Info:
        return parsed(Info, await self._request("GET", "/info"))

    async def models(self) -> ModelList:
        return parsed(ModelList, await self._request("GET", "/v1/models"))

    async def ready(self) -> bool:
        try:
            return (await self._http.get("/ready")).status_code == 200
        except httpx.TransportError:
            return False

    async def wait_until_ready(self, timeout: float = 120.0, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not await self.ready():
            if time.monotonic() > deadline:
                raise SetpoConnectionError(f"setpo server at {self.base_url} not ready after {timeout} s")
            await asyncio.sleep(poll)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncSetpoClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

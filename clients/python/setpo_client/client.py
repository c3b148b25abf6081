"""Sync and async clients for the setpo service, with bounded retries.

Retried, with exponential backoff and jitter: connection failures (refused, reset, dropped mid-answer)
and the answers 429, 502, 503 and 504, whose Retry-After is honoured as a floor (up to max_backoff). Not retried: any other
non-2xx answer, redirects included (the request itself is wrong, or the URL is; the exception carries the server's
message) and timeouts (the server may still be working on it; sending it again would only add load).

An answer is trusted no further than its size and its time: one larger than `max_response_bytes` is refused without
being read (its Content-Length) or as soon as it grows past it, and every attempt must have its whole answer within
the read timeout, however slowly the bytes trickle in. A caller with a budget for the whole call, retries and their
waits included (SetpoShaper: one step), passes `deadline` (time.monotonic() seconds).
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
# 2048 embeddings of 4096 dimensions as JSON floats are ~180 MB: no answer of the contract is larger
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
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


def whole(response: httpx.Response, content: bytes) -> httpx.Response:
    """A streamed response with its (decoded) content read: what the parsers below take."""
    headers = [(k, v) for k, v in response.headers.items() if k.lower() not in ("content-encoding", "content-length")]
    return httpx.Response(response.status_code, headers=headers, content=content, request=response.request)


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
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        max_response_bytes: int,
    ):
        self.base_url = (base_url or os.environ.get("SETPO_URL") or DEFAULT_URL).rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("SETPO_API_KEY")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout, self.max_retries, self.backoff, self.max_backoff = timeout, max_retries, backoff, max_backoff
        self.max_response_bytes = max_response_bytes

    def attempt_limits(self, deadline: float | None) -> tuple[float | None, httpx.Timeout]:
        """When this attempt must have its whole answer (the read timeout from now, or the caller's deadline if
        sooner) and httpx's timeouts for it, none longer than what is left."""
        timeout = self.timeout if isinstance(self.timeout, httpx.Timeout) else httpx.Timeout(self.timeout)
        now = time.monotonic()
        ends = [end for end in (deadline, None if timeout.read is None else now + timeout.read) if end is not None]
        if not ends:
            return None, timeout
        end = min(ends)
        left = max(end - now, 0.001)
        fields = {name: min(getattr(timeout, name) or left, left) for name in ("connect", "read", "write", "pool")}
        return end, httpx.Timeout(**fields)

    def check_answer(self, response: httpx.Response, received: int, end: float | None) -> None:
        """Raises once an answer is over max_response_bytes (declared or received) or past its time."""
        declared = response.headers.get("content-length", "")
        if max(received, int(declared) if declared.isdigit() else 0) > self.max_response_bytes:
            raise SetpoAPIError(
                response.status_code,
                f"answer of {declared or 'more than ' + str(received)} bytes is over the client's "
                f"max_response_bytes={self.max_response_bytes}: not read",
            )
        if end is not None and time.monotonic() > end:
            raise SetpoTimeoutError(
                f"{response.request.method} {response.request.url.path}: the answer did not arrive in full within "
                f"the client's timeout ({self.timeout}) or the caller's deadline ({received} bytes received)"
            )

    def before_retry(self, delay: float, deadline: float | None) -> bool:
        """Whether a retry after `delay` seconds still fits the caller's deadline."""
        return deadline is None or time.monotonic() + delay < deadline

    def give_up(self, failure: httpx.Response | Exception | None, attempts: int) -> Exception:
        if isinstance(failure, httpx.Response):
            return api_error(failure)
        return SetpoConnectionError(
            f"cannot reach the setpo server at {self.base_url} after {attempts} attempts: {failure!r}"
        )


class SetpoClient(_ClientConfig):
    """Blocking client. `SetpoClient(url, api_key=..., timeout=...)`; use as a context manager or call close().

    url defaults to the SETPO_URL environment variable (else http://127.0.0.1:8000), api_key to SETPO_API_KEY, as in
    every plug-in and the docs.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        transport: httpx.BaseTransport | None = None,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff, max_response_bytes)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport)

    def _attempt(self, method: str, path: str, body: bytes | None, deadline: float | None) -> httpx.Response:
        end, timeout = self.attempt_limits(deadline)
        headers = JSON_HEADERS if body is not None else None
        with self._http.stream(method, path, content=body, headers=headers, timeout=timeout) as response:
            self.check_answer(response, 0, end)
            content = bytearray()
            for chunk in response.iter_bytes():
                content += chunk
                self.check_answer(response, len(content), end)
        return whole(response, bytes(content))

    def _request(
        self, method: str, path: str, payload: dict | None = None, deadline: float | None = None
    ) -> httpx.Response:
        body = json_body(payload) if payload is not None else None
        retry_after: str | None = None
        failure: httpx.Response | Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = backoff_delay(attempt - 1, self.backoff, self.max_backoff, retry_after)
                if not self.before_retry(delay, deadline):
                    attempt -= 1  # not made: the deadline comes first
                    break
                time.sleep(delay)
                retry_after = None
            try:
                response = self._attempt(method, path, body, deadline)
            except RETRY_ERRORS as exc:
                failure = exc
                continue
            except httpx.TimeoutException as exc:
                raise SetpoTimeoutError(
                    f"{method} {path}: no answer within the client timeout ({self.timeout})"
                ) from exc
            if response.status_code not in RETRY_STATUSES:
                if not response.is_success:  # a redirect too: this client never follows one
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
        deadline: float | None = None,
    ) -> DiversityResponse:
        """Marginals, local masses, set scores (and shaped advantages for groups with rewards). Contract v1.1:
        `min_reward` scores only members with reward >= it, `kernel` 'embedding' | 'hybrid' | 'key' (groups give
        `keys`), `normalize` 'none' | 'zscore'; the answer then also has each group's `scored` and `bonus`."""
        payload = diversity_payload(groups, weight, min_reward, kernel, normalize)
        return parsed(DiversityResponse, self._request("POST", "/v1/diversity", payload, deadline))

    def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        response = self._request("POST", "/v1/embeddings", embeddings_payload(input, encoding_format, dimensions))
        return parsed(EmbeddingsResponse, response)

    def info(self, deadline: float | None = None) -> Info:
        return parsed(Info, self._request("GET", "/info", deadline=deadline))

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
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff, max_response_bytes)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport
        )

    async def _attempt(self, method: str, path: str, body: bytes | None, deadline: float | None) -> httpx.Response:
        end, timeout = self.attempt_limits(deadline)
        headers = JSON_HEADERS if body is not None else None
        async with self._http.stream(method, path, content=body, headers=headers, timeout=timeout) as response:
            self.check_answer(response, 0, end)
            content = bytearray()
            async for chunk in response.aiter_bytes():
                content += chunk
                self.check_answer(response, len(content), end)
        return whole(response, bytes(content))

    async def _request(
        self, method: str, path: str, payload: dict | None = None, deadline: float | None = None
    ) -> httpx.Response:
        body = json_body(payload) if payload is not None else None
        retry_after: str | None = None
        failure: httpx.Response | Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = backoff_delay(attempt - 1, self.backoff, self.max_backoff, retry_after)
                if not self.before_retry(delay, deadline):
                    attempt -= 1  # not made: the deadline comes first
                    break
                await asyncio.sleep(delay)
                retry_after = None
            try:
                response = await self._attempt(method, path, body, deadline)
            except RETRY_ERRORS as exc:
                failure = exc
                continue
            except httpx.TimeoutException as exc:
                raise SetpoTimeoutError(
                    f"{method} {path}: no answer within the client timeout ({self.timeout})"
                ) from exc
            if response.status_code not in RETRY_STATUSES:
                if not response.is_success:  # a redirect too: this client never follows one
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
        deadline: float | None = None,
    ) -> DiversityResponse:
        payload = diversity_payload(groups, weight, min_reward, kernel, normalize)
        return parsed(DiversityResponse, await self._request("POST", "/v1/diversity", payload, deadline))

    async def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        response = await self._request("POST", "/v1/embeddings", embeddings_payload(input, encoding_format, dimensions))
        return parsed(EmbeddingsResponse, response)

    async def info(self, deadline: float | None = None) -> Info:
        return parsed(Info, await self._request("GET", "/info", deadline=deadline))

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

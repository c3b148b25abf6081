"""Sync and async clients for the setpo service: bounded retries and failover over several replicas (replicas.py), in
this one layer. A replica that cannot be reached or answers 429/502/503/504 is retried after a backoff; any other
failure of one replica moves the call to another at once; a 3xx or 4xx is raised at once. An answer is trusted no
further than its size (`max_response_bytes`) and its time (the read timeout, or the caller's `deadline`, a
time.monotonic() for the whole call). The rules in full: docs/service.md, "The Python client" and "Several replicas".
"""

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import httpx
from pydantic import BaseModel

from setpo_client.errors import SetpoAPIError, SetpoConnectionError, SetpoError, SetpoTimeoutError
from setpo_client.replicas import ReplicaPool, replica_urls, strictest
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
# an answer larger than any the contract gives (2048 embeddings of 4096 dimensions as JSON floats) is refused unread
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
JSON_HEADERS = {"content-type": "application/json"}
RETRY_STATUSES = frozenset({429, 502, 503, 504})
RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
# what an attempt may raise that outcome() judges: the rest propagates as it is
ATTEMPT_ERRORS = (httpx.TimeoutException, *RETRY_ERRORS, SetpoError)
PROBE_TIMEOUT_S = 2.0  # a left-out replica's /ready must answer within this: it never waits behind data work
log = logging.getLogger("setpo_client")


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


def parsed(model: type[M], response: httpx.Response) -> M:
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
    """The exact bytes sent for a JSON body (UTF-8, compact, no NaN): SetpoShaper encodes each group with this once,
    and measures it, so a step it fits under the service's max_body_bytes is never refused for its size."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def diversity_request(
    groups: Sequence[Group | Mapping],
    weight: float | None,
    min_reward: float | None = None,
    kernel: Kernel | None = None,
    normalize: Normalize | None = None,
) -> tuple[bytes, list[int], bool]:
    """A /v1/diversity request validated (its wire type) and encoded, once: (body, each group's members, whether it
    is a v1.1 request, whose answer must carry each group's bonus and scored count and the weight sent)."""
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
    sizes = [max(len(value) for value in group.values() if isinstance(value, list)) for group in payload["groups"]]
    v11 = any(value is not None for value in (min_reward, kernel, normalize)) or any(g.keys for g in request.groups)
    return json_body(payload), sizes, v11


def answer_problem(result: DiversityResponse, sizes: list[int], v11: bool, weight: float | None) -> str | None:
    """Why an answer cannot be applied to the groups sent (of these sizes), or None: every group answered, each member
    of it in every per-member list (and in `bonus`, which a v1.1 request must get, with each group's `scored`, 0 to
    its size, and the weight sent), and every number finite, squares too (a NaN bonus would reach a trainer's loss,
    a NaN marginal or set score its metrics; a finite 1e308 overflows the step's means)."""
    answers = [(len(group.marginals), None if group.bonus is None else len(group.bonus)) for group in result.groups]
    if [m for m, _ in answers] != sizes or (v11 and [b for _, b in answers] != sizes):
        return f"sent {len(sizes)} groups of sizes {sizes}, got (marginals, bonus) lengths {answers}"
    for size, group in zip(sizes, result.groups):
        if len(group.local_mass) != size or (group.advantages is not None and len(group.advantages) != size):
            return f"a group of {size} members got local_mass or advantages of another length"
        if v11 and not (group.scored is not None and 0 <= group.scored <= size):
            return f"a group of {size} members answered as {group.scored} scored"
    numbers = {"weight": [result.weight or 0.0]}
    for name in ("bonus", "marginals", "local_mass", "advantages", "set_score", "saturation"):
        values = [getattr(group, name) for group in result.groups]
        numbers[name] = [x for v in values if v is not None for x in (v if isinstance(v, list) else [v])]
    for name, values in numbers.items():
        if not all(math.isfinite(x) for x in values):
            return f"not a finite number in the answer's {name} ({next(x for x in values if not math.isfinite(x))})"
        if not math.isfinite(sum(x * x for x in values)):
            return f"numbers too large to sum in the answer's {name} (up to {max(map(abs, values))})"
    if v11 and weight is not None and result.weight != weight:
        return f"sent weight {weight}, the answer says {result.weight}"
    return None


def diversity_answer(sizes: list[int], v11: bool, weight: float | None, response: httpx.Response) -> DiversityResponse:
    """The diversity answer, parsed and checked against what was sent (SetpoAPIError: off the contract)."""
    result = parsed(DiversityResponse, response)
    problem = answer_problem(result, sizes, v11, weight)
    if problem is not None:  # never zip an answer that does not fit what was sent onto it, nor train on NaN
        raise SetpoAPIError(response.status_code, f"answer off the contract: {problem}")
    return result


def embeddings_body(input: str | Sequence[str], encoding_format: str, dimensions: int | None) -> bytes:
    text = input if isinstance(input, str) else list(input)
    request = EmbeddingsRequest(input=text, encoding_format=encoding_format, dimensions=dimensions)
    return json_body(request.model_dump(exclude_none=True))


@dataclass
class Call:
    """One call's attempts over the replicas: `rounds` retry rounds allowed, the replicas tried in this round, and
    those at fault (asked no more in this call)."""

    rounds: int
    tried: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    retries: int = 0
    attempts: int = 0
    retry_after: str | None = None
    failure: httpx.Response | Exception | None = None  # the last transient failure
    fault: SetpoError | None = None  # the last replica's own failure


def undecodable(response: httpx.Response, exc: httpx.DecodingError) -> SetpoAPIError:
    """A body its Content-Encoding does not describe (a broken replica or proxy): off the contract, that replica's."""
    return SetpoAPIError(response.status_code, f"answer off the contract: its body cannot be decoded ({exc})")


def at_fault(error: SetpoError, replica: str) -> SetpoError:
    error.replica = replica
    return error


class _BaseClient:
    """What both clients share: their replicas (a ReplicaPool), how to authenticate, and how a call's attempts go
    (which replica next, after what wait, and what an attempt's outcome means)."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
        backoff: float,
        max_backoff: float,
    ):
        self.replicas = ReplicaPool(replica_urls(base_url or os.environ.get("SETPO_URL") or DEFAULT_URL))
        self.base_url = ",".join(self.replicas.spelled)
        api_key = api_key if api_key is not None else os.environ.get("SETPO_API_KEY")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout, self.max_retries, self.backoff, self.max_backoff = timeout, max_retries, backoff, max_backoff
        self.max_response_bytes = MAX_RESPONSE_BYTES
        self.retries = 0  # attempts that followed a failed one, over the client's life (SetpoShaper counts a step's)

    @property
    def urls(self) -> list[str]:
        """The replicas now (a dns:/// name's current addresses)."""
        return self.replicas.urls

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

    def next_attempt(self, call: Call, deadline: float | None, only: str | None) -> tuple[str, float]:
        """The replica of the call's next attempt and the seconds to wait before it (0 for a replica not yet tried
        in this round); raises the call's failure when none is left: every one at fault, `rounds` rounds done, or
        past the deadline."""
        if call.attempts and deadline is not None and time.monotonic() >= deadline:
            raise self.give_up(call)
        last, url = call.tried[-1] if call.tried else None, self.replicas.pick(call.tried, call.failed, only)
        if url is None:
            raise self.give_up(call)
        delay = 0.0
        if url in call.tried:  # every replica this call may use failed in this round: the next waits its backoff
            delay = backoff_delay(call.retries, self.backoff, self.max_backoff, call.retry_after)
            if call.retries == call.rounds or (deadline is not None and time.monotonic() + delay >= deadline):
                raise self.give_up(call)
            call.retries, call.retry_after, call.tried = call.retries + 1, None, []
        if call.attempts:
            with self.replicas.lock:
                self.retries += 1
            if last in call.failed:  # the last replica answered wrongly: said as the call moves on
                log.warning("setpo replica %s failed (%s); asking %s", last, call.fault, url)
        call.tried.append(url)
        call.attempts += 1
        return url, delay

    def outcome(
        self, call: Call, url: str, answer: httpx.Response | Exception, what: str, read: Callable[[httpx.Response], T]
    ) -> T | None:
        """An attempt's answer read (`read`: the parser, which raises SetpoAPIError for an answer off the contract),
        or None to try again: after a backoff for what is transient, at another replica for what is one replica's
        fault (remembered as the call's fault). Raises a 3xx or 4xx at once, naming the replica."""
        if isinstance(answer, RETRY_ERRORS):
            self.replicas.leave_out(url)
            call.failure = answer
            return None
        if isinstance(answer, httpx.TimeoutException):  # and left out, so a frozen replica gets no more chunks
            self.replicas.leave_out(url)
            fault: SetpoError = SetpoTimeoutError(
                f"{what} at {url}: no answer within the client timeout ({self.timeout})"
            )
        elif isinstance(answer, SetpoError):  # the answer was too large, too late, or undecodable
            fault = answer
        elif isinstance(answer, Exception):  # nothing else is caught (ATTEMPT_ERRORS)
            raise answer
        elif answer.status_code in RETRY_STATUSES:
            if answer.status_code == 503:  # not ready, or shedding load: ask the others meanwhile
                self.replicas.leave_out(url)
            call.failure, call.retry_after = answer, answer.headers.get("retry-after")
            return None
        elif answer.status_code < 300:
            try:
                return read(answer)
            except SetpoError as exc:  # off the contract
                fault = exc
        elif answer.status_code < 500:  # this client never follows a redirect
            raise at_fault(api_error(answer), url)
        else:
            fault = api_error(answer)
        call.fault, call.failed = at_fault(fault, url), [*call.failed, url]
        return None

    def give_up(self, call: Call) -> SetpoError:
        if call.fault is not None:
            return call.fault
        if isinstance(call.failure, httpx.Response):
            return at_fault(api_error(call.failure), call.tried[-1])
        error = SetpoConnectionError(
            f"cannot reach the setpo server at {self.base_url} after {call.attempts} attempts: {call.failure!r}"
        )
        return at_fault(error, call.tried[-1]) if call.tried else error


class SetpoClient(_BaseClient):
    """Blocking client, thread-safe; use as a context manager or call close(). url defaults to $SETPO_URL (else
    http://127.0.0.1:8000), api_key to $SETPO_API_KEY; several replicas are several URLs, comma-separated, or
    `dns:///name:port` (replicas.py). `transport`: httpx's, for every replica."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff)
        self._http = {
            url: httpx.Client(base_url=url, headers=self.headers, timeout=timeout, transport=transport)
            for url in self.replicas.spelled
        }

    def _attempt(self, url: str, method: str, path: str, body: bytes | None, deadline: float | None) -> httpx.Response:
        end, timeout = self.attempt_limits(deadline)
        spelled, host = self.replicas.route[url]
        headers = {**host, **JSON_HEADERS} if body is not None else host
        with (
            self.replicas.busy(url),
            self._http[spelled].stream(method, url + path, content=body, headers=headers, timeout=timeout) as response,
        ):
            self.check_answer(response, 0, end)
            content = bytearray()
            try:
                for chunk in response.iter_bytes():
                    content += chunk
                    self.check_answer(response, len(content), end)
            except httpx.DecodingError as exc:
                raise undecodable(response, exc) from None
        return whole(response, bytes(content))

    def _request(
        self,
        method: str,
        path: str,
        read: Callable[[httpx.Response], T],
        body: bytes | None = None,
        deadline: float | None = None,
        only: str | None = None,
        rounds: int | None = None,
    ) -> T:
        """The answer, read, of the first attempt that has one; `rounds`: retry rounds allowed (default max_retries);
        `only`: the one replica to ask."""
        call = Call(self.max_retries if rounds is None else rounds)
        while True:
            if self.replicas.resolve_due():
                self.replicas.resolve()
            for due in self.replicas.due():  # asked on a thread of its own: a replica left out costs no call a wait
                with contextlib.suppress(RuntimeError):  # no thread to be had (shutting down): due again RECHECK_S on
                    threading.Thread(
                        target=self.probe, args=(due, PROBE_TIMEOUT_S), name="setpo-recheck", daemon=True
                    ).start()
            url, delay = self.next_attempt(call, deadline, only)
            time.sleep(delay)
            try:
                answer: httpx.Response | Exception = self._attempt(url, method, path, body, deadline)
            except ATTEMPT_ERRORS as exc:
                answer = exc
            result = self.outcome(call, url, answer, f"{method} {path}", read)
            if result is not None:
                return result

    def probe(self, url: str, timeout: float | httpx.Timeout) -> bool:
        """Whether a replica's /ready answers 200, recorded. Never raises: a recheck runs on a thread of its own."""
        try:
            spelled, host = self.replicas.route[url]
            status: int | None = self._http[spelled].get(url + "/ready", headers=host, timeout=timeout).status_code
        except Exception:  # unreachable, too slow, an answer that cannot be read, or the client closed: not ready
            status = None
        return self.replicas.readiness(url, status)

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
        """Marginals, local masses, set scores (and shaped advantages for groups with rewards); with contract v1.1's
        `min_reward`, `kernel` or `normalize` (docs/service.md) also each group's `scored` and `bonus`. An answer that
        does not fit the groups sent is a SetpoAPIError, and that replica's fault."""
        body, sizes, v11 = diversity_request(groups, weight, min_reward, kernel, normalize)
        read = partial(diversity_answer, sizes, v11, weight)
        return self._request("POST", "/v1/diversity", read, body, deadline)

    def diversity_json(
        self, body: bytes, sizes: list[int], weight: float, deadline: float | None = None
    ) -> DiversityResponse:
        """A v1.1 /v1/diversity request its caller validated and encoded itself (SetpoShaper: each group once):
        answered as diversity() answers, checked against `sizes` (each group's members) and `weight` (the lambda
        in the body)."""
        return self._request("POST", "/v1/diversity", partial(diversity_answer, sizes, True, weight), body, deadline)

    def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        body = embeddings_body(input, encoding_format, dimensions)
        return self._request("POST", "/v1/embeddings", partial(parsed, EmbeddingsResponse), body)

    def info(self, deadline: float | None = None) -> Info:
        """The service's model and limits; of several replicas, the strictest of those that answer (each asked
        once: one that does not answer is left out, not waited for)."""
        read = partial(parsed, Info)
        if len(self.urls) == 1:
            return self._request("GET", "/info", read, deadline=deadline)
        infos, failure = [], None
        for url in [url for url in self.urls if url not in self.replicas.left_out] or self.urls:
            try:
                infos.append(self._request("GET", "/info", read, deadline=deadline, only=url, rounds=0))
            except SetpoError as exc:
                failure = exc
        if not infos:
            assert failure is not None
            raise failure
        return strictest(infos)

    def models(self) -> ModelList:
        """The served model, as OpenAI's model list (one entry)."""
        return self._request("GET", "/v1/models", partial(parsed, ModelList))

    def ready(self) -> bool:
        """True when the model is loaded and warmed up (of several replicas: any). One that cannot be reached is
        not ready, and is left out until it is."""
        if self.replicas.resolve_due():
            self.replicas.resolve()
        answers = [self.probe(url, self.timeout) for url in self.urls]  # every replica asked, each recorded
        return any(answers)

    def wait_until_ready(self, timeout: float = 120.0, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise SetpoConnectionError(f"setpo server at {self.base_url} not ready after {timeout} s")
            time.sleep(poll)

    def close(self) -> None:
        for http in self._http.values():
            http.close()

    def __enter__(self) -> "SetpoClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSetpoClient(_BaseClient):
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
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff)
        self._http = {
            url: httpx.AsyncClient(base_url=url, headers=self.headers, timeout=timeout, transport=transport)
            for url in self.replicas.spelled
        }
        self._rechecks: set[asyncio.Task] = set()  # /ready of replicas left out, asked in the background

    async def _attempt(
        self, url: str, method: str, path: str, body: bytes | None, deadline: float | None
    ) -> httpx.Response:
        end, timeout = self.attempt_limits(deadline)
        spelled, host = self.replicas.route[url]
        headers = {**host, **JSON_HEADERS} if body is not None else host
        with self.replicas.busy(url):
            http = self._http[spelled]
            async with http.stream(method, url + path, content=body, headers=headers, timeout=timeout) as response:
                self.check_answer(response, 0, end)
                content = bytearray()
                try:
                    async for chunk in response.aiter_bytes():
                        content += chunk
                        self.check_answer(response, len(content), end)
                except httpx.DecodingError as exc:
                    raise undecodable(response, exc) from None
        return whole(response, bytes(content))

    async def _request(
        self,
        method: str,
        path: str,
        read: Callable[[httpx.Response], T],
        body: bytes | None = None,
        deadline: float | None = None,
        only: str | None = None,
        rounds: int | None = None,
    ) -> T:
        """SetpoClient._request, awaited."""
        call = Call(self.max_retries if rounds is None else rounds)
        while True:
            if self.replicas.resolve_due():
                await asyncio.to_thread(self.replicas.resolve)  # getaddrinfo blocks: never on the event loop
            for due in self.replicas.due():  # asked in a task of its own: a replica left out costs no call a wait
                task = asyncio.create_task(self.probe(due, PROBE_TIMEOUT_S))
                self._rechecks.add(task)  # held until done (the loop keeps only weak references); cancelled by close()
                task.add_done_callback(self._rechecks.discard)
            url, delay = self.next_attempt(call, deadline, only)
            await asyncio.sleep(delay)
            try:
                answer: httpx.Response | Exception = await self._attempt(url, method, path, body, deadline)
            except ATTEMPT_ERRORS as exc:
                answer = exc
            result = self.outcome(call, url, answer, f"{method} {path}", read)
            if result is not None:
                return result

    async def probe(self, url: str, timeout: float | httpx.Timeout) -> bool:
        try:
            spelled, host = self.replicas.route[url]
            status: int | None = (
                await self._http[spelled].get(url + "/ready", headers=host, timeout=timeout)
            ).status_code
        except Exception:  # as SetpoClient.probe: a recheck's task must not fail
            status = None
        return self.replicas.readiness(url, status)

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
        body, sizes, v11 = diversity_request(groups, weight, min_reward, kernel, normalize)
        read = partial(diversity_answer, sizes, v11, weight)
        return await self._request("POST", "/v1/diversity", read, body, deadline)

    async def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        body = embeddings_body(input, encoding_format, dimensions)
        return await self._request("POST", "/v1/embeddings", partial(parsed, EmbeddingsResponse), body)

    async def info(self, deadline: float | None = None) -> Info:
        read = partial(parsed, Info)
        if len(self.urls) == 1:
            return await self._request("GET", "/info", read, deadline=deadline)
        infos, failure = [], None
        for url in [url for url in self.urls if url not in self.replicas.left_out] or self.urls:
            try:
                infos.append(await self._request("GET", "/info", read, deadline=deadline, only=url, rounds=0))
            except SetpoError as exc:
                failure = exc
        if not infos:
            assert failure is not None
            raise failure
        return strictest(infos)

    async def models(self) -> ModelList:
        return await self._request("GET", "/v1/models", partial(parsed, ModelList))

    async def ready(self) -> bool:
        if self.replicas.resolve_due():
            await asyncio.to_thread(self.replicas.resolve)
        answers = [await self.probe(url, self.timeout) for url in self.urls]
        return any(answers)

    async def wait_until_ready(self, timeout: float = 120.0, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not await self.ready():
            if time.monotonic() > deadline:
                raise SetpoConnectionError(f"setpo server at {self.base_url} not ready after {timeout} s")
            await asyncio.sleep(poll)

    async def close(self) -> None:
        for task in self._rechecks:  # a task of a loop closed meanwhile is gone with it: never touched
            if not task.done() and task.get_loop() is asyncio.get_running_loop():
                task.cancel()
        self._rechecks.clear()
        for http in self._http.values():
            await http.aclose()

    async def __aenter__(self) -> "AsyncSetpoClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

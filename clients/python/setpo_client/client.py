"""Sync and async clients for the setpo service, with bounded retries.

Retried, with exponential backoff and jitter: connection failures (refused, reset, dropped mid-answer)
and the answers 429, 502, 503 and 504, whose Retry-After is honoured as a floor (up to max_backoff). Not retried: any other
non-2xx answer, redirects included (the request itself is wrong, or the URL is; the exception carries the server's
message) and timeouts (the server may still be working on it; sending it again would only add load).

An answer is trusted no further than its size and its time: one larger than `max_response_bytes` is refused without
being read (its Content-Length) or as soon as it grows past it, and every attempt must have its whole answer within
the read timeout, however slowly the bytes trickle in. A caller with a budget for the whole call, retries and their
waits included (SetpoShaper: one step), passes `deadline` (time.monotonic() seconds).

Several replicas: `SetpoClient("http://a:8000,http://b:8000")` (or SETPO_URL so spelled, as OpenRLHF spells
--reward.remote_url). Each request goes to the replica with the fewest requests in flight; a replica that cannot be
reached, answers 503 or gives no answer in time is left out until it answers /ready again (asked at most every
RECHECK_S seconds, in the background: no call waits for it); an answer that cannot be decoded is off the contract,
like one that does not fit what was sent (SetpoShaper asks another replica for that chunk); a failed
attempt moves to a replica not yet tried in this call at once, and only a round in which every replica failed waits
its backoff (max_retries counts such rounds). /info is the strictest of the replicas that answer.

One name for several replicas: `dns:///setpo-server:8000` (gRPC's spelling) is resolved to all its addresses (a
headless Service, compose's service name: one A record per pod) and each address is a replica, asked with the name as
its Host; the name is resolved again at most every RESOLVE_S seconds, so pods an autoscaler adds are used and removed
ones dropped. A plain http:// URL is connected to as it is: behind a per-connection balancer (a ClusterIP Service)
a step's few long-lived connections may all land on one pod (docs/deployment.md measures it).
"""

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from pydantic import BaseModel

from setpo_client.errors import SetpoAPIError, SetpoConnectionError, SetpoError, SetpoTimeoutError
from setpo_client.types import (
    DiversityRequest,
    DiversityResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    ErrorResponse,
    Group,
    Info,
    Kernel,
    Limits,
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
log = logging.getLogger("setpo_client")
# what an attempt may raise that outcome() judges: the rest propagates as it is
ATTEMPT_ERRORS = (httpx.TimeoutException, *RETRY_ERRORS, SetpoError)
RECHECK_S = 1.0  # a replica left out is asked /ready again at most this often
PROBE_TIMEOUT_S = 2.0  # ... and must answer within this: /ready never waits behind data work
RESOLVE_S = 5.0  # a dns:/// name is resolved again at most this often (the TTL of a headless Service's records)
RESOLVED = "dns:///"
Resolver = Callable[[str, int], list[str]]  # (host, port) -> its addresses


def addresses(host: str, port: int) -> list[str]:
    """Every address the system resolver (getaddrinfo: /etc/hosts, then DNS) gives the name, each once, in its order."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in found))


def resolved_name(spelled: str) -> httpx.URL | None:
    """The http URL a `dns:///name:port[/path]` replica stands for, or None for a plain URL. Plain http only: TLS to
    an address would need the certificate checked against the name, which this client does not do."""
    if not spelled.startswith("dns"):
        return None
    if not spelled.startswith(RESOLVED) or "://" in spelled[len(RESOLVED) :]:
        raise ValueError(
            f"setpo service URL {spelled!r}: spell a name to resolve as dns:///host:port[/path] (plain http; no DNS "
            "server in the authority, no TLS: for https give the replicas' URLs, comma-separated)"
        )
    return httpx.URL("http://" + spelled[len(RESOLVED) :])


def replica_urls(spelled: str) -> list[str]:
    """The base URLs in `spelled`: one, or several separated by commas."""
    urls = [url.strip().rstrip("/") for url in spelled.split(",") if url.strip()]
    if not urls or len(set(urls)) < len(urls):
        raise ValueError(
            f"setpo service URL(s) {spelled!r}: give one base URL or several distinct ones, comma-separated"
        )
    for url in urls:  # refused here, at construction: a wrong dns: spelling, a URL that is not one (a port "80o0")
        try:
            resolved_name(url) or httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"setpo service URL {url!r}: {exc}") from None
    return urls


def strictest(infos: list[Info]) -> Info:
    """One Info for several replicas: each limit the smallest any of them states, the lowest contract; refused when
    they serve different models (a step's chunks would be scored in different spaces)."""
    served = {(info.model, info.dimension, info.shape, info.truncation_side) for info in infos}
    if len(served) > 1:  # the shape and the truncation side change the scores as the model does
        raise SetpoError(
            "the replicas serve different models or scoring settings (model, dimension, shape, truncation side): "
            f"{sorted(served)}; point the client at one deployment"
        )
    limits = {}
    for name in Limits.model_fields:
        values = [getattr(info.limits, name) for info in infos if getattr(info.limits, name) is not None]
        limits[name] = min(values) if values else None
    contracts = [tuple(int(part) for part in (info.contract or "1.0").split(".")[:2]) for info in infos]
    lowest = infos[contracts.index(min(contracts))]
    chars = [info.truncate_chars for info in infos if info.truncate_chars is not None]
    return lowest.model_copy(
        update={
            "limits": Limits.model_validate(limits),
            "max_tokens": min(info.max_tokens for info in infos),
            "truncate_chars": min(chars) if chars else None,
        }
    )


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


def answer_problem(result: DiversityResponse, payload: dict) -> str | None:
    """Why an answer cannot be applied to the groups sent, or None: every group answered, each member of it in
    every per-member list (and in `bonus`, which a v1.1 request must get, with each group's `scored`, 0 to its size,
    and the weight sent), and every number finite, squares too (a NaN bonus would reach a trainer's loss, a NaN
    marginal or set score its metrics; a finite 1e308 overflows the step's means)."""
    sizes = [max(len(field) for field in group.values()) for group in payload["groups"]]
    v11 = any(name in payload for name in ("min_reward", "kernel", "normalize")) or any(
        "keys" in group for group in payload["groups"]
    )
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
    if v11 and "weight" in payload and result.weight != payload["weight"]:
        return f"sent weight {payload['weight']}, the answer says {result.weight}"
    return None


def embeddings_payload(input: str | Sequence[str], encoding_format: str, dimensions: int | None) -> dict:
    text = input if isinstance(input, str) else list(input)
    request = EmbeddingsRequest(input=text, encoding_format=encoding_format, dimensions=dimensions)
    return request.model_dump(exclude_none=True)


class _ClientConfig:
    """What both clients share: where the replicas are (a dns:/// name's addresses included) and which are left out,
    how to authenticate, how hard to retry, and which replica an attempt goes to."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        max_response_bytes: int,
        resolver: Resolver,
    ):
        self.spelled = replica_urls(base_url or os.environ.get("SETPO_URL") or DEFAULT_URL)
        self.base_url = ",".join(self.spelled)
        self.resolver = resolver
        # replica URL -> (the spelled URL whose connections it uses, the Host it is asked as: a resolved name's)
        self.route: dict[str, tuple[str, dict[str, str]]] = {url: (url, {}) for url in self.spelled}
        self.urls = list(self.spelled)
        self.names = [url for url in self.spelled if resolved_name(url) is not None]
        self.resolve_at = 0.0  # when the names are next resolved
        api_key = api_key if api_key is not None else os.environ.get("SETPO_API_KEY")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout, self.max_retries, self.backoff, self.max_backoff = timeout, max_retries, backoff, max_backoff
        self.max_response_bytes = max_response_bytes
        self.lock = threading.Lock()  # a shaper's threads share one client
        self.in_flight = dict.fromkeys(self.urls, 0)
        self.sent = dict.fromkeys(self.urls, 0)
        self.left_out: dict[str, float] = {}  # replica -> when its /ready is next asked
        # replicas taken back or newly resolved so far: each may serve another model or tighter limits than the /info
        # a caller learned, which SetpoShaper asks again when this has changed
        self.replica_changes = 0
        if self.resolve_due():
            self.resolve()

    def resolve_due(self) -> bool:
        """True for the one caller that resolves the dns:/// names now (never, without one)."""
        now = time.monotonic()
        with self.lock:
            if not self.names or self.resolve_at > now:
                return False
            self.resolve_at = now + RESOLVE_S
        return True

    def resolve(self) -> None:
        """The replicas anew: plain URLs as given, each dns:/// name's current addresses (a name that does not
        resolve keeps the addresses it had, or stands for itself until it has some: a connection to it then fails
        and is retried like any other). Blocking: the async client runs it in a thread."""
        urls: list[str] = []
        route: dict[str, tuple[str, dict[str, str]]] = {}
        for spelled in self.spelled:
            name = resolved_name(spelled)
            if name is None:
                urls.append(spelled)
                route[spelled] = (spelled, {})
                continue
            try:
                found = [str(name.copy_with(host=address)) for address in self.resolver(name.host, name.port or 80)]
                if not found:  # a resolver's "no address" (getaddrinfo raises instead): never a client of no replica
                    raise OSError("no address")
            except OSError as exc:
                found = [url for url in self.urls if self.route[url][0] == spelled] or [str(name)]
                log.warning("setpo replica name %s does not resolve (%s): keeping %s", spelled, exc, found)
            for url in (url.rstrip("/") for url in found):
                if url not in route:  # two names with one address: one replica
                    urls.append(url)
                    route[url] = (spelled, {"host": name.netloc.decode()})
        with self.lock:
            if urls != self.urls:
                log.info("setpo replicas now %s (were %s)", urls, self.urls)
            if set(urls) - set(self.urls):
                self.replica_changes += 1
            self.route.update(route)
            for url in urls:
                self.in_flight.setdefault(url, 0)
                self.sent.setdefault(url, 0)
            for url in set(self.left_out) - set(urls):  # gone from the name: never asked /ready again
                del self.left_out[url]
            self.urls = urls

    def pick(self, tried: Collection[str], avoid: Collection[str] = (), only: str | None = None) -> str:
        """The replica for the next attempt: one not tried in this call, not left out, with the fewest requests in
        flight, then the fewest sent. `avoid`: replicas the caller saw fail (unless nothing else is left)."""
        pool = [only] if only else [url for url in self.urls if url not in avoid] or self.urls
        with self.lock:
            url = min(pool, key=lambda u: (u in tried, u in self.left_out, self.in_flight[u], self.sent[u]))
            self.sent[url] += 1
        return url

    @contextmanager
    def busy(self, url: str) -> Iterator[None]:
        with self.lock:
            self.in_flight[url] += 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight[url] -= 1

    def leave_out(self, url: str) -> None:
        if len(self.urls) > 1:  # one replica is asked again by the retries themselves
            with self.lock:
                if url not in self.urls:  # gone from its name meanwhile (a recheck that ended after resolve())
                    return
                newly = url not in self.left_out
                self.left_out.setdefault(url, time.monotonic() + RECHECK_S)
            if newly:
                log.warning(
                    "setpo replica %s left out (unreachable, not ready or no answer in time) until its /ready answers 200",
                    url,
                )

    def due(self) -> list[str]:
        """Replicas left out whose /ready is due now; each is handed to one caller until its next RECHECK_S."""
        now = time.monotonic()
        with self.lock:
            due = [url for url, at in self.left_out.items() if at <= now]
            for url in due:
                self.left_out[url] = now + RECHECK_S
        return due

    def readiness(self, url: str, status: int | None) -> bool:
        """Records what /ready said (None: no answer): a replica is taken back when it answers 200."""
        if status == 200:
            with self.lock:
                was_out = self.left_out.pop(url, None) is not None
                self.replica_changes += was_out
            if was_out:
                log.warning("setpo replica %s answers /ready again: taken back", url)
            return True
        self.leave_out(url)
        return False

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

    def next_attempt(
        self, call: "Call", deadline: float | None, avoid: Collection[str], only: str | None
    ) -> tuple[str, float] | None:
        """The replica of the call's next attempt and the seconds to wait before it (0 for a replica not yet tried
        in this round), or None when none is left: `rounds` rounds done, or the wait would pass the deadline."""
        url = self.pick(call.tried, avoid, only)
        delay = 0.0
        if url in call.tried:  # every replica this call may use failed in this round: the next waits its backoff
            delay = backoff_delay(call.retries, self.backoff, self.max_backoff, call.retry_after)
            if call.retries == call.rounds or (deadline is not None and time.monotonic() + delay >= deadline):
                return None
            call.retries, call.retry_after, call.tried = call.retries + 1, None, []
        call.tried.append(url)
        call.attempts += 1
        return url, delay

    def outcome(self, call: "Call", url: str, answer: httpx.Response | Exception, what: str) -> httpx.Response | None:
        """An attempt's answer (or exception) to return, or None to try again (remembered as the call's failure);
        raises, naming the replica, what is not retried: a timeout, an answer too large or too late, a non-2xx
        other than 429/502/503/504 (a redirect too: this client never follows one)."""
        if isinstance(answer, RETRY_ERRORS):
            self.leave_out(url)
            call.failure = answer
            return None
        if isinstance(answer, httpx.TimeoutException):  # not asked again in this call: the work may be running
            self.leave_out(url)  # and left out, so a frozen replica gets no more chunks; a slow one answers /ready
            timeout = SetpoTimeoutError(f"{what} at {url}: no answer within the client timeout ({self.timeout})")
            raise at_fault(timeout, url) from answer
        if isinstance(answer, SetpoError):  # the answer was too large or too late
            raise at_fault(answer, url) from None
        if isinstance(answer, Exception):  # nothing else is caught (ATTEMPT_ERRORS)
            raise answer
        if answer.status_code not in RETRY_STATUSES:
            if not answer.is_success:
                raise at_fault(api_error(answer), url)
            return answer
        if answer.status_code == 503:  # not ready, or shedding load: ask the others meanwhile
            self.leave_out(url)
        call.failure, call.retry_after = answer, answer.headers.get("retry-after")
        return None

    def give_up(self, call: "Call") -> SetpoError:
        if isinstance(call.failure, httpx.Response):
            return api_error(call.failure)
        return SetpoConnectionError(
            f"cannot reach the setpo server at {self.base_url} after {call.attempts} attempts: {call.failure!r}"
        )


@dataclass
class Call:
    """One call's attempts over the replicas: `rounds` retry rounds allowed, the replicas tried in this round."""

    rounds: int
    tried: list[str] = field(default_factory=list)
    retries: int = 0
    attempts: int = 0
    retry_after: str | None = None
    failure: httpx.Response | Exception | None = None


def undecodable(response: httpx.Response, exc: httpx.DecodingError) -> SetpoAPIError:
    """A body its Content-Encoding does not describe (a broken replica or proxy): off the contract, that replica's."""
    return SetpoAPIError(response.status_code, f"answer off the contract: its body cannot be decoded ({exc})")


def at_fault(error: SetpoError, replica: str) -> SetpoError:
    error.replica = replica
    return error


def checked(response: httpx.Response, payload: dict, replica: str) -> DiversityResponse:
    """The diversity answer, parsed and checked against what was sent; a failure names the replica that gave it."""
    try:
        result = parsed(DiversityResponse, response)
        problem = answer_problem(result, payload)
        if problem is not None:  # never zip an answer that does not fit what was sent onto it, nor train on NaN
            raise SetpoAPIError(response.status_code, f"answer off the contract: {problem}")
    except SetpoError as exc:
        raise at_fault(exc, replica) from None
    return result


class SetpoClient(_ClientConfig):
    """Blocking client. `SetpoClient(url, api_key=..., timeout=...)`; use as a context manager or call close().
    Thread-safe: a step's requests may be in flight from several threads.

    url defaults to the SETPO_URL environment variable (else http://127.0.0.1:8000), api_key to SETPO_API_KEY, as in
    every plug-in and the docs; several replicas are several URLs, comma-separated, and `dns:///name:port` is every
    address the name resolves to (`resolver`: (host, port) -> addresses, default getaddrinfo).
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
        resolver: Resolver = addresses,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff, max_response_bytes, resolver)
        self._http = {
            url: httpx.Client(base_url=url, headers=self.headers, timeout=timeout, transport=transport)
            for url in self.spelled
        }

    def _attempt(self, url: str, method: str, path: str, body: bytes | None, deadline: float | None) -> httpx.Response:
        end, timeout = self.attempt_limits(deadline)
        spelled, host = self.route[url]
        headers = {**host, **JSON_HEADERS} if body is not None else host
        with (
            self.busy(url),
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
        payload: dict | None = None,
        deadline: float | None = None,
        avoid: Collection[str] = (),
        only: str | None = None,
        rounds: int | None = None,
    ) -> tuple[str, httpx.Response]:
        """(the replica that answered, its answer). `rounds`: retry rounds allowed (default max_retries)."""
        body = json_body(payload) if payload is not None else None
        call = Call(self.max_retries if rounds is None else rounds)
        while True:
            if self.resolve_due():
                self.resolve()
            for due in self.due():  # asked on a thread of its own: a replica left out costs no call its /ready wait
                with contextlib.suppress(RuntimeError):  # no thread to be had (shutting down): due again RECHECK_S on
                    threading.Thread(target=self.recheck, args=(due,), name="setpo-recheck", daemon=True).start()
            attempt = self.next_attempt(call, deadline, avoid, only)
            if attempt is None:
                raise at_fault(self.give_up(call), call.tried[-1])
            url, delay = attempt
            if delay:
                time.sleep(delay)
            try:
                answer: httpx.Response | Exception = self._attempt(url, method, path, body, deadline)
            except ATTEMPT_ERRORS as exc:
                answer = exc
            response = self.outcome(call, url, answer, f"{method} {path}")
            if response is not None:
                return url, response

    def probe(self, url: str, timeout: float | httpx.Timeout = PROBE_TIMEOUT_S) -> bool:
        try:
            spelled, host = self.route[url]
            status: int | None = self._http[spelled].get(url + "/ready", headers=host, timeout=timeout).status_code
        except httpx.HTTPError:  # unreachable, too slow, or an answer that cannot be read: not ready
            status = None
        return self.readiness(url, status)

    def recheck(self, url: str) -> None:
        """probe(), on its own thread (PROBE_TIMEOUT_S to connect and to answer): nothing waits for it, nothing may
        escape it."""
        try:
            self.probe(url)
        except Exception as exc:  # the client was closed meanwhile: there is nothing left to record it for
            log.debug("setpo replica %s: /ready not asked (%s)", url, exc)

    def diversity(
        self,
        groups: Sequence[Group | Mapping],
        weight: float | None = None,
        *,
        min_reward: float | None = None,
        kernel: Kernel | None = None,
        normalize: Normalize | None = None,
        deadline: float | None = None,
        avoid: Collection[str] = (),
    ) -> DiversityResponse:
        """Marginals, local masses, set scores (and shaped advantages for groups with rewards). Contract v1.1:
        `min_reward` scores only members with reward >= it, `kernel` 'embedding' | 'hybrid' | 'key' (groups give
        `keys`), `normalize` 'none' | 'zscore'; the answer then also has each group's `scored` and `bonus`.
        An answer that does not fit the groups sent (a group or member missing, a number not finite) is a
        SetpoAPIError. `avoid`: replicas not to ask unless no other is left."""
        payload = diversity_payload(groups, weight, min_reward, kernel, normalize)
        url, response = self._request("POST", "/v1/diversity", payload, deadline, avoid)
        return checked(response, payload, url)

    def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        _, response = self._request("POST", "/v1/embeddings", embeddings_payload(input, encoding_format, dimensions))
        return parsed(EmbeddingsResponse, response)

    def info(self, deadline: float | None = None) -> Info:
        """The service's model and limits; of several replicas, the strictest of those that answer (each asked
        once: one that does not answer is left out, not waited for)."""
        if len(self.urls) == 1:
            return parsed(Info, self._request("GET", "/info", deadline=deadline)[1])
        infos, failure = [], None
        for url in [url for url in self.urls if url not in self.left_out] or self.urls:
            try:
                infos.append(parsed(Info, self._request("GET", "/info", deadline=deadline, only=url, rounds=0)[1]))
            except SetpoError as exc:
                failure = exc
        if not infos:
            assert failure is not None
            raise failure
        return strictest(infos)

    def models(self) -> ModelList:
        """The served model, as OpenAI's model list (one entry)."""
        return parsed(ModelList, self._request("GET", "/v1/models")[1])

    def ready(self) -> bool:
        """True when the model is loaded and warmed up (of several replicas: any). One that cannot be reached is
        not ready, and is left out until it is."""
        if self.resolve_due():
            self.resolve()
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
        resolver: Resolver = addresses,
    ):
        super().__init__(base_url, api_key, timeout, max_retries, backoff, max_backoff, max_response_bytes, resolver)
        self._http = {
            url: httpx.AsyncClient(base_url=url, headers=self.headers, timeout=timeout, transport=transport)
            for url in self.spelled
        }
        self._rechecks: set[asyncio.Task] = set()  # /ready of replicas left out, asked in the background

    async def _attempt(
        self, url: str, method: str, path: str, body: bytes | None, deadline: float | None
    ) -> httpx.Response:
        end, timeout = self.attempt_limits(deadline)
        spelled, host = self.route[url]
        headers = {**host, **JSON_HEADERS} if body is not None else host
        with self.busy(url):
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
        payload: dict | None = None,
        deadline: float | None = None,
        avoid: Collection[str] = (),
        only: str | None = None,
        rounds: int | None = None,
    ) -> tuple[str, httpx.Response]:
        """SetpoClient._request, awaited."""
        body = json_body(payload) if payload is not None else None
        call = Call(self.max_retries if rounds is None else rounds)
        while True:
            if self.resolve_due():
                await asyncio.to_thread(self.resolve)  # getaddrinfo blocks: never on the event loop
            for due in self.due():  # asked in a task of its own: a replica left out costs no call its /ready wait
                task = asyncio.create_task(self.recheck(due))
                self._rechecks.add(task)  # held until done (the loop keeps only weak references); cancelled by close()
                task.add_done_callback(self._rechecks.discard)
            attempt = self.next_attempt(call, deadline, avoid, only)
            if attempt is None:
                raise at_fault(self.give_up(call), call.tried[-1])
            url, delay = attempt
            if delay:
                await asyncio.sleep(delay)
            try:
                answer: httpx.Response | Exception = await self._attempt(url, method, path, body, deadline)
            except ATTEMPT_ERRORS as exc:
                answer = exc
            response = self.outcome(call, url, answer, f"{method} {path}")
            if response is not None:
                return url, response

    async def probe(self, url: str, timeout: float | httpx.Timeout = PROBE_TIMEOUT_S) -> bool:
        try:
            spelled, host = self.route[url]
            status: int | None = (
                await self._http[spelled].get(url + "/ready", headers=host, timeout=timeout)
            ).status_code
        except httpx.HTTPError:  # unreachable, too slow, or an answer that cannot be read: not ready
            status = None
        return self.readiness(url, status)

    async def recheck(self, url: str) -> None:
        """probe(), in its own task (PROBE_TIMEOUT_S to connect and to answer): nothing awaits it, nothing may escape
        it."""
        try:
            await self.probe(url)
        except Exception as exc:  # the client was closed meanwhile: there is nothing left to record it for
            log.debug("setpo replica %s: /ready not asked (%s)", url, exc)

    async def diversity(
        self,
        groups: Sequence[Group | Mapping],
        weight: float | None = None,
        *,
        min_reward: float | None = None,
        kernel: Kernel | None = None,
        normalize: Normalize | None = None,
        deadline: float | None = None,
        avoid: Collection[str] = (),
    ) -> DiversityResponse:
        payload = diversity_payload(groups, weight, min_reward, kernel, normalize)
        url, response = await self._request("POST", "/v1/diversity", payload, deadline, avoid)
        return checked(response, payload, url)

    async def embeddings(
        self, input: str | Sequence[str], encoding_format: str = "float", dimensions: int | None = None
    ) -> EmbeddingsResponse:
        payload = embeddings_payload(input, encoding_format, dimensions)
        return parsed(EmbeddingsResponse, (await self._request("POST", "/v1/embeddings", payload))[1])

    async def info(self, deadline: float | None = None) -> Info:
        if len(self.urls) == 1:
            return parsed(Info, (await self._request("GET", "/info", deadline=deadline))[1])
        infos, failure = [], None
        for url in [url for url in self.urls if url not in self.left_out] or self.urls:
            try:
                answer = await self._request("GET", "/info", deadline=deadline, only=url, rounds=0)
                infos.append(parsed(Info, answer[1]))
            except SetpoError as exc:
                failure = exc
        if not infos:
            assert failure is not None
            raise failure
        return strictest(infos)

    async def models(self) -> ModelList:
        return parsed(ModelList, (await self._request("GET", "/v1/models"))[1])

    async def ready(self) -> bool:
        if self.resolve_due():
            await asyncio.to_thread(self.resolve)
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

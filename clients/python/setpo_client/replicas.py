"""Where a client's requests go: the replicas, which of them are left out, and which one an attempt goes to.

Several replicas are several URLs, comma-separated (as OpenRLHF spells --reward.remote_url). `dns:///name:port`
(gRPC's spelling) is every address the name resolves to (a headless Service, compose's service name), each asked with
the name as its Host, resolved again at most every RESOLVE_S seconds so that the addresses an autoscaler adds are used
and removed ones dropped. A plain http:// URL is connected to as it is (docs/deployment.md, "Several replicas").
"""

import logging
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

import httpx

from setpo_client.errors import SetpoError
from setpo_client.types import Info, Limits

RECHECK_S = 1.0  # a replica left out is asked /ready again at most this often
RESOLVE_S = 5.0  # a dns:/// name is resolved again at most this often (the TTL of a headless Service's records)
RESOLVED = "dns:///"
Resolver = Callable[[str, int], list[str]]  # (host, port) -> its addresses
log = logging.getLogger("setpo_client")


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


class ReplicaPool:
    """The live routing state both clients share (thread-safe): the replicas (a dns:/// name's current addresses
    included), the requests in flight and sent to each, the ones left out until their /ready answers 200, and
    `replica_changes`, the replicas taken back or newly resolved so far (each may serve another model or tighter limits
    than the /info a caller learned: SetpoShaper asks it again when this has changed)."""

    resolver: Resolver = staticmethod(addresses)  # (host, port) -> addresses; tests set another on the class

    def __init__(self, spelled: list[str]):
        self.spelled = spelled
        # replica URL -> (the spelled URL whose connections it uses, the Host it is asked as: a resolved name's)
        self.route: dict[str, tuple[str, dict[str, str]]] = {url: (url, {}) for url in spelled}
        self.urls = list(spelled)
        self.names = [url for url in spelled if resolved_name(url) is not None]
        self.resolve_at = 0.0  # when the names are next resolved
        self.lock = threading.Lock()  # a shaper's threads share one client
        self.in_flight = dict.fromkeys(self.urls, 0)
        self.sent = dict.fromkeys(self.urls, 0)
        self.left_out: dict[str, float] = {}  # replica -> when its /ready is next asked
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

    def pick(self, tried: Collection[str], failed: Collection[str], only: str | None = None) -> str | None:
        """The replica for a call's next attempt, or None when every one it may use failed: one not tried in this
        round, not left out, with the fewest requests in flight, then the fewest sent."""
        pool = [only] if only else self.urls
        pool = [url for url in pool if url not in failed]
        if not pool:
            return None
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

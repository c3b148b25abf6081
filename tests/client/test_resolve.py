"""One name for several replicas (issue 39, item 2): `dns:///name:port` is every address the name resolves to (a
headless Service, compose's service name), each a replica, resolved again every RESOLVE_S seconds so the addresses an
autoscaler adds are used and removed ones dropped. Real servers on 127.0.0.1, 127.0.0.2 and 127.0.0.3 (all loopback)
on one port, as pods behind one name listen on one port; the name's addresses come from a resolver the test
changes, and the default resolver (getaddrinfo) is checked once on `localhost`. Without resolving, a name's step goes
over one connection pool to one address: the spread measured through compose's DNS is in
tests/deploy/container/test_podman_run.py and docs/deployment.md."""

import asyncio
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest

from setpo_client import AsyncSetpoClient, SetpoClient
from setpo_client import replicas as replicas_module
from setpo_client.replicas import ReplicaPool
from setpo_client.shaping import SetpoShaper
from setpo_server.local import LocalServer, free_port
from tests.metrics import scrape

GROUPS = [[f"Answer {k}: {p} + {k} = {p + k}, so {p + k} it is." for k in range(5)] for p in range(12)]
NAME = "setpo-replicas.test"  # never looked up: the test's resolver answers for it


def served(url: str) -> float:
    """/v1/diversity requests the replica at `url` answered."""
    samples = scrape(SimpleNamespace(url=url)).items()
    return sum(v for k, v in samples if k.startswith("setpo_requests_total{") and 'route="/v1/diversity"' in k)


@pytest.fixture(scope="module")
def pods():
    """Three replicas on one port, at three loopback addresses: {address: its URL}."""
    port = free_port()
    servers = {
        f"127.0.0.{i}": LocalServer(port=port, host=f"127.0.0.{i}", dtype="float32", threads=1) for i in (1, 2, 3)
    }
    for server in servers.values():
        server.start(wait=False)
    urls = {address: f"http://{address}:{port}" for address in servers}
    try:
        for address, server in servers.items():
            server.wait_until(lambda url=urls[address]: httpx.get(url + "/ready", timeout=5).status_code == 200)
        yield SimpleNamespace(port=port, urls=urls)
    finally:
        for server in servers.values():
            server.stop()


def resolving(monkeypatch, resolver) -> None:
    """The replicas' names resolved by `resolver` for the rest of the test (ReplicaPool's own seam)."""
    monkeypatch.setattr(ReplicaPool, "resolver", staticmethod(resolver))


def counts(pods) -> dict[str, float]:
    return {address: served(url) for address, url in pods.urls.items()}


def test_a_resolved_name_spreads_a_step_over_its_addresses_and_follows_a_change_of_them(pods, monkeypatch):
    monkeypatch.setattr(replicas_module, "RESOLVE_S", 0.5)
    answers = {NAME: ["127.0.0.1", "127.0.0.2"]}
    asked = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return answers[host]

    resolving(monkeypatch, resolver)
    with SetpoClient(f"dns:///{NAME}:{pods.port}") as client:
        assert client.urls == [pods.urls["127.0.0.1"], pods.urls["127.0.0.2"]]
        before = counts(pods)
        step = SetpoShaper(client, weight=0.3).score(GROUPS)  # one chunk in flight per address
        after = counts(pods)
        assert step.metrics["setpo/requests"] == 2 and step.metrics["setpo/fallback_steps"] == 0
        assert [after[a] - before[a] for a in ("127.0.0.1", "127.0.0.2", "127.0.0.3")] == [1, 1, 0]

        answers[NAME] = ["127.0.0.2", "127.0.0.3"]  # the autoscaler replaced a pod
        time.sleep(0.6)
        before = counts(pods)
        for _ in range(4):
            client.diversity([{"texts": GROUPS[0]}])
        after = counts(pods)
        assert client.urls == [pods.urls["127.0.0.2"], pods.urls["127.0.0.3"]]
        new = [after[a] - before[a] for a in ("127.0.0.1", "127.0.0.2", "127.0.0.3")]
        assert new[0] == 0 and new[1] >= 1 and new[2] >= 1 and sum(new) == 4  # fewest sent first: the new one gains
    assert asked[0] == (NAME, pods.port) and len(asked) >= 2


def test_a_name_that_does_not_resolve_keeps_the_addresses_it_had(pods, monkeypatch, caplog):
    monkeypatch.setattr(replicas_module, "RESOLVE_S", 0.2)
    answers: list = [["127.0.0.3"]]

    def resolver(host: str, port: int) -> list[str]:
        if isinstance(answers[0], Exception):
            raise answers[0]
        return answers[0]

    resolving(monkeypatch, resolver)
    with SetpoClient(f"dns:///{NAME}:{pods.port}") as client:
        answers[0] = socket.gaierror(socket.EAI_NONAME, "Name or service not known")  # DNS hiccup, or no pod ready
        time.sleep(0.3)
        client.diversity([{"texts": GROUPS[0]}])
        assert client.urls == [pods.urls["127.0.0.3"]]
    assert any("does not resolve" in record.getMessage() for record in caplog.records)


def test_a_resolver_that_finds_no_address_is_a_name_that_does_not_resolve(pods, monkeypatch):
    monkeypatch.setattr(replicas_module, "RESOLVE_S", 0.2)
    answers = [["127.0.0.3"]]
    resolving(monkeypatch, lambda host, port: answers[0])
    with SetpoClient(f"dns:///{NAME}:{pods.port}") as client:
        answers[0] = []  # a custom resolver's "no pod ready": the addresses it had are kept, as after a DNS error
        time.sleep(0.3)
        client.diversity([{"texts": GROUPS[0]}])
        assert client.urls == [pods.urls["127.0.0.3"]]


def test_an_address_the_name_dropped_is_never_left_out_again(pods, monkeypatch):
    """A /ready recheck (on its own thread) that ends after its address left the name must not bring it back as a
    replica left out, asked every second for good."""
    monkeypatch.setattr(replicas_module, "RESOLVE_S", 0.2)
    answers = [["127.0.0.3", "127.0.0.2", "127.0.0.1"]]
    resolving(monkeypatch, lambda host, port: answers[0])
    with SetpoClient(f"dns:///{NAME}:{pods.port}") as client:
        gone = pods.urls["127.0.0.2"]
        answers[0] = ["127.0.0.3", "127.0.0.1"]
        time.sleep(0.3)
        client.diversity([{"texts": GROUPS[0]}])  # resolved again: the address is gone
        client.replicas.readiness(gone, None)  # what a recheck of it that ended just now records
        assert gone not in client.urls and gone not in client.replicas.left_out


def test_an_async_client_spreads_concurrent_calls_over_the_addresses(pods, monkeypatch):
    async def two_calls() -> list[str]:
        resolver = lambda host, port: ["127.0.0.1", "127.0.0.3"]  # noqa: E731
        resolving(monkeypatch, resolver)
        async with AsyncSetpoClient(f"dns:///{NAME}:{pods.port}") as client:
            await asyncio.gather(*(client.diversity([{"texts": group}]) for group in GROUPS[:2]))
            return client.urls

    before = counts(pods)
    urls = asyncio.run(two_calls())
    after = counts(pods)
    assert urls == [pods.urls["127.0.0.1"], pods.urls["127.0.0.3"]]
    assert [after[a] - before[a] for a in ("127.0.0.1", "127.0.0.2", "127.0.0.3")] == [1, 0, 1]


def test_each_address_is_asked_with_the_name_as_its_host(monkeypatch):
    """Connecting to an address, the request still names the name (virtual hosts, access logs, an ingress)."""
    hosts = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self):
            hosts.append(self.headers["Host"])
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.4", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_port
        resolving(monkeypatch, lambda host, port: ["127.0.0.4"])
        with SetpoClient(f"dns:///{NAME}:{port}") as client:
            assert client.ready() and client.urls == [f"http://127.0.0.4:{port}"]
    finally:
        server.shutdown()
    assert hosts == [f"{NAME}:{port}"]


def test_the_default_resolver_is_getaddrinfo_and_resolves_localhost(pods):
    expected = [info[4][0] for info in socket.getaddrinfo("localhost", pods.port, type=socket.SOCK_STREAM)]
    with SetpoClient(f"dns:///localhost:{pods.port}") as client:
        assert "127.0.0.1" in expected and [httpx.URL(url).host for url in client.urls] == list(dict.fromkeys(expected))
        assert client.ready()
        before = served(pods.urls["127.0.0.1"])
        assert client.diversity([{"texts": GROUPS[0]}]).model == "all-MiniLM-L6-v2"
        assert served(pods.urls["127.0.0.1"]) - before == 1


def test_a_plain_url_is_connected_to_as_given_never_resolved(pods, monkeypatch):
    def resolver(host: str, port: int) -> list[str]:
        raise AssertionError("a plain URL was resolved")

    resolving(monkeypatch, resolver)
    with SetpoClient(f"http://localhost:{pods.port}") as client:
        assert client.urls == [f"http://localhost:{pods.port}"]
        client.diversity([{"texts": GROUPS[0]}])


@pytest.mark.parametrize("spelled", ["dns://10.0.0.10/setpo:8000", "dns+https://setpo:8000", "dns:///https://setpo"])
def test_a_wrong_dns_spelling_is_refused_at_construction_saying_how(spelled):
    with pytest.raises(ValueError, match=r"dns:///host:port\[/path\] \(plain http"):
        SetpoClient(spelled)


def test_an_address_the_name_adds_makes_the_next_step_ask_info_again(pods, monkeypatch):
    """A pod an autoscaler adds may run another image or other limits: the client counts it (replica_changes) and the
    shaper asks /info again before its next step; an address the name drops changes nothing the shaper learned."""
    monkeypatch.setattr(replicas_module, "RESOLVE_S", 0.2)
    answers = [["127.0.0.1"]]
    resolving(monkeypatch, lambda host, port: answers[0])
    with SetpoClient(f"dns:///{NAME}:{pods.port}") as client:
        shaper = SetpoShaper(client, weight=0.3)
        assert shaper.score(GROUPS[:2]).metrics["setpo/fallback_steps"] == 0 and shaper.info_known()
        answers[0] = ["127.0.0.1", "127.0.0.2"]
        time.sleep(0.3)
        client.diversity([{"texts": GROUPS[0]}])  # the name is resolved again: one address more
        assert not shaper.info_known()
        assert shaper.score(GROUPS[:2]).metrics["setpo/fallback_steps"] == 0 and shaper.info_known()
        answers[0] = ["127.0.0.2"]
        time.sleep(0.3)
        client.diversity([{"texts": GROUPS[0]}])  # one address fewer
        assert client.urls == [pods.urls["127.0.0.2"]] and shaper.info_known()

"""SetpoShaper: one request per step, lambda * s per response, the fault policy, and the step metrics."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from setpo_client import SetpoAPIError, SetpoClient, SetpoError
from setpo_client.shaping import SetpoShaper, duplicate_share
from setpo_server.local import LocalServer, free_port

GROUPS = [
    ["48 / 2 = 24, 48 + 24 = 72", "48 / 2 = 24, 48 + 24 = 72", "1.5 * 48 = 72", "a = 48, a + a/2 = 72"],
    ["the answer is 5", "five", "2 + 3 = 5"],
]


def test_bonus_is_weight_times_the_services_marginals_and_metrics_are_reported(client):
    step = SetpoShaper(client, weight=0.2).score(GROUPS)
    direct = client.diversity([{"texts": g} for g in GROUPS])
    for bonus, group in zip(step.bonus, direct.groups):
        assert bonus == pytest.approx([0.2 * s for s in group.marginals], abs=1e-7)
    flat = [s for g in direct.groups for s in g.marginals]
    assert step.metrics["setpo/marginal_mean"] == pytest.approx(sum(flat) / len(flat), abs=1e-7)
    assert step.metrics["setpo/set_score_mean"] == pytest.approx(sum(g.set_score for g in direct.groups) / 2, abs=1e-7)
    assert step.metrics["setpo/duplicate_share"] == pytest.approx(1 / 7)
    assert step.metrics["setpo/weight"] == 0.2 and step.metrics["setpo/fallback_steps"] == 0
    assert step.metrics["setpo/time_s"] > 0 and 0 <= step.metrics["setpo/saturation"] <= 1


def test_weight_zero_sends_nothing_and_adds_nothing():
    shaper = SetpoShaper(SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=0), weight=0.0)
    step = shaper.score(GROUPS)
    assert step.bonus == [[0.0] * 4, [0.0] * 3] and step.marginals is None and shaper.fallback_steps == 0


def test_skip_falls_back_to_zero_and_counts_then_resumes_when_the_service_returns():
    port = free_port()
    client = SetpoClient(f"http://127.0.0.1:{port}", max_retries=1, backoff=0.05)
    shaper = SetpoShaper(client, weight=0.1, on_error="skip")
    for expected in (1, 2):
        step = shaper.score(GROUPS)
        assert step.bonus == [[0.0] * 4, [0.0] * 3] and step.metrics["setpo/weight"] == 0.0
        assert step.metrics["setpo/fallback_steps"] == expected
    with LocalServer(port=port):
        step = shaper.score(GROUPS)
    assert step.marginals is not None and any(b != 0 for b in step.bonus[0])
    assert step.metrics["setpo/fallback_steps"] == 2 and step.metrics["setpo/weight"] == 0.1


def test_fail_raises_a_clear_error():
    client = SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=0)
    with pytest.raises(SetpoError, match="on_error='fail'.*cannot reach"):
        SetpoShaper(client, weight=0.1, on_error="fail").score(GROUPS)


def test_a_bad_request_raises_even_under_skip(client):
    with pytest.raises(SetpoAPIError, match="at least 3"):
        SetpoShaper(client, weight=0.1, on_error="skip").score([["only", "two"]])


class FailingService(BaseHTTPRequestHandler):
    """A service that is up but broken: every request gets `status` with `body` (a model crash, a broken proxy)."""

    status, body = 500, b'{"error": {"message": "CUDA out of memory", "type": "server_error"}}'

    def do_POST(self):
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status,body", [(500, FailingService.body), (200, b'{"groups": [{"marginals": [NaN]}]}')], ids=["500", "off-contract 200"])
def test_a_failing_service_falls_back_under_skip_and_raises_under_fail(status, body):
    handler = type("Handler", (FailingService,), {"status": status, "body": body})
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as broken:
        threading.Thread(target=broken.serve_forever, daemon=True).start()
        client = SetpoClient(f"http://127.0.0.1:{broken.server_port}", max_retries=0)
        shaper = SetpoShaper(client, weight=0.1, on_error="skip")
        step = shaper.score(GROUPS)
        assert step.marginals is None and step.metrics["setpo/weight"] == 0.0 and shaper.fallback_steps == 1
        with pytest.raises(SetpoAPIError, match=f"answered {status}"):
            SetpoShaper(client, weight=0.1, on_error="fail").score(GROUPS)
        broken.shutdown()


def test_max_chars_keeps_the_beginning(client):
    long = ["A" * 50 + " tail one", "A" * 50 + " tail two", "something else entirely"]
    step = SetpoShaper(client, weight=1.0, max_chars=50).score([long])
    assert step.marginals[0][0] == pytest.approx(step.marginals[0][1], abs=1e-7)  # identical after the cap
    assert step.metrics["setpo/duplicate_share"] == pytest.approx(1 / 3)


def test_duplicate_share_counts_repeats_within_groups_only():
    assert duplicate_share([["a", "a", "a"], ["a", "b", "c"]]) == pytest.approx(2 / 6)
    assert duplicate_share([]) == 0.0


@pytest.mark.parametrize("kwargs,match", [({"weight": -0.1}, "weight"), ({"weight": 0.1, "on_error": "retry"}, "on_error")])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SetpoShaper(SetpoClient(), **kwargs)


def test_embedding_groups_are_scored_and_exact_repeats_counted(client):
    groups = [[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.7, 0.7]], [[1.0, 2.0], [2.0, 1.0], [0.5, 0.5]]]
    step = SetpoShaper(client, weight=0.5).score(groups)
    direct = client.diversity([{"embeddings": g} for g in groups])
    assert step.marginals == [g.marginals for g in direct.groups]
    assert step.bonus[1] == pytest.approx([0.5 * s for s in direct.groups[1].marginals])
    assert step.metrics["setpo/duplicate_share"] == pytest.approx(1 / 7)

"""SetpoShaper: one request per step, lambda * s per response, the fault policy, and the step metrics."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from setpo_client import SetpoClient, SetpoError
from setpo_client.shaping import SetpoShaper, duplicate_share, text_chars
from setpo_server.local import LocalServer, free_port
from tests.inprocess import InProcessService

GROUPS = [
    ["48 / 2 = 24, 48 + 24 = 72", "48 / 2 = 24, 48 + 24 = 72", "1.5 * 48 = 72", "a = 48, a + a/2 = 72"],
    ["the answer is 5", "five", "2 + 3 = 5"],
]


def test_bonus_is_weight_times_the_services_marginals_and_metrics_are_reported(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.2)
    step = shaper.score(GROUPS)
    direct = inprocess.diversity([{"texts": g} for g in GROUPS])
    for bonus, group in zip(step.bonus, direct.groups):
        assert bonus == pytest.approx([0.2 * s for s in group.marginals], abs=1e-7)
    flat = [s for g in direct.groups for s in g.marginals]
    assert step.metrics["setpo/marginal_mean"] == pytest.approx(sum(flat) / len(flat), abs=1e-7)
    assert step.metrics["setpo/set_score_mean"] == pytest.approx(sum(g.set_score for g in direct.groups) / 2, abs=1e-7)
    assert step.metrics["setpo/duplicate_share"] == pytest.approx(1 / 7)
    assert step.metrics["setpo/weight"] == 0.2 and step.metrics["setpo/fallback_steps"] == 0
    assert step.metrics["setpo/time_s"] > 0 and 0 <= step.metrics["setpo/saturation"] <= 1
    assert (
        step.metrics["setpo/active"] == 1
        and step.metrics["setpo/requests"] == 1
        and step.metrics["setpo/unscored_groups"] == 0
    )
    # time_share needs a whole step, from the previous step's start: absent on the first, in (0, 1] after
    assert "setpo/time_share" not in step.metrics
    assert 0 < shaper.score(GROUPS).metrics["setpo/time_share"] <= 1


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
    with pytest.raises(SetpoError, match=r"on_error='fail'.*cannot reach"):
        SetpoShaper(client, weight=0.1, on_error="fail").score(GROUPS)


def test_a_group_of_fewer_than_three_scorable_members_gets_zero_and_is_counted_the_rest_is_shaped(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.1, on_error="fail")  # not a failure: the policy for such groups
    step = shaper.score([["only", "two"], GROUPS[1], ["one", None, "two", None]])  # None: not scorable (padding)
    assert (
        step.bonus[0] == [0.0, 0.0]
        and step.bonus[2] == [0.0] * 4
        and step.marginals[0] is None
        and step.marginals[2] is None
    )
    assert step.bonus[1] == pytest.approx(
        [0.1 * s for s in inprocess.diversity([{"texts": GROUPS[1]}]).groups[0].marginals], abs=1e-7
    )
    assert step.metrics["setpo/unscored_groups"] == 2 and step.metrics["setpo/active"] == 1


def test_unscorable_members_are_left_out_and_keep_zero(inprocess):
    step = SetpoShaper(inprocess, weight=1.0).score([[None, *GROUPS[1], None]])
    assert step.bonus[0][0] == step.bonus[0][-1] == 0.0
    assert step.bonus[0][1:4] == pytest.approx(
        inprocess.diversity([{"texts": GROUPS[1]}]).groups[0].marginals, abs=1e-7
    )


KEY = "rotated-key-0123456789"
CJK = "因为四十八的一半是二十四所以答案是七十二" * 3  # 3 UTF-8 bytes a character


@pytest.fixture(scope="module")
def tight_service():
    """The real service (in-process) with small limits and a key: what a shared deployment may be configured with."""
    with InProcessService(
        max_groups=2, max_group_size=5, max_text_chars=100, max_body_bytes=2048, api_key=KEY
    ) as running:
        yield running


def test_a_step_is_fitted_within_the_services_limits_and_every_group_scored(tight_service):
    client = tight_service.client(api_key=KEY, max_retries=0)
    groups = [[f"{CJK} {i} {j}" for j in range(4)] for i in range(5)] + [["x" * 500 + str(j) for j in range(3)]]
    step = SetpoShaper(client, weight=1.0, on_error="fail").score(groups)
    # 6 groups, 2 a request at most, and CJK texts that must be cut by bytes to fit 2048-byte bodies
    assert (
        step.metrics["setpo/requests"] >= 3
        and step.metrics["setpo/unscored_groups"] == 0
        and step.metrics["setpo/cut_texts"] > 0
    )
    assert all(m is not None and len(m) == len(g) for m, g in zip(step.marginals, groups))
    assert step.metrics["setpo/active"] == 1


def test_a_step_is_split_within_the_answer_size_the_service_takes():
    """SETPO_MAX_RESPONSE_BYTES (in /info) bounds an answer as max_body_bytes bounds a request: 64 groups of 8, one
    request by every other limit, whose answer the service would refuse, go in two requests, none refused."""
    groups = [[f"prompt {p}: answer {k} is {p * k + 1}" for k in range(8)] for p in range(64)]
    with InProcessService(max_response_bytes=65536) as service, service.client(max_retries=0) as client:
        step = SetpoShaper(client, weight=0.3, in_flight=1, on_error="fail").score(groups)
    assert step.metrics["setpo/requests"] == 2 and step.metrics["setpo/unscored_groups"] == 0
    assert all(m is not None and len(m) == 8 for m in step.marginals)


@pytest.mark.parametrize("queue", [{"max_queue_texts": 30}, {"max_queue_tokens": 400}], ids=["texts", "tokens"])
def test_a_step_is_split_within_the_queue_the_service_takes(queue):
    """SETPO_MAX_QUEUE_TEXTS and SETPO_MAX_QUEUE_TOKENS (in /info) bound what one request may queue: 48 texts of
    about 12 tokens, one request by every other limit, which the service would refuse whole, go in as many requests
    as the queue needs (tokens bounded from above, by UTF-8 bytes), none refused; and a group of more texts than the
    queue takes goes unscored, as one over max_group_size does."""
    groups = [[f"prompt {p}: answer {k} is {p * k + 1}" for k in range(6)] for p in range(8)]
    with InProcessService(**queue) as service, service.client(max_retries=0) as client:
        shaper = SetpoShaper(client, weight=0.3, in_flight=1, on_error="fail")
        step = shaper.score(groups)
        assert step.metrics["setpo/requests"] >= 2 and step.metrics["setpo/unscored_groups"] == 0
        assert all(m is not None and len(m) == 6 for m in step.marginals)
        if "max_queue_texts" in queue:
            assert shaper.score([[f"answer {k}" for k in range(31)], groups[0]]).metrics["setpo/unscored_groups"] == 1


def test_requests_in_flight_stay_within_the_places_one_caller_may_hold(tmp_path):
    """/info tells a caller its share of the places (SETPO_MAX_REQUESTS_PER_CALLER, auto: half once the keys name two
    callers): a shaper asked for 8 in flight keeps 2, where more would be refused with 503."""
    alice, bob = "alice-key-31f0c2d8", "bob-key-9a6e14b7c2"
    keys = tmp_path / "keys"
    keys.write_text(f"alice={alice}\nbob={bob}\n")
    groups = [[f"prompt {p}: answer {k} is {p * k + 1}" for k in range(4)] for p in range(16)]
    with (
        InProcessService(api_key_file=str(keys), max_concurrent_requests=4) as service,
        service.client(api_key=alice, max_retries=0) as client,
    ):
        assert client.info().limits.max_requests_per_caller == 2
        step = SetpoShaper(client, weight=0.3, in_flight=8, on_error="fail").score(groups)
    assert step.metrics["setpo/requests"] == 2 and step.metrics["setpo/unscored_groups"] == 0


def test_a_group_over_the_services_size_gets_zero_and_is_counted_and_said_with_both_numbers(tight_service, caplog):
    """A group can outgrow what start() checked (veRL's multi-output agent loops under rloo: rollout.n x outputs
    rows, known only at run time): it goes unscored, and the log says how big it was and what the service takes."""
    client = tight_service.client(api_key=KEY, max_retries=0)
    step = SetpoShaper(client, weight=1.0, on_error="fail").score([[f"answer {j}" for j in range(6)], ["a", "b", "c"]])
    assert step.bonus[0] == [0.0] * 6 and step.marginals[1] is not None and step.metrics["setpo/unscored_groups"] == 1
    assert "1 group(s) of 6 members; the service takes at most 5" in caplog.text
    assert "SETPO_MAX_GROUP_SIZE" in caplog.text


def test_start_proves_what_every_plug_in_needs_and_names_the_setting_as_the_plug_in_spells_it(tight_service):
    client = tight_service.client(api_key=KEY, max_retries=0)
    flags = {"group_size": "--rollout.n", "estimator": "--estimator", "max_chars": "--chars"}.get
    info = SetpoShaper(client, weight=1.0).start(5, "grpo", ("grpo", "rloo"), flags, ready_timeout=5)
    assert info.limits.max_group_size == 5  # learned: the shaper fits every step to it
    with pytest.raises(ValueError, match=r"needs --rollout.n >= 3 .*got 2"):
        SetpoShaper(client, weight=1.0).start(2, spell=flags)
    with pytest.raises(ValueError, match=r"group advantage estimator \(grpo, rloo\); got --estimator=gae"):
        SetpoShaper(client, weight=1.0).start(4, "gae", ("grpo", "rloo"), flags)
    with pytest.raises(SetpoError, match=r"groups of 6 responses.* at most 5.*lower --rollout.n"):
        SetpoShaper(client, weight=1.0).start(6, spell=flags, ready_timeout=5)
    with pytest.raises(SetpoError, match=r"--chars 500: the service takes texts of at most 100"):
        SetpoShaper(client, weight=1.0, max_chars=500).start(4, spell=flags, ready_timeout=5)
    with pytest.raises(SetpoError, match=r"is not usable.*key"):
        SetpoShaper(tight_service.client(api_key="the-old-key", max_retries=0), 1.0).start(4, ready_timeout=5)


def test_a_rotated_key_trains_on_with_zero_under_skip_logged_with_the_services_message(tight_service, caplog):
    client = tight_service.client(api_key="the-old-key", max_retries=0)
    with caplog.at_level("ERROR", logger="setpo_client"):
        step = SetpoShaper(client, weight=0.1, on_error="skip").score(GROUPS)
    assert (
        step.bonus == [[0.0] * 4, [0.0] * 3]
        and step.metrics["setpo/fallback_steps"] == 1
        and step.metrics["setpo/active"] == 0
    )
    assert any(r.levelname == "ERROR" and "401" in r.getMessage() for r in caplog.records)
    with pytest.raises(SetpoError, match=r"on_error='fail'.*401"):
        SetpoShaper(client, weight=0.1, on_error="fail").score(GROUPS)


@pytest.mark.parametrize(
    "learned,said",
    [({"max_groups": 10}, "SETPO_MAX_GROUPS"), ({"max_group_size": 10}, "SETPO_MAX_GROUP_SIZE")],
    ids=["request", "group"],
)
def test_a_request_refused_for_limits_lowered_since_info_falls_back_and_info_is_asked_again(
    tight_service, caplog, learned, said
):
    """The service refuses the request itself (param "groups") or one group for its size (param "groups[b]"): either
    says the limits learned are stale (lowered since /info, or another replica's), never that group's own fault, so
    the step falls back, once, and the next asks /info again, rather than drop the groups one request at a time."""
    shaper = SetpoShaper(tight_service.client(api_key=KEY, max_retries=0), weight=0.1, on_error="skip", in_flight=1)
    shaper.check()
    shaper.info = shaper.info.model_copy(update={"limits": shaper.info.limits.model_copy(update=learned)})
    groups = [[f"answer {j}" for j in range(7)], *GROUPS] if "max_group_size" in learned else GROUPS * 2
    with caplog.at_level("ERROR", logger="setpo_client"):
        step = shaper.score(groups)
    assert step.metrics["setpo/fallback_steps"] == 1 and all(b == 0 for g in step.bonus for b in g)
    assert step.metrics["setpo/bad_groups"] == 0
    assert any(said in r.getMessage() for r in caplog.records)
    assert shaper.info is None  # asked again at the next step


def test_a_service_that_answers_under_a_served_name_is_shaped():
    """SETPO_SERVED_MODEL_NAME: answers name the alias, /info the model; a step is shaped all the same."""
    with InProcessService(served_model_name=["text-embedding-3-small"]) as service, service.client() as client:
        step = SetpoShaper(client, weight=0.3, on_error="fail").score(GROUPS)
    assert step.metrics["setpo/fallback_steps"] == 0 and all(m is not None for m in step.marginals)


WIDE = (
    16385  # one more dimension than the service takes (setpo_server.schemas.MAX_EMBEDDING_DIM; /info does not say it)
)


def test_a_group_whose_advantages_would_overflow_is_caught_before_sending_and_the_rest_is_shaped(inprocess, caplog):
    """Finite rewards whose squares overflow (the service would refuse the group's advantages, a 422 naming
    groups[b].rewards): the client finds it before any request, that group gets bonus 0, counted and said, and the
    rest of the step is shaped in one request, as the same step without it."""
    groups = [[f"{p} apples make {p * k}" for k in range(4)] for p in range(3)]
    shaper = SetpoShaper(inprocess, weight=0.1, on_error="fail", in_flight=1)
    rewards = [[1.0, 0.0, 1.0, 0.0]] * 2 + [[1.7e308, 1.7e308, -1.7e308], [0.0] * 4]
    step = shaper.score([*groups[:2], ["x", "y", "z"], groups[2]], rewards=rewards)
    reference = SetpoShaper(inprocess, weight=0.1, on_error="fail").score(groups, rewards=rewards[:2] + rewards[3:])
    assert step.metrics["setpo/fallback_steps"] == 0 and step.metrics["setpo/bad_groups"] == 1
    assert step.metrics["setpo/requests"] == 1 and step.bonus[2] == [0.0] * 3 and step.marginals[2] is None
    for got, want in zip([*step.bonus[:2], step.bonus[3]], reference.bonus, strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    assert any("overflow" in r.getMessage() and "group 2" in r.getMessage() for r in caplog.records)


def test_a_group_only_the_service_can_refuse_fails_its_step_with_the_services_message(inprocess, caplog):
    """Vectors wider than the service takes, a limit /info does not state: the service's 422 fails the chunk, and so the step: lambda = 0 under skip, logged with the service's message;
    the next step is shaped. No group is dropped on the strength of an error message's wording."""
    vectors = [[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], [[0.5] * WIDE] * 3]
    shaper = SetpoShaper(inprocess, weight=0.1, on_error="skip")
    with caplog.at_level("ERROR", logger="setpo_client"):
        step = shaper.score(vectors)
    assert step.marginals is None and step.metrics["setpo/fallback_steps"] == 1
    assert any("422" in r.getMessage() and "16384" in r.getMessage() for r in caplog.records)
    after = shaper.score(vectors[:1])
    assert after.marginals is not None and after.metrics["setpo/fallback_steps"] == 1
    with pytest.raises(SetpoError, match=r"on_error='fail'.*16384"):
        SetpoShaper(inprocess, weight=0.1, on_error="fail").score(vectors)


class FailingService(BaseHTTPRequestHandler):
    """A service that is up but broken: every request gets `status` with `body` (a model crash, a broken proxy)."""

    status, body = 500, b'{"error": {"message": "CUDA out of memory", "type": "server_error"}}'

    def do_GET(self):  # /info too: the shaper asks it for the limits first
        self.do_POST()

    def do_POST(self):
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "status,body",
    [(500, FailingService.body), (200, b'{"groups": [{"marginals": [NaN]}]}')],
    ids=["500", "off-contract 200"],
)
def test_a_failing_service_falls_back_under_skip_and_raises_under_fail(status, body):
    handler = type("Handler", (FailingService,), {"status": status, "body": body})
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as broken:
        threading.Thread(target=broken.serve_forever, daemon=True).start()
        client = SetpoClient(f"http://127.0.0.1:{broken.server_port}", max_retries=0)
        shaper = SetpoShaper(client, weight=0.1, on_error="skip")
        step = shaper.score(GROUPS)
        assert step.marginals is None and step.metrics["setpo/weight"] == 0.0 and shaper.fallback_steps == 1
        with pytest.raises(SetpoError, match=f"on_error='fail'.*answered {status}"):
            SetpoShaper(client, weight=0.1, on_error="fail").score(GROUPS)
        broken.shutdown()


def test_max_chars_keeps_the_beginning(inprocess):
    long = ["A" * 50 + " tail one", "A" * 50 + " tail two", "something else entirely"]
    step = SetpoShaper(inprocess, weight=1.0, max_chars=50).score([long])
    assert step.metrics["setpo/cut_texts"] == 2
    assert step.marginals[0][0] == pytest.approx(step.marginals[0][1], abs=1e-7)  # identical after the cap
    assert step.metrics["setpo/duplicate_share"] == 0  # exact repeats of the responses themselves, not of what was sent


def test_duplicate_share_counts_repeats_within_groups_only():
    assert duplicate_share([["a", "a", "a"], ["a", "b", "c"]]) == pytest.approx(2 / 6)
    assert duplicate_share([]) == 0.0


@pytest.mark.parametrize(
    "kwargs,match", [({"weight": -0.1}, "weight"), ({"weight": 0.1, "on_error": "retry"}, "on_error")]
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SetpoShaper(SetpoClient(), **kwargs)


def test_embedding_groups_are_scored_and_exact_repeats_counted(inprocess):
    groups = [[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.7, 0.7]], [[1.0, 2.0], [2.0, 1.0], [0.5, 0.5]]]
    step = SetpoShaper(inprocess, weight=0.5).score(groups)
    direct = inprocess.diversity([{"embeddings": g} for g in groups])
    assert step.marginals == [g.marginals for g in direct.groups]
    assert step.bonus[1] == pytest.approx([0.5 * s for s in direct.groups[1].marginals])
    assert step.metrics["setpo/duplicate_share"] == pytest.approx(1 / 7)


def test_a_member_the_json_body_cannot_carry_fails_its_group_not_the_step(inprocess, caplog):
    # an embedding the JSON body cannot carry (NaN from a diverged model): that group trains on with bonus 0,
    # counted, and the step is not a fallback step (issue 25: one bad member fails its group, not the step)
    with caplog.at_level("WARNING", logger="setpo_client"):
        step = SetpoShaper(inprocess, weight=0.5).score([[[1.0, 0.0], [float("nan"), 1.0], [0.5, 0.5]]])
    assert (
        step.bonus == [[0.0] * 3]
        and step.metrics["setpo/bad_groups"] == 1
        and step.metrics["setpo/fallback_steps"] == 0
        and "cannot be sent" in caplog.text
    )


def test_texts_are_cut_to_what_the_service_keeps(inprocess):
    info = inprocess.info()
    assert text_chars(info) == info.truncate_chars == 10 * info.max_tokens  # the server's own cut, from /info
    assert text_chars(info.model_copy(update={"truncate_chars": None})) == 8 * info.max_tokens  # a server too old
    assert text_chars(info, max_chars=50) == 50  # the caller's cap
    assert text_chars(info, max_chars=10**9) == info.limits.max_text_chars  # never more than the service accepts

"""A step fans out over several replicas (issue 39, items 1, 2 and 6), against real servers on 127.0.0.1: the
answers equal the serial path's; a replica killed mid-step, down, not ready or answering off the contract costs
nothing but its own chunk's retry; and several URLs are spelled as OpenRLHF spells them (comma-separated)."""

import asyncio
import itertools
import signal
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from setpo_client import AsyncSetpoClient, SetpoAPIError, SetpoClient, SetpoError
from setpo_client import client as client_module
from setpo_client.fitting import fit_step
from setpo_client.replicas import RECHECK_S, replica_urls, strictest
from setpo_client.shaping import SetpoShaper
from setpo_server.local import LocalServer, free_port
from tests.client import test_shaper_distrust as distrust
from tests.client.test_shaper_distrust import good_answer
from tests.metrics import scrape

# 24 prompts x 6 GSM8K-like responses: enough for several chunks, small enough for a 2-core machine
GROUPS = [
    [f"Step {k}: {p} apples and {k * p} pears make {p + k * p}; so the answer is {p + k * p + r}." for k in range(6)]
    for p in range(24)
    for r in [p % 3]
]
POLICY = {"weight": 0.3, "min_reward": 1.0, "normalize": "zscore"}
REWARDS = [[1.0, 1.0, 0.0, 1.0, 1.0, 1.0] for _ in GROUPS]


def served(server) -> float:
    """/v1/diversity requests the server answered (any status, any other label)."""
    samples = scrape(server).items()
    return sum(v for k, v in samples if k.startswith("setpo_requests_total{") and 'route="/v1/diversity"' in k)


@pytest.fixture(scope="module")
def replicas():
    with LocalServer(dtype="float32", threads=1) as a, LocalServer(dtype="float32", threads=1) as b:
        yield a, b


@pytest.fixture(scope="module")
def serial(replicas):
    """The serial path's step on one replica: the reference every fanned-out step must equal."""
    with SetpoClient(replicas[0].url) as client:
        return SetpoShaper(client, in_flight=1, **POLICY).score(GROUPS, rewards=REWARDS)


def same_step(step, reference) -> None:
    assert step.metrics["setpo/fallback_steps"] == 0
    for got, want in zip(step.bonus, reference.bonus, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    for got, want in zip(step.marginals, reference.marginals, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    for name in ("setpo/scored_groups", "setpo/small_scope_groups", "setpo/unscored_groups", "setpo/scored_share"):
        assert step.metrics[name] == reference.metrics[name], name
    for name in ("setpo/bonus_rms", "setpo/marginal_mean", "setpo/marginal_std", "setpo/set_score_mean"):
        assert step.metrics[name] == pytest.approx(reference.metrics[name], abs=1e-6), name


def test_urls_are_spelled_comma_separated_as_openrlhf_spells_its_remote_urls(monkeypatch):
    assert replica_urls("http://a:8000/, http://b:8000") == ["http://a:8000", "http://b:8000"]
    for wrong in (" , ", "http://a:8000,http://a:8000/"):
        with pytest.raises(ValueError, match="comma-separated"):
            replica_urls(wrong)
    monkeypatch.setenv("SETPO_URL", "http://a:8000,http://b:8000")
    with SetpoClient() as client:
        assert client.urls == ["http://a:8000", "http://b:8000"] and client.base_url == "http://a:8000,http://b:8000"


@pytest.mark.parametrize("in_flight", [None, 4])
def test_a_step_fanned_out_over_two_replicas_equals_the_serial_step(replicas, serial, in_flight):
    a, b = replicas
    before = served(a), served(b)
    with SetpoClient(f"{a.url},{b.url}") as client:
        step = SetpoShaper(client, in_flight=in_flight, **POLICY).score(GROUPS, rewards=REWARDS)
    same_step(step, serial)
    chunks = in_flight or 2  # by default one in flight per replica
    assert step.metrics["setpo/requests"] == chunks and step.metrics["setpo/chunk_retries"] == 0
    assert served(a) - before[0] == served(b) - before[1] == chunks // 2  # both replicas had work, equal shares
    assert serial.metrics["setpo/requests"] == 1


def test_chunks_are_cut_by_bytes_so_the_long_groups_do_not_land_in_one_chunk(replicas):
    """Two long groups then twenty short ones, in two chunks: one long group in each (by group count, both would be
    in the first); the step still equals the serial one."""
    steps = [[text * 40 for text in GROUPS[0]]] * 2 + GROUPS[:20]
    with SetpoClient(replicas[0].url) as client:
        info = client.info()
        reference = SetpoShaper(client, in_flight=1, weight=0.3).score(steps)
    payloads = [(index, {"texts": group}, len(group)) for index, group in enumerate(steps)]
    counts = dict.fromkeys(("unscored", "bad", "cut"), 0)
    chunks = fit_step(payloads, info, {"weight": 0.3}, None, 2, counts)
    assert [chunk.indices for chunk in chunks] == [[0], list(range(1, 22))]
    with SetpoClient(",".join(server.url for server in replicas)) as client:
        step = SetpoShaper(client, weight=0.3).score(steps)
    same_step(step, reference)
    assert step.metrics["setpo/requests"] == 2


def test_a_replica_killed_mid_step_leaves_the_step_whole_on_the_other(replicas, serial):
    a = replicas[0]
    with LocalServer(dtype="float32", threads=1) as doomed, SetpoClient(f"{doomed.url},{a.url}") as client:
        shaper = SetpoShaper(client, in_flight=4, **POLICY)
        shaper.score(GROUPS[:3], rewards=REWARDS[:3])  # info learned, both replicas known up
        before = served(a)
        outcome = {}
        scoring = threading.Thread(target=lambda: outcome.update(step=shaper.score(GROUPS, rewards=REWARDS)))
        scoring.start()
        doomed.wait_until(lambda: scrape(doomed).get("setpo_requests_in_progress", 0) > 0, timeout=300)
        doomed.stop(signal.SIGKILL)
        scoring.join(300)
    step = outcome["step"]
    same_step(step, serial)  # nothing lost, doubled or zipped onto the wrong members
    assert step.metrics["setpo/requests"] == 4 and served(a) - before >= 3  # the killed replica's chunks went to a
    assert doomed.url in client.replicas.left_out


def test_under_fail_replicas_that_never_come_back_end_the_step_in_one_clear_error_within_its_deadline():
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    # without the step's deadline its retries would wait 15 to 31 s (backoffs of 1-2, 2-4, 4-8, 8-16 s, then a round)
    shaper = SetpoShaper(SetpoClient(",".join(urls), backoff=2.0), weight=0.3, on_error="fail", step_timeout=3.0)
    started = time.monotonic()
    with pytest.raises(SetpoError, match="on_error='fail'") as failure:
        shaper.score(GROUPS)
    assert time.monotonic() - started < 3.0 + 10.0
    assert ",".join(urls) in str(failure.value)  # the message names every replica it tried


class Fake(distrust.Fake):
    """test_shaper_distrust's fake service, as a replica that says it is ready or not (`ready`, the status of every
    answer) and answers /v1/diversity with `answer(body)` when ready; `answer_headers`: added to every answer."""

    ready: ClassVar[list[int]] = [200]
    status = 200  # of its /v1/diversity answers when ready
    answer_headers: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self):
        self.reply(self.ready[0], {"status": "ready"} if self.path == "/ready" else self.info, self.answer_headers)

    def diversity(self, body):
        answer = self.answer(body) if self.ready[0] == 200 else {"error": {"message": "not ready"}}
        self.reply(self.status if self.ready[0] == 200 else self.ready[0], answer, self.answer_headers)


@pytest.fixture
def fake(replicas):
    info = httpx.get(replicas[0].url + "/info").json()
    servers = []

    def serve(answer=None, ready=200, headers=(), status=200, **info_changes):
        handler = type(
            "Handler",
            (Fake,),
            {
                "answer": staticmethod(answer),
                "info": {**info, **info_changes},
                "ready": [ready],
                "status": status,
                "answer_headers": headers,
            },
        )
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", handler

    yield serve
    for server in servers:
        server.shutdown()


def nan_bonus(body):
    answer = good_answer(body)
    for group in answer["groups"]:
        group["bonus"] = [float("nan")] * len(group["bonus"])
    return answer


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_a_replica_answering_off_the_contract_costs_its_chunk_one_retry_elsewhere(replicas, serial, fake, on_error):
    liar, _ = fake(nan_bonus)
    with SetpoClient(f"{replicas[0].url},{liar}") as client:
        step = SetpoShaper(client, on_error=on_error, **POLICY).score(GROUPS, rewards=REWARDS)
    same_step(step, serial)
    assert step.metrics["setpo/chunk_retries"] == 1 and step.metrics["setpo/requests"] == 2


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_an_answer_its_encoding_does_not_describe_costs_its_chunk_one_retry_elsewhere(replicas, serial, fake, on_error):
    """A 200 whose body is not what its Content-Encoding says (a broken replica or proxy) is off the contract like
    NaN: that chunk is asked of another replica; and such a replica's /ready is 'not ready', never an exception."""
    liar, _ = fake(good_answer, headers=[("content-encoding", "gzip")])
    with SetpoClient(f"{replicas[0].url},{liar}") as client:
        step = SetpoShaper(client, on_error=on_error, **POLICY).score(GROUPS, rewards=REWARDS)
        same_step(step, serial)
        assert step.metrics["setpo/chunk_retries"] == 1 and step.metrics["setpo/requests"] == 2
        assert client.ready() and liar in client.replicas.left_out


@pytest.mark.parametrize("status", [500, 422])
def test_a_5xx_is_asked_of_another_replica_and_a_4xx_is_raised_at_once(replicas, fake, status):
    """Failover lives in the client: a 5xx is that replica's failure, and the call asks another at once; a 4xx says
    the request is wrong, as every replica of the deployment would: raised at once, naming the replica."""
    a = replicas[0]
    broken, _ = fake(lambda body: {"error": {"message": "refused", "type": "x"}}, status=status)
    with SetpoClient(f"{broken},{a.url}") as client:  # the broken one is asked first (both idle, in order)
        before = served(a)
        if status >= 500:
            assert len(client.diversity([{"texts": GROUPS[0]}]).groups) == 1 and client.retries == 1
        else:
            with pytest.raises(SetpoAPIError, match="answered 422") as refused:
                client.diversity([{"texts": GROUPS[0]}])
            assert refused.value.replica == broken and client.retries == 0
        assert served(a) - before == (status >= 500)


def test_a_frozen_replica_is_left_out_and_the_others_shape_the_steps(replicas):
    """A replica that takes connections and never answers (a stopped process, a node lost behind a kept-alive
    connection) costs the step it froze in its timeout, not the step: the chunk is asked of the other replica, and
    the timeout leaves the frozen one out of the steps after, as a refusal does."""
    frozen, a = replicas[1], replicas[0]
    with SetpoClient(f"{frozen.url},{a.url}", timeout=10.0, max_retries=0) as client:
        shaper = SetpoShaper(client, weight=0.3, step_timeout=300)
        assert shaper.score(GROUPS[:4]).metrics["setpo/requests"] == 2  # a chunk to each replica
        frozen.process.send_signal(signal.SIGSTOP)
        try:
            steps = [shaper.score(GROUPS[:4]) for _ in range(3)]
            left_out = frozen.url in client.replicas.left_out
        finally:
            frozen.process.send_signal(signal.SIGCONT)
    assert [step.metrics["setpo/fallback_steps"] for step in steps] == [0, 0, 0]
    assert [step.metrics["setpo/chunk_retries"] for step in steps] == [1, 0, 0] and left_out


@pytest.fixture
def dropped():
    """A host that drops connection attempts (partitioned, firewalled): a listener whose queue is full, so a
    connection to it waits out its connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filling = [socket.socket() for _ in range(4)]
    for sock in filling:
        sock.setblocking(False)
        sock.connect_ex(listener.getsockname())
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    for sock in [*filling, listener]:
        sock.close()


def test_a_replica_left_out_costs_no_step_its_readiness_check(replicas, dropped, monkeypatch):
    """A replica left out is asked /ready again (every RECHECK_S) off the calls' path: one on a host that drops
    connections, whose /ready hangs here for far longer than a step's deadline, must not hold a step."""
    monkeypatch.setattr(client_module, "PROBE_TIMEOUT_S", 600.0)
    with SetpoClient(f"{dropped},{replicas[0].url}", timeout=httpx.Timeout(10, connect=0.5)) as client:
        assert client.ready() and dropped in client.replicas.left_out
        shaper = SetpoShaper(client, weight=0.3, step_timeout=120)
        steps = []
        for _ in range(3):
            time.sleep(RECHECK_S)  # the trainer's own step: the replica left out is due again at each of ours
            steps.append(shaper.score(GROUPS[:4]))
    assert [step.metrics["setpo/fallback_steps"] for step in steps] == [0, 0, 0]


def test_the_async_client_reads_answers_fails_over_and_rechecks_replicas_as_the_sync_one(
    replicas, fake, dropped, monkeypatch
):
    """AsyncSetpoClient: an undecodable answer is off the contract, naming its replica, and the call asks the next
    replica at once (one that drops connections is tried again after a backoff, meanwhile the third answers); a
    replica left out is rechecked in a task of its own, so a call within a deadline far shorter than that /ready's
    wait is answered by another; close() with that recheck still pending cancels it."""
    monkeypatch.setattr(client_module, "PROBE_TIMEOUT_S", 600.0)
    liar, _ = fake(good_answer, headers=[("content-encoding", "gzip")])
    a = replicas[0].url

    async def calls() -> None:
        async with AsyncSetpoClient(liar, max_retries=0) as alone:
            with pytest.raises(SetpoAPIError, match="cannot be decoded") as failure:
                await alone.diversity([{"texts": GROUPS[0]}])
        assert failure.value.replica == liar
        client = AsyncSetpoClient(f"{liar},{dropped},{a}", timeout=httpx.Timeout(10, connect=0.5))
        try:
            answer = await client.diversity([{"texts": GROUPS[0]}])  # the liar first (in order), then the others
            assert len(answer.groups) == 1 and client.retries == 2
            assert await client.ready() and {liar, dropped} <= set(client.replicas.left_out)
            await asyncio.sleep(RECHECK_S)  # both due again
            answer = await client.diversity([{"texts": GROUPS[0]}], deadline=time.monotonic() + 120)
            assert len(answer.groups) == 1
        finally:
            await client.close()

    asyncio.run(calls())


def test_a_step_that_falls_back_reports_the_requests_it_made(replicas, fake):
    """setpo/requests (chunks answered) and setpo/chunk_retries count as the chunks go, so a step that falls back
    says what it did: one chunk answered, the other off the contract at both replicas (one retry), then the step."""
    answers = itertools.count()

    def first_only(body):  # whichever replica is asked first answers; every later answer is off the contract
        return good_answer(body) if next(answers) == 0 else nan_bonus(body)

    limits = {**httpx.get(replicas[0].url + "/info").json()["limits"], "max_groups": 2}
    (one, _), (two, _) = fake(first_only, limits=limits), fake(first_only, limits=limits)
    with SetpoClient(f"{one},{two}") as client:
        step = SetpoShaper(client, weight=0.3, in_flight=1).score(GROUPS[:4])
    assert step.metrics["setpo/fallback_steps"] == 1 and step.marginals is None
    assert step.metrics["setpo/requests"] == 1 and step.metrics["setpo/chunk_retries"] == 1


def huge_numbers(body):
    answer = good_answer(body)
    for group in answer["groups"]:
        group["marginals"] = [1e308] * len(group["marginals"])
        group["set_score"] = 1e308
    return answer


def other_weight(body):
    return {**good_answer(body), "weight": 0.05}


def scored_beyond_the_group(body):
    answer = good_answer(body)
    for group in answer["groups"]:
        group["scored"] = 1000
    return answer


def short_local_mass(body):
    answer = good_answer(body)
    for group in answer["groups"]:
        group["local_mass"] = group["local_mass"][:1]
    return answer


def numbers_as_strings(body):
    answer = good_answer(body)
    for group in answer["groups"]:
        group["marginals"] = [str(x) for x in group["marginals"]]
    return answer


def bonus_as_booleans(body):
    answer = good_answer(body)
    for group in answer["groups"]:
        group["bonus"] = [True] * len(group["bonus"])
    return answer


def other_model(body):
    return {**good_answer(body), "model": "another-model"}


@pytest.mark.parametrize(
    "answer",
    [
        huge_numbers,
        other_weight,
        scored_beyond_the_group,
        short_local_mass,
        numbers_as_strings,
        bonus_as_booleans,
    ],
)
def test_answers_that_do_not_fit_what_was_sent_cost_their_chunk_one_retry_elsewhere(replicas, serial, fake, answer):
    """Off the contract though every number is finite: numbers whose squares overflow (they would overflow the step's
    means), a weight other than the one sent, a group answered as having more members scored than it has, a
    per-member list of another length, numbers spelled as strings or booleans (JSON's own types are the contract's).
    Each is that replica's fault: its chunk is asked of the other."""
    liar, _ = fake(answer)
    with SetpoClient(f"{replicas[0].url},{liar}") as client:
        step = SetpoShaper(client, on_error="skip", **POLICY).score(GROUPS, rewards=REWARDS)
    same_step(step, serial)
    assert step.metrics["setpo/chunk_retries"] == 1 and step.metrics["setpo/requests"] == 2


def test_numbers_too_large_to_sum_from_the_only_replica_fall_back_under_skip_and_never_reach_the_trainer(fake):
    liar, _ = fake(huge_numbers)
    with SetpoClient(liar) as client:
        step = SetpoShaper(client, weight=0.3, on_error="skip").score(GROUPS)
    assert step.metrics["setpo/fallback_steps"] == 1 and step.marginals is None
    assert all(value == 0.0 for group in step.bonus for value in group)


def test_an_answer_off_the_contract_from_the_only_replica_still_fails_the_step(fake):
    liar, _ = fake(nan_bonus)
    with SetpoClient(liar) as client, pytest.raises(SetpoError, match="not a finite number in the answer's bonus"):
        SetpoShaper(client, weight=0.3, on_error="fail").score(GROUPS)


def test_a_replica_not_ready_is_left_out_until_it_answers_ready_again(replicas, fake, caplog):
    a = replicas[0]
    late, handler = fake(good_answer, ready=503)
    with SetpoClient(f"{late},{a.url}") as client:
        assert client.ready() and late in client.replicas.left_out  # one replica ready is enough; the other is left out
        before = served(a)
        for _ in range(3):
            client.diversity([{"texts": GROUPS[0]}])
        assert served(a) - before == 3  # none of them went to the replica left out
        handler.ready[0] = 200
        time.sleep(RECHECK_S)
        client.diversity([{"texts": GROUPS[0]}])  # asks its /ready again (in the background); answered by a

        def said() -> list[str]:
            return [record.getMessage() for record in caplog.records if late in record.getMessage()]

        # taken back, and said so: the recheck's thread logs the change just after making it (a flake under load)
        a.wait_until(
            lambda: late not in client.replicas.left_out and any("taken back" in line for line in said()), timeout=120
        )
    lines = said()
    assert len(lines) == 2 and "left out" in lines[0] and "taken back" in lines[1]  # each change said once


def test_info_is_the_strictest_of_the_replicas_and_refuses_a_mix_of_models(replicas, fake):
    a = replicas[0]
    real = httpx.get(a.url + "/info").json()
    smaller, _ = fake(limits={**real["limits"], "max_groups": 7, "max_request_rows": None}, truncate_chars=100)
    with SetpoClient(f"{a.url},{smaller}") as client:
        info = client.info()
    assert info.limits.max_groups == 7 and info.truncate_chars == 100
    assert info.limits.max_request_rows == real["limits"]["max_request_rows"]  # one replica does not say: the other
    assert info.limits.max_body_bytes == real["limits"]["max_body_bytes"]
    for changed in ({"model": "another-model"}, {"shape": "neg_linear"}, {"truncation_side": "left"}):
        other, _ = fake(**changed)  # each scores the same texts differently: a step's chunks would not compare
        with SetpoClient(f"{a.url},{other}") as client, pytest.raises(SetpoError, match="different models"):
            client.info()
    assert strictest([info]) == info


def test_a_replica_whose_contract_is_not_a_version_number_is_left_out_and_alone_refused_clearly(replicas, fake):
    odd, _ = fake(contract="1.1-rc1")
    with SetpoClient(f"{odd},{replicas[0].url}") as client:
        assert client.info().contract == "1.1"  # the other replica's: the odd one is read as off the contract
        assert SetpoShaper(client, weight=0.3).check().contract == "1.1"
    with SetpoClient(odd) as client, pytest.raises(SetpoError, match="contract"):
        SetpoShaper(client, weight=0.3).check()


def test_a_replica_taken_back_is_asked_its_info_before_a_step_sends_it_chunks(replicas, fake, caplog):
    """A replica left out may come back redeployed. The next step asks /info again, so one back with tighter limits
    has its chunks cut to them (the fake answers chunks over its max_groups off the contract, as a real one would
    refuse them: no chunk retried), and one back serving another model makes the step refuse the mix, said, rather
    than score its chunks in two spaces."""
    a = replicas[0]
    limits = {**httpx.get(a.url + "/info").json()["limits"], "max_groups": 2}

    def within_its_limits(body):
        return good_answer(body) if len(body["groups"]) <= 2 else nan_bonus(body)

    tighter, tighter_handler = fake(within_its_limits, ready=503, limits=limits)
    other, other_handler = fake(other_model, ready=503, model="another-model")
    for late, handler, changed in ((tighter, tighter_handler, "limits"), (other, other_handler, "model")):
        with SetpoClient(f"{a.url},{late}") as client:
            shaper = SetpoShaper(client, **POLICY)
            assert shaper.check().limits.max_groups > 2 and late in client.replicas.left_out  # /info of `a` alone
            before = shaper.score(GROUPS[:8], rewards=REWARDS[:8])
            assert before.metrics["setpo/requests"] == 2 and before.metrics["setpo/fallback_steps"] == 0
            handler.ready[0] = 200
            assert client.ready() and late not in client.replicas.left_out  # taken back
            after = shaper.score(GROUPS[:8], rewards=REWARDS[:8])
        if changed == "limits":
            assert after.metrics["setpo/fallback_steps"] == 0 and after.metrics["setpo/chunk_retries"] == 0
            assert after.metrics["setpo/requests"] == 4  # 8 groups, 2 a request
        else:
            assert after.metrics["setpo/fallback_steps"] == 1 and after.marginals is None
            assert any("different models" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_one_step_is_never_scored_by_two_models(replicas, fake, caplog, on_error):
    """A replica whose /info says the step's model but whose answers name another (one taken back mid-step,
    redeployed): its chunk's marginals would sit beside the other's from another space. The step fails as a step,
    said; which of the two is right is not the client's to guess."""
    other, _ = fake(other_model)
    with SetpoClient(f"{replicas[0].url},{other}") as client:
        shaper = SetpoShaper(client, on_error=on_error, **POLICY)
        if on_error == "fail":
            with pytest.raises(SetpoError, match="scored by different models"):
                shaper.score(GROUPS, rewards=REWARDS)
            return
        step = shaper.score(GROUPS, rewards=REWARDS)
    assert step.metrics["setpo/fallback_steps"] == 1 and step.marginals is None
    assert any("different models" in record.getMessage() for record in caplog.records)

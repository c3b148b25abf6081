"""SetpoShaper's diversity policy (contract v1.1) against the real app in-process: scope, keys, kernels,
normalisation and the weight controller; and what it does with a service that cannot follow."""

import itertools
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from setpo_client import SetpoClient, SetpoError
from setpo_client.keys import countdown_expression
from setpo_client.policy import diversity_policy, keeps_groups
from setpo_client.shaping import SetpoShaper
from setpo_client.weight import WeightController


def answer(expression: str, plan: str = "plan") -> str:
    return f"{plan} : <answer> {expression} </answer>"


# numbers 2 3 5 8, target 16; rewards as the Countdown scorer gives them
GROUPS = [
    [answer("(3+5)*2"), answer("2*(5+3)", "other plan"), answer("2*8"), answer("8*3-8"), answer("(5-2)*8"), "plan :"],
    [answer("2*8"), answer("8*2"), answer("9+7"), answer("3*5")],  # two correct members only
    [answer("(3+5)*2"), answer("2*8"), answer("8*3-8")],
]
REWARDS = [[1.0, 1.0, 1.0, 1.0, 0.1, 0.0], [1.0, 1.0, 0.1, 0.1], [1.0, 1.0, 1.0]]
ADVANTAGES = [[r - sum(g) / len(g) for r in g] for g in REWARDS]  # Dr. GRPO's r - mean(r)


def test_the_step_gets_exactly_the_services_bonus_for_the_policy(inprocess):
    shaper = SetpoShaper(
        inprocess, weight=0.3, min_reward=1.0, key=countdown_expression, kernel="hybrid", normalize="zscore"
    )
    step = shaper.score(GROUPS, rewards=REWARDS, advantages=ADVANTAGES)
    direct = inprocess.diversity(
        [
            {"texts": GROUPS[i], "rewards": REWARDS[i], "keys": [countdown_expression(t) for t in GROUPS[i]]}
            for i in (0, 2)
        ],
        weight=0.3,
        min_reward=1.0,
        kernel="hybrid",
        normalize="zscore",
    )
    assert step.bonus[0] == direct.groups[0].bonus and step.bonus[2] == direct.groups[1].bonus
    assert step.bonus[1] == [0.0] * 4  # two members reach min_reward: no request, no bonus
    assert step.bonus[0][4] == step.bonus[0][5] == 0.0  # the wrong and the unfinished answer earn nothing
    assert step.bonus[0][0] < 0 and step.bonus[0][2] > 0  # a respelt solution is pushed down, a new one up
    metrics = step.metrics
    assert metrics["setpo/small_scope_groups"] == 1 and metrics["setpo/scored_groups"] == 2
    assert metrics["setpo/scored_share"] == pytest.approx(7 / 13) and metrics["setpo/weight"] == 0.3
    flat_bonus = [b for g in step.bonus for b in g]
    flat_advantage = [a for g in ADVANTAGES for a in g]
    rms = lambda values: math.sqrt(sum(v * v for v in values) / len(values))  # noqa: E731
    assert metrics["setpo/bonus_rms"] == pytest.approx(rms(flat_bonus))
    assert metrics["setpo/bonus_ratio"] == pytest.approx(rms(flat_bonus) / rms(flat_advantage))


def test_the_key_kernel_sends_keys_alone_and_keys_given_by_the_caller_win(inprocess):
    shaper = SetpoShaper(inprocess, weight=1.0, kernel="key", normalize="zscore")
    keys = [["A", "A", "B", "C", None, None], ["x"] * 4, ["A", "B", "C"]]
    step = shaper.score(GROUPS, keys=keys)
    assert step.bonus[0][0] == step.bonus[0][1] < step.bonus[0][2]
    assert step.bonus[2] == [0.0, 0.0, 0.0]  # all distinct: nothing to tell apart
    with pytest.raises(SetpoError, match="needs solution keys"):  # no key function and no keys
        SetpoShaper(inprocess, weight=1.0, kernel="key", on_error="fail").score(GROUPS)


def test_a_key_function_that_raises_falls_back_under_skip(inprocess):
    def broken(text: str) -> str:
        raise RuntimeError("the tokenizer changed")

    shaper = SetpoShaper(inprocess, weight=1.0, kernel="hybrid", key=broken)
    step = shaper.score(GROUPS)
    assert step.marginals is None and step.metrics["setpo/weight"] == 0 and shaper.fallback_steps == 1


def test_min_reward_without_rewards_is_a_programming_error(inprocess):
    with pytest.raises(ValueError, match="rewards"):
        SetpoShaper(inprocess, weight=1.0, min_reward=1.0).score(GROUPS)


def test_the_controller_steers_the_bonus_to_the_target_ratio_and_logs_the_weight_it_applied(inprocess):
    controller = WeightController(target_ratio=0.25, ema=0.5, min_weight=0.01, max_weight=5.0)
    shaper = SetpoShaper(
        inprocess,
        weight=0.05,
        min_reward=1.0,
        key=countdown_expression,
        kernel="hybrid",
        normalize="zscore",
        controller=controller,
    )
    ratios, weights = [], []
    for _ in range(12):  # the same data every step: the ratio is linear in lambda
        step = shaper.score(GROUPS, rewards=REWARDS, advantages=ADVANTAGES)
        ratios.append(step.metrics["setpo/bonus_ratio"])
        weights.append(step.metrics["setpo/weight"])
    assert weights[0] == 0.05 and ratios[0] < 0.1
    assert ratios[-1] == pytest.approx(0.25, rel=0.01)
    assert all(b >= a for a, b in itertools.pairwise(weights))  # from below, monotone with this EMA


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weight": float("nan")}, "weight"),
        ({"weight": float("inf")}, "weight"),
        ({"weight": 0.1, "kernel": "cosine"}, "kernel"),
        ({"weight": 0.1, "normalize": "rank"}, "normalize"),
        ({"weight": 0.1, "min_reward": float("nan")}, "min_reward"),
    ],
)
def test_bad_policy_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SetpoShaper(SetpoClient(), **kwargs)


def test_a_controller_cannot_steer_a_weight_of_zero():  # it would raise lambda to min_weight: SetPO on
    with pytest.raises(ValueError, match="first step's lambda: it must be > 0"):
        SetpoShaper(SetpoClient(), weight=0.0, controller=WeightController(target_ratio=0.3))


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"kernel": "hybrid"}, r"--s.kernel=hybrid compares solution keys: give --s.key"),
        ({"key": "countdown_expression"}, r"--s.key is used by --s.kernel=hybrid or key only"),
        ({"kernel": "key", "key": "countdown"}, r"--s.key countdown: .*'countdown'"),
        ({"kernel": "cosine"}, r"--s.kernel must be one of embedding, hybrid, key"),
        ({"normalize": "rank"}, r"--s.normalize must be one of none, zscore"),
        ({"min_reward": float("nan")}, r"--s.min_reward must be a finite number"),
        (
            {"min_weight": 0.1, "freeze_after": 3},
            r"--s.min_weight, --s.freeze_after steer lambda: they need --s.target_ratio",
        ),
        ({"target_ratio": 0.3, "weight": 0.0}, r"--s.target_ratio steers lambda from --s.weight"),
        (
            {"target_ratio": 0.3, "weight": 0.1, "min_weight": 2.0, "max_weight": 1.0},
            r"--s.min_weight 2.0 is above --s.max_weight 1.0",
        ),
        ({"target_ratio": 0.3, "weight": 0.1, "weight_ema": 1.0}, r"--s.weight_ema must be in \[0, 1\)"),
        ({"target_ratio": -1.0, "weight": 0.1}, r"--s.target_ratio and its bounds: target_ratio must be"),
    ],
)
def test_every_plug_in_s_policy_is_checked_in_one_place_naming_the_setting_as_its_user_spells_it(settings, match):
    with pytest.raises(ValueError, match=match):
        diversity_policy(settings, spell=lambda name: f"--s.{name}")


@pytest.mark.parametrize(
    "advantage,combine,kept",
    [
        ("framework", "add", True),  # lambda * s_i alone: the bonus is the push
        ("maxrl", "reshare", False),  # all correct: 0 each, nothing to re-share
        ("framework", "reshare", False),
        ("w_reinforce", "reshare", True),  # all correct: +positive_weight each, re-shared by the bonus
    ],
)
def test_keep_groups_is_on_by_default_with_a_scope_where_equal_rewards_have_a_push(advantage, combine, kept):
    """One rule for every plug-in (veRL's keep_groups, setpo-train's --setpo.keep_groups, would_shape): DAPO's filter
    keeps a group of equal rewards for its bonus only where the combined advantage gives such a group a push."""
    assert keeps_groups(None, 1.0, advantage, combine) is kept
    assert keeps_groups(None, None, advantage, combine) is False  # no scope: DAPO's filter as it is
    assert keeps_groups(False, 1.0, advantage, combine) is False
    if kept:
        assert keeps_groups(True, 1.0, advantage, combine) is True
    else:
        with pytest.raises(
            ValueError, match=rf"--s.keep_groups keeps .* --s.combine=reshare .*--s.advantage={advantage}"
        ):
            keeps_groups(True, 1.0, advantage, combine, spell=lambda name: f"--s.{name}")


def test_a_policy_from_settings_is_what_the_shaper_takes():
    settings = {
        "weight": 0.1,
        "min_reward": 1.0,
        "key": "countdown_expression",
        "kernel": "hybrid",
        "target_ratio": 0.3,
    }
    policy = diversity_policy({**settings, "warmup_steps": 4, "weight_ema": 0.5})
    assert policy["key"] is countdown_expression and policy["kernel"] == "hybrid" and policy["normalize"] == "none"
    assert (policy["controller"].target_ratio, policy["controller"].warmup_steps, policy["controller"].ema) == (
        0.3,
        4,
        0.5,
    )
    assert diversity_policy({}) == {
        "min_reward": None,
        "key": None,
        "kernel": "embedding",
        "normalize": "none",
        "embed_span": None,
        "controller": None,
        "advantage": "framework",
        "positive_weight": 0.1,
        "combine": "add",
    }
    SetpoShaper(SetpoClient(), 0.1, **policy)  # taken as it is


ANSWER_SPAN = r"<answer>(.*?)</answer>"


def test_embed_span_sends_each_texts_last_match_and_the_bonus_is_the_services_for_those_spans(inprocess):
    """The service embeds what embed_span picks (the last match's group, stripped): the step's bonus is exactly the
    service's bonus for the spans sent as texts; keys still come from the whole text; a text without a match is
    sent whole and counted."""
    groups = [[*GROUPS[0][:5], "plan : no answer yet"], GROUPS[2]]
    rewards = [[1.0, 1.0, 1.0, 1.0, 0.1, 0.0], [1.0, 1.0, 1.0]]
    shaper = SetpoShaper(inprocess, weight=0.3, min_reward=1.0, normalize="zscore", embed_span=ANSWER_SPAN)
    step = shaper.score(groups, rewards=rewards)
    spans = [["(3+5)*2", "2*(5+3)", "2*8", "8*3-8", "(5-2)*8", "plan : no answer yet"], ["(3+5)*2", "2*8", "8*3-8"]]
    direct = inprocess.diversity(
        [{"texts": s, "rewards": r} for s, r in zip(spans, rewards)], weight=0.3, min_reward=1.0, normalize="zscore"
    )
    assert step.bonus == [group.bonus for group in direct.groups]
    whole = SetpoShaper(inprocess, weight=0.3, min_reward=1.0, normalize="zscore").score(groups, rewards=rewards)
    assert whole.bonus != step.bonus  # the plan words no longer reach the embedder
    assert step.metrics["setpo/span_missing"] == 1.0 and "setpo/span_missing" not in whole.metrics

    keyed = SetpoShaper(
        inprocess, 0.3, min_reward=1.0, key=countdown_expression, kernel="hybrid", embed_span=r"<answer>.*?</answer>"
    )
    sent = keyed.payloads(groups, [list(range(6)), [0, 1, 2]], rewards, None, {"span_missing": 0})
    assert sent[0][1]["texts"][0] == "<answer> (3+5)*2 </answer>"  # no group: the whole match
    assert sent[0][1]["keys"][:2] == [countdown_expression(GROUPS[0][0])] * 2  # keys from the whole text


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"embed_span": "(<answer>"}, r"--s.embed_span '\(<answer>' is not a regular expression"),
        ({"embed_span": "(a)(b)"}, r"has 2 groups: give at most one"),
        (
            {"embed_span": ANSWER_SPAN, "kernel": "key", "key": "countdown_expression"},
            r"--s.embed_span chooses what is embedded; --s.kernel=key embeds nothing",
        ),
    ],
)
def test_embed_span_is_refused_where_it_cannot_apply(settings, match):
    with pytest.raises(ValueError, match=match):
        diversity_policy(settings, spell=lambda name: f"--s.{name}")
    others = diversity_policy({name: value for name, value in settings.items() if name != "embed_span"})
    with pytest.raises(ValueError, match=match.replace("--s.", "")):  # SetpoShaper checks it as well
        SetpoShaper(SetpoClient(), 0.1, **{**others, "embed_span": settings["embed_span"]})


def test_embed_span_with_embedding_vectors_is_a_failed_step_not_a_silently_unused_setting(inprocess):
    vectors = [[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]]
    with pytest.raises(SetpoError, match="embed_span chooses what of a text is embedded; this step sent embedding"):
        SetpoShaper(inprocess, 0.1, on_error="fail", embed_span=ANSWER_SPAN).score(vectors)


class FakeService(BaseHTTPRequestHandler):
    """/ready, /info of a given contract, and a /v1/diversity answer that drops the last group, or, given `broken`
    (field, value), answers every group whole with that field (a group's, or the top-level `weight`) set to value."""

    contract: str | None = "1.1"
    info: ClassVar[dict] = {}  # the real app's /info
    broken: tuple[str, float] | None = None

    def do_GET(self):
        if self.path == "/ready":
            return self.reply({"status": "ready"})
        info = dict(self.info)
        if self.contract is None:
            info.pop("contract")
        self.reply(info)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        groups = [
            {
                "marginals": [0.0] * len(g["texts"]),
                "local_mass": [0.0] * len(g["texts"]),
                "set_score": 0.0,
                "saturation": 0.0,
                "scored": len(g["texts"]),
                "bonus": [0.0] * len(g["texts"]),
                "advantages": [0.0] * len(g["texts"]),
            }
            for g in (body["groups"] if self.broken else body["groups"][:-1])
        ]
        usage = {"texts": 0, "unique_texts": 0, "tokens": 0, "truncated": 0}
        answer = {"model": "m", "groups": groups, "usage": usage, "weight": body.get("weight")}
        if self.broken is not None:
            field, value = self.broken
            for group in [] if field == "weight" else groups:
                group[field] = [value] * len(group[field]) if isinstance(group[field], list) else value
            if field == "weight":
                answer["weight"] = value
        self.reply(answer)

    def reply(self, payload):
        data = json.dumps(payload).encode()  # NaN and Infinity as Python writes them: what a careless server sends
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake(inprocess):
    info = inprocess.info().model_dump()

    def serve(contract, broken=None):
        handler = type("Handler", (FakeService,), {"contract": contract, "info": info, "broken": broken})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return SetpoClient(f"http://127.0.0.1:{server.server_port}", max_retries=0)

    servers: list[ThreadingHTTPServer] = []
    yield serve
    for server in servers:
        server.shutdown()


def test_a_service_of_contract_v1_is_refused_at_start_with_what_to_do(fake):
    with pytest.raises(SetpoError, match="upgrade setpo-server"):
        SetpoShaper(fake(None), weight=0.1).check(ready_timeout=5)


def test_an_answer_with_fewer_groups_than_sent_is_a_failed_step_not_a_silent_truncation(fake):
    client = fake("1.1")
    shaper = SetpoShaper(client, weight=0.1)
    step = shaper.score([["a", "b", "c"], ["d", "e", "f"]])
    assert step.marginals is None and shaper.fallback_steps == 1 and step.metrics["setpo/weight"] == 0
    with pytest.raises(SetpoError, match="off the contract"):
        SetpoShaper(client, weight=0.1, on_error="fail").score([["a", "b", "c"], ["d", "e", "f"]])


ANSWERED = ["bonus", "marginals", "local_mass", "set_score", "saturation", "advantages", "weight"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("field", ANSWERED)
def test_a_non_finite_number_in_the_answer_is_an_off_contract_step_under_skip_and_one_error_under_fail(
    fake, field, value, caplog
):
    """A service (or proxy) answering NaN or Infinity in any number the shaper reads: under skip the step trains
    with lambda = 0, counted and logged; under fail one SetpoError naming the field. Never a crash in the metrics."""
    client = fake("1.1", (field, value))
    groups, rewards = [["a", "b", "c", "d"]], [[1.0, 0.0, 1.0, 1.0]]
    shaper = SetpoShaper(client, weight=0.1)
    step = shaper.score(groups, rewards=rewards, advantages=[[0.25, -0.75, 0.25, 0.25]])
    assert step.bonus == [[0.0] * 4] and step.marginals is None and shaper.fallback_steps == 1
    assert step.metrics["setpo/weight"] == 0 and step.metrics["setpo/fallback_steps"] == 1
    assert all(math.isfinite(v) for v in step.metrics.values())
    assert f"not a finite number in the answer's {field}" in caplog.text
    with pytest.raises(SetpoError, match=f"off the contract: not a finite number in the answer's {field}"):
        SetpoShaper(client, weight=0.1, on_error="fail").score(groups, rewards=rewards)

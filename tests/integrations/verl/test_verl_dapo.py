"""DAPO's dynamic sampling (algorithm.filter_groups) under SetPO's scoped form (issue 41, item 2): veRL's real
v1 ReplayBuffer over a real local TransferQueue drops every group whose rewards are all equal before the advantage
step; with min_reward the plug-in keeps the all-correct groups whose shaped advantages still differ."""

import types
from collections import Counter

import pytest
import verl  # noqa: F401  (loads the plug-in)
from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from setpo_client import SetpoClient
from setpo_client.integrations.verl.start import check_start
from setpo_client.shaping import SetpoShaper

from . import test_verl_v1
from .test_verl_start import setpo, verl_config
from .test_verl_v1 import advantages_per_row, put_rollouts

transfer_queue, tokenizer = test_verl_v1.transfer_queue, test_verl_v1.tokenizer  # its fixtures, for this module too

WEIGHT = 0.3
MIXED = (["48 / 2 = 24, so 72", "1.5 * 48 = 72", "it is 74"], [1.0, 1.0, 0.0])
DISTINCT = (["48 / 2 = 24, so 72", "1.5 * 48 = 72", "a = 48, a + a/2 = 72"], [1.0, 1.0, 1.0])  # all correct
SAME = (["48 / 2 = 24, so 72"] * 3, [1.0, 1.0, 1.0])  # all correct, one answer three times: no bonus to give
WRONG = (["five", "2 + 3 = 5", "it is 5"], [0.0, 0.0, 0.0])
STEP = {"mixed": MIXED, "distinct": DISTINCT, "same": SAME, "wrong": WRONG}


@pytest.fixture
def train(transfer_queue):
    """The "train" partition, empty before and after each test (veRL's sampler reads the whole partition)."""

    def clear():
        keys = list(transfer_queue.kv_list("train").get("train", {}))
        if keys:
            transfer_queue.kv_clear(keys=keys, partition_id="train")

    clear()
    yield transfer_queue
    clear()


def put_groups(tq, tokenizer, groups: dict, global_steps: int = 1):
    """Finished groups as veRL's agent loop and trainer leave them: rows {uid}_{session}_0, and a prompt key per uid."""
    rows = [
        (uid, s, 0, text, reward)
        for uid, (texts, rewards) in groups.items()
        for s, (text, reward) in enumerate(zip(texts, rewards))
    ]
    put_rollouts(tq, tokenizer, "train", rows)
    tags = [{"is_prompt": True, "status": "finished", "global_steps": global_steps} for _ in groups]
    tq.kv_batch_put(keys=list(groups), partition_id="train", tags=tags)


def v1_trainer(tq, tokenizer, mode: str = "sync", **settings):
    """What veRL's v1 trainer holds when it samples and takes the advantage step: its config, its tokenizer and the
    replay buffer its own _build_replay_buffer makes, DAPO's filter on. Its refill puts fresh mixed groups, as
    generation would, and records how many prompts it was asked for."""
    algorithm = {
        "adv_estimator": "grpo",
        "gamma": 1.0,
        "lam": 1.0,
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
        "filter_groups": {"enable": True, "metric": "reward", "max_num_gen_batches": 0, "max_inflight_gen_batches": 1},
    }
    if settings:
        algorithm["setpo"] = settings
    sampler = {"max_off_policy_threshold": None, "max_off_policy_strategy": "drop", "sampler_kwargs": {}}
    config = OmegaConf.create(
        {
            "algorithm": algorithm,
            "actor_rollout_ref": {"rollout": {"n": 3}},
            "trainer": {"v1": {"trainer_mode": mode, "sampler": sampler}},
            "data": {"train_batch_size": 2},
            "reward": {"reward_model": {"enable": False}},
        }
    )
    refills: list[int] = []

    def refill(n: int) -> int:
        refills.append(n)
        put_groups(tq, tokenizer, {f"fresh{len(refills)}x{i}": MIXED for i in range(n)}, global_steps=2)
        return n

    owner = types.SimpleNamespace(
        config=config, tokenizer=tokenizer, trainer_mode=mode, _add_prompts_to_generate=refill
    )
    owner._resolve_filter_groups_metric = types.MethodType(PPOTrainer._resolve_filter_groups_metric, owner)
    owner.replay_buffer = PPOTrainer._build_replay_buffer(owner)
    return owner, refills


def test_an_all_correct_group_of_different_answers_is_kept_and_trained_on_its_bonus(train, tokenizer, server, client):
    owner, refills = v1_trainer(
        train, tokenizer, enable=True, url=server.url, weight=WEIGHT, min_reward=1.0, normalize="zscore"
    )
    put_groups(train, tokenizer, STEP)
    meta, sampled = owner.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)

    assert {key.split("_")[0] for key in meta.keys} == {"mixed", "distinct"}  # the bonus kept it: no regeneration
    assert refills == []
    assert sampled["training/filter_groups/evicted_samples"] == 2  # one answer three times, and all wrong: as veRL
    assert sampled["_dapo_filtered_reward_counts"] == {1.0: 1, 0.0: 1}

    metrics: dict = {}
    PPOTrainer._compute_advantage(owner, meta, metrics=metrics)
    shaped = dict(zip(meta.keys, advantages_per_row(train, meta.keys, "train")))
    groups = [{"texts": texts, "rewards": rewards} for texts, rewards in (DISTINCT, MIXED)]
    distinct, mixed = client.diversity(groups, weight=WEIGHT, min_reward=1.0, normalize="zscore").groups
    kept = [shaped[f"distinct_{s}_0"] for s in range(3)]
    assert kept == pytest.approx(distinct.bonus, abs=1e-6)  # GRPO's advantage 0 plus lambda * zscore(s)
    assert sum(kept) == pytest.approx(0.0, abs=1e-5) and min(map(abs, kept)) > 0.01
    assert mixed.bonus == [0.0, 0.0, 0.0] and shaped["mixed_2_0"] < 0 < shaped["mixed_0_0"]  # 2 correct: GRPO's only
    assert metrics["setpo/kept_by_bonus"] == 1

    metrics = {}
    PPOTrainer._compute_advantage(owner, meta, metrics=metrics)
    assert metrics["setpo/kept_by_bonus"] == 0  # counted once: the step that kept it


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"min_reward": 1.0, "keep_groups": False},
        {"enable": True},
        # re-sharing moves a positive push, which GRPO gives a group of equal rewards none of: nothing to keep
        {"min_reward": 1.0, "normalize": "zscore", "combine": "reshare"},
    ],
    ids=["setpo-off", "keep_groups-false", "paper-form", "reshare"],
)
def test_without_keep_groups_verls_filter_is_unchanged(train, tokenizer, server, settings):
    if settings:
        settings = {"enable": True, "url": server.url, "weight": WEIGHT, **settings}
    owner, refills = v1_trainer(train, tokenizer, **settings)
    put_groups(train, tokenizer, STEP)
    meta, sampled = owner.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)

    assert sampled["training/filter_groups/evicted_samples"] == 3  # every group whose rewards are all equal
    assert sampled["_dapo_filtered_reward_counts"] == {1.0: 2, 0.0: 1}
    assert refills == [2]  # veRL regenerates in their place (2 x 3 evicted, 2 prompts in flight at most)
    uids = [key.split("_")[0] for key in meta.keys]
    assert uids[0] == "mixed" and uids[-1].startswith("fresh") and "distinct" not in uids


def test_veRLs_async_sampler_keeps_the_group_and_its_polls_decide_each_group_once(
    train, tokenizer, server, monkeypatch
):
    owner, _ = v1_trainer(train, tokenizer, "colocate_async", enable=True, url=server.url, min_reward=1.0)
    put_groups(train, tokenizer, STEP)
    reads = []
    real_get = train.kv_batch_get
    monkeypatch.setattr(train, "kv_batch_get", lambda *args, **kwargs: reads.append(1) or real_get(*args, **kwargs))

    assert owner.replay_buffer.get_sampleable_count(1, "train") == 2  # mixed, and distinct kept; nothing evicted
    first = len(reads)
    assert owner.replay_buffer.get_sampleable_count(1, "train") == 2
    assert len(reads) == first  # veRL's and the plug-in's decisions are both remembered across polls
    meta, sampled = owner.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert {key.split("_")[0] for key in meta.keys} == {"mixed", "distinct"}
    assert sampled["training/filter_groups/evicted_samples"] == 2


@pytest.mark.parametrize(
    "kernel,key,texts,kept",
    [
        ("embedding", None, ["a", "b", "c"], True),
        ("embedding", None, ["a", "a", "a"], False),
        ("embedding", None, ["a", "a", "b"], True),  # the duplicated answer is worth less than the lone one
        ("embedding", None, ["a", "a", "b", "b"], False),  # two answers twice each: symmetric, equal marginals
        ("key", str.strip, ["a", "b", "c"], False),  # all different solutions: the key kernel sees no difference
        ("key", str.strip, ["a", " a", "b"], True),
        ("key", str.strip, ["a", " a", "b", "b "], False),
        ("hybrid", lambda text: "72", ["a", "b", "c"], False),  # one solution, however spelt
        ("hybrid", lambda text: None, ["a", "b", "c"], True),
    ],
)
def test_would_shape_says_whether_the_bonus_would_set_the_members_apart(kernel, key, texts, kept):
    from setpo_client.shaping import would_shape

    shaper = SetpoShaper(
        SetpoClient("http://127.0.0.1:9"), WEIGHT, kernel=kernel, key=key, min_reward=1.0, normalize="zscore"
    )
    assert would_shape(shaper, texts, [1.0] * len(texts)) is kept
    assert would_shape(shaper, [*texts, "x"], [*[1.0] * len(texts), 0.0]) is kept  # out of scope: not compared
    assert not would_shape(shaper, texts, [0.0] * len(texts))  # none in scope
    assert not would_shape(shaper, [*texts[:2], None], [1.0] * 3)  # fewer than 3 scorable
    # re-sharing moves a positive push, which equal rewards have under w_reinforce alone
    for advantage, pushes in (("framework", False), ("maxrl", False), ("w_reinforce", True)):
        shaper = SetpoShaper(
            SetpoClient("http://127.0.0.1:9"), WEIGHT, kernel=kernel, key=key, min_reward=1.0, normalize="zscore",
            combine="reshare", advantage=advantage,
        )  # fmt: skip
        assert would_shape(shaper, texts, [1.0] * len(texts)) is (kept and pushes)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["+algorithm.setpo.keep_groups=maybe"], r"\+algorithm\.setpo\.keep_groups must be true or false"),
        (
            [
                "+algorithm.setpo.keep_groups=true",
                "+algorithm.setpo.combine=reshare",
                "+algorithm.setpo.normalize=zscore",
            ],
            r"\+algorithm\.setpo\.keep_groups keeps .* \+algorithm\.setpo\.combine=reshare .*\.advantage=framework",
        ),
    ],
    ids=["not-a-bool", "reshare-with-nothing-to-reshare"],
)
def test_a_keep_groups_that_would_not_do_what_it_says_is_refused(server, overrides, match):
    config = verl_config(*setpo(server.url, *overrides))
    with pytest.raises(ValueError, match=match):
        check_start(config, get_trainer_cls("sync"))


def test_a_verl_whose_dapo_filter_is_not_the_plug_ins_is_refused_at_start(server, monkeypatch):
    monkeypatch.setattr(ReplayBuffer, "_dapo_filtered_keys", lambda self, partition_id: (set(), Counter()))
    with pytest.raises(RuntimeError, match=r"ReplayBuffer._dapo_filtered_keys"):
        get_trainer_cls("sync")(config=verl_config(*setpo(server.url)))

"""SetPO off OpenRLHF's critical path: SetpoExperienceMaker submits the step's scoring in make_experience, before
OpenRLHF's forward passes (here the actor's and reference's log-prob passes by OpenRLHF's own Actor on the tiny
model, on CPU; a reward model's rewards where a test needs one), and collects the answer at the advantage step,
through the real service. OpenRLHF's make_experience_batch runs whole; only its GPU actor groups and the Ray
object store they answer through stand in (rollouts.ModelGroup). The shaped advantages are the synchronous
path's; experiences that changed in between are scored again, never given the answer computed for the others;
no step thread outlives its step."""

import copy
import threading
from concurrent.futures import wait

import pytest
import torch
from openrlhf.trainer.ppo_utils import experience_maker as openrlhf_maker

from tests.trainer.rollouts import (
    KINDS,
    RAY_STAND_IN,
    SETTINGS,
    ModelGroup,
    log_prob_pass,
    makers,
    recording_client,
    rollout_samples,
)

SCOPED_KINDS = ["right", "mixed", "right", "wrong"]  # groups with >= 3 correct responses: --setpo.min_reward acts


@pytest.fixture(scope="module")
def passes(tiny_model):
    """The actor's and the reference's log-prob passes, loaded once."""
    return log_prob_pass(tiny_model), log_prob_pass(tiny_model, temperature=1.5)


@pytest.fixture(autouse=True)
def ray_in_this_process(monkeypatch):
    monkeypatch.setattr(openrlhf_maker, "ray", RAY_STAND_IN)


def with_passes(maker, passes, before=lambda: None):
    actor, reference = passes
    maker.actor_model_group = ModelGroup(actor, before)
    maker.initial_model_group = ModelGroup(reference)
    return maker


def synchronous(maker, experiences) -> tuple[list, list[dict]]:
    """The advantage step of a maker that submitted nothing early (the path before SetPO left the critical path):
    the shaped experiences and what it sent."""
    maker.setpo.client, wire = recording_client(maker.setpo.client.base_url)
    return maker.compute_advantages_and_returns(experiences), wire.sent


def openrlhfs_passes(openrlhf, passes, samples) -> list:
    """OpenRLHF's own maker, without SetPO: the samples split and through the same passes."""
    return with_passes(openrlhf, passes).make_experience(openrlhf.split_rollout_samples(copy.deepcopy(samples)))


def assert_same_advantages(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    for mine, other in zip(ours, theirs):
        assert mine.index == other.index
        assert torch.equal(mine.advantages, other.advantages) and torch.equal(mine.returns, other.returns)


def logged(experiences: list, name: str) -> float:
    return experiences[0].info[name][0].item()


def assert_no_step_thread_alive() -> None:
    for thread in threading.enumerate():  # an executor thread that finished its work exits at once
        if thread.name.startswith("setpo-step"):
            thread.join(timeout=10)
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("setpo-step")]


@pytest.mark.parametrize(
    "flags, kinds",
    [
        (SETTINGS["grpo"], KINDS),  # KL in the reward: the reference's pass matters
        ([*SETTINGS["dapo"], "--setpo.min_reward", "1.0"], SCOPED_KINDS),  # the overlong penalty moves the scope
    ],
    ids=["grpo", "dapo-scoped"],
)
def test_the_scoring_runs_during_openrlhfs_passes_and_shapes_as_the_synchronous_path(
    flags, kinds, tiny_model, server, passes, problems
):
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *flags)
    setpo.setpo.client, wire = recording_client(server.url)
    at_the_passes = []

    def passes_longer_than_setpo():  # as on a GPU cluster: the answer is in before the passes end
        at_the_passes.append(setpo.setpo.pending)
        wait([setpo.setpo.pending.work])

    samples = rollout_samples(strategy, tokenizer, problems, kinds)
    shaped = with_passes(setpo, passes, passes_longer_than_setpo).make_experience_batch(copy.deepcopy(samples))
    _, sync, _, _ = makers(tiny_model, server.url, *flags)
    expected, sent = synchronous(sync, openrlhfs_passes(openrlhf, passes, samples))

    [pending] = at_the_passes  # submitted before OpenRLHF's first pass, its requests on their own thread
    assert pending is not None and pending.work is not None
    assert wire.sent == sent and len(sent) == 1  # the same one request: collected, not scored again
    assert_same_advantages(shaped, expected)
    assert logged(expected, "setpo/active") == 1 and logged(shaped, "setpo/active") == 1
    # what was sent early is the rewards OpenRLHF's advantage step used: after the overlong penalty
    rewards = {index: reward for e in shaped for index, reward in zip(e.index, e.rewards.tolist())}
    groups = [[rewards[4 * g + j] for j in range(4)] for g in range(4)]
    assert all(group["rewards"] in groups for group in wire.sent[0]["groups"])  # small scopes are not sent
    if "--reward.overlong_buffer_len" in flags:  # the penalty moved a correct response out of the scope it was sent in
        assert any(0 < reward < 1 for group in wire.sent[0]["groups"] for reward in group["rewards"])
    # the requests ran while OpenRLHF worked: the trainer blocked for the decoding and the bookkeeping only
    assert logged(shaped, "setpo/wait_s") < logged(shaped, "setpo/time_s")
    assert logged(shaped, "setpo/dropped_steps") == 0
    assert setpo.setpo.pending is None
    assert_no_step_thread_alive()


def reorder(experiences: list, openrlhf, passes, strategy, tokenizer, problems) -> list:
    """Two rows of different groups trade places in the rollout (as a filter or a balancer that re-indexes might)."""
    first, last = experiences[0], experiences[-1]
    first.index[0], last.index[-1] = last.index[-1], first.index[0]
    return experiences


def change_a_reward(experiences: list, openrlhf, passes, strategy, tokenizer, problems) -> list:
    experiences[1].rewards[0] = 0.5
    return experiences


def another_rollout(experiences: list, openrlhf, passes, strategy, tokenizer, problems) -> list:
    return openrlhfs_passes(openrlhf, passes, rollout_samples(strategy, tokenizer, problems, KINDS[::-1]))


@pytest.mark.parametrize("change", [reorder, change_a_reward, another_rollout], ids=lambda change: change.__name__)
def test_experiences_changed_after_the_submit_are_scored_again_never_given_its_answer(
    change, tiny_model, server, passes, problems
):
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["grpo"])
    setpo.setpo.client, wire = recording_client(server.url)
    in_flight = []
    with_passes(setpo, passes, lambda: in_flight.append(setpo.setpo.pending is not None))
    samples = rollout_samples(strategy, tokenizer, problems, KINDS)
    experiences = setpo.make_experience(setpo.split_rollout_samples(copy.deepcopy(samples)))  # submitted for these
    changed = change(experiences, openrlhf, passes, strategy, tokenizer, problems)

    _, sync, _, _ = makers(tiny_model, server.url, *SETTINGS["grpo"])
    expected, sent = synchronous(sync, copy.deepcopy(changed))
    shaped = setpo.compute_advantages_and_returns(changed)

    assert in_flight == [True]
    assert_same_advantages(shaped, expected)  # not the early answer: the one for these rows
    early, again = wire.sent  # the early request, for the rows as they were; then the rows as they are
    assert again == sent[0] and early != again
    assert logged(shaped, "setpo/dropped_steps") == 1  # the early answer, dropped (its thread waited for)
    assert_no_step_thread_alive()


def test_a_step_whose_passes_failed_is_dropped_by_the_next_and_no_thread_outlives_it(
    tiny_model, server, passes, problems
):
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *SETTINGS["grpo"])
    samples = rollout_samples(strategy, tokenizer, problems, KINDS)

    def failing():
        raise RuntimeError("an actor died")

    with pytest.raises(RuntimeError, match="an actor died"):
        with_passes(setpo, passes, failing).make_experience_batch(copy.deepcopy(samples))
    assert setpo.setpo.pending is not None  # that step's scoring, never collected
    shaped = with_passes(setpo, passes).make_experience_batch(copy.deepcopy(samples))

    _, sync, _, _ = makers(tiny_model, server.url, *SETTINGS["grpo"])
    expected, _ = synchronous(sync, openrlhfs_passes(openrlhf, passes, samples))
    assert_same_advantages(shaped, expected)
    assert logged(shaped, "setpo/dropped_steps") == 1
    assert_no_step_thread_alive()


def reward_model_step(flags: list[str], tiny_model, server, passes, problems) -> tuple[list[bool], list, list]:
    """A step whose rewards come from a reward model's pass (the same rewards the reward file gives): whether the
    scoring was in flight at the actor's pass, what was sent, and the shaped experiences against the synchronous
    path's."""
    openrlhf, setpo, strategy, tokenizer = makers(tiny_model, server.url, *flags)
    setpo.setpo.client, wire = recording_client(server.url)
    scored = rollout_samples(strategy, tokenizer, problems, SCOPED_KINDS)
    rewards = iter([batch.rewards for batch in setpo.split_rollout_samples(copy.deepcopy(scored))])  # a micro-batch's
    samples = copy.deepcopy(scored)
    for sample in samples:  # no rewards until the reward model's pass
        sample.rewards = None
    in_flight = []
    with_passes(setpo, passes, lambda: in_flight.append(setpo.setpo.pending is not None))
    setpo.reward_model_group = ModelGroup(lambda **batch: next(rewards))
    shaped = setpo.make_experience_batch(samples)

    _, sync, _, _ = makers(tiny_model, server.url, *flags)
    expected, sent = synchronous(sync, openrlhfs_passes(openrlhf, passes, scored))
    assert_same_advantages(shaped, expected)
    assert logged(shaped, "setpo/dropped_steps") == 0
    assert_no_step_thread_alive()
    return in_flight, wire.sent, sent


def test_with_a_reward_model_the_texts_go_early_alone_and_a_scope_waits_for_the_rewards(
    tiny_model, server, passes, problems
):
    # the bonus needs only the texts: they go before the passes, without rewards
    in_flight, early, sent = reward_model_step(SETTINGS["grpo"], tiny_model, server, passes, problems)
    assert in_flight == [True]
    assert [group["texts"] for group in early[0]["groups"]] == [group["texts"] for group in sent[0]["groups"]]
    assert all("rewards" not in group for group in early[0]["groups"])
    # --setpo.min_reward's scope needs the reward model's rewards: scored at the advantage step, with them
    scoped = [*SETTINGS["grpo"], "--setpo.min_reward", "1.0"]
    in_flight, at_the_advantage_step, sent = reward_model_step(scoped, tiny_model, server, passes, problems)
    assert in_flight == [False]
    assert at_the_advantage_step == sent and len(sent) == 1

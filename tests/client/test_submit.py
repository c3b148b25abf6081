"""SetpoShaper.submit / SetpoShaper.shape, SetPO off the trainer's critical path, against the real app in-process:
the answer is score()'s, the caller's work between the halves hides the requests (setpo/wait_s), shape() collects
the step submitted only if it is the step at hand, and no answer reaches another step and no thread outlives its step."""

import math
import socket
import threading
from concurrent.futures import wait

import pytest

from setpo_client import SetpoClient, SetpoError
from setpo_client.shaping import SetpoShaper
from setpo_server.local import free_port
from tests.client.test_shaping_policy import ADVANTAGES, GROUPS, REWARDS

OTHER = [["one plan", "a second plan", "a third way", "the same plan"], ["x", "y", "z"]]


def step_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("setpo-step")]


def test_submit_then_result_is_score_and_the_work_in_between_is_not_waited_for(inprocess):
    policy = {"weight": 0.3, "min_reward": 1.0, "normalize": "zscore"}
    whole = SetpoShaper(inprocess, **policy).score(GROUPS, rewards=REWARDS, advantages=ADVANTAGES)

    shaper = SetpoShaper(inprocess, **policy)
    pending = shaper.submit(GROUPS, rewards=REWARDS)
    assert pending.work is not None
    wait([pending.work])  # the framework's own passes, longer than SetPO's requests
    step = shaper.shape(GROUPS, rewards=REWARDS, advantages=ADVANTAGES)

    assert step.bonus == whole.bonus and step.marginals == whole.marginals
    assert step.metrics["setpo/requests"] == whole.metrics["setpo/requests"] == 1
    # the requests ran while the caller worked: it blocked only for submit and the bonus's bookkeeping
    assert step.metrics["setpo/wait_s"] < step.metrics["setpo/time_s"]
    # score() waits at once: what blocked is SetPO's time but for the gap between the request thread's start and the
    # caller's wait, which is far shorter than a request on any CPU
    assert whole.metrics["setpo/wait_s"] > 0.5 * whole.metrics["setpo/time_s"]


def test_the_step_is_what_was_submitted_even_if_the_caller_reuses_its_lists(inprocess):
    groups = [list(group) for group in GROUPS]
    rewards = [list(group) for group in REWARDS]
    shaper = SetpoShaper(inprocess, weight=0.3, min_reward=1.0)
    shaper.submit(groups, rewards=rewards)
    groups[0][:] = ["overwritten"] * len(groups[0])  # the framework's next batch in the same buffers
    rewards[0][:] = [0.0] * len(rewards[0])
    del groups[1:]

    step = shaper.shape(GROUPS, rewards=REWARDS)  # the step as it was submitted: collected, not scored again
    assert step.bonus == SetpoShaper(inprocess, weight=0.3, min_reward=1.0).score(GROUPS, rewards=REWARDS).bonus
    assert step.metrics["setpo/dropped_steps"] == 0 and step.metrics["setpo/requests"] == 1


def test_a_step_is_collected_once_and_an_uncollected_one_is_dropped_for_the_next(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.5)
    first = shaper.submit(GROUPS)
    shaper.submit(OTHER)  # the first was never collected: its thread is waited for, its answer dropped
    assert first.work is not None and first.work.done()

    step = shaper.shape(OTHER)
    assert step.bonus == SetpoShaper(inprocess, weight=0.5).score(OTHER).bonus  # the second step's own answer
    assert step.metrics["setpo/dropped_steps"] == 1 and shaper.pending is None  # collected once
    again = shaper.shape(OTHER)  # nothing submitted: scored now, the answer of no earlier step
    assert again.metrics["setpo/requests"] == 1 and again.metrics["setpo/dropped_steps"] == 1


@pytest.mark.parametrize(
    "changed",
    [
        lambda groups, rewards: ([*groups[:1], list(reversed(groups[1]))], rewards),  # members in another order
        lambda groups, rewards: (groups, [[0.0, *group[1:]] for group in rewards]),  # a reward changed
        lambda groups, rewards: (groups[:1], rewards[:1]),  # a group gone
    ],
    ids=["order", "reward", "group"],
)
def test_shape_scores_a_step_other_than_the_one_submitted_and_never_gives_it_that_answer(inprocess, changed, caplog):
    policy = {"weight": 0.3, "min_reward": 1.0, "normalize": "zscore"}
    groups, rewards = changed(GROUPS, REWARDS)
    shaper = SetpoShaper(inprocess, **policy)
    shaper.submit(GROUPS, rewards=REWARDS)
    step = shaper.shape(groups, rewards=rewards)
    assert step.bonus == SetpoShaper(inprocess, **policy).score(groups, rewards=rewards).bonus
    assert step.metrics["setpo/dropped_steps"] == 1 and "other members or rewards" in caplog.text


def test_a_reward_no_function_gave_is_the_same_reward_at_submit_and_at_shape(inprocess):
    """NaN (TRL's mark of a completion every reward function declined) is the same step's NaN."""
    rewards = [[math.nan, *group[1:]] for group in REWARDS]
    shaper = SetpoShaper(inprocess, weight=0.3)
    shaper.submit(GROUPS, rewards=rewards)
    assert shaper.shape(GROUPS, rewards=rewards).metrics["setpo/dropped_steps"] == 0


def test_no_step_thread_outlives_its_step(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.5)
    for groups in (GROUPS, OTHER):
        shaper.submit(groups)
        shaper.shape(groups)
    shaper.submit(GROUPS)
    shaper.shape(OTHER)  # the one submitted is dropped, its thread waited for; these scored now
    for thread in step_threads():  # a finished executor thread exits at once; one still working would not
        thread.join(timeout=10)
    assert not step_threads()


def test_a_failed_step_is_the_fault_policy_at_result_not_at_submit():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with SetpoClient(url, max_retries=0, timeout=2.0) as client:
        skip = SetpoShaper(client, weight=0.5, on_error="skip")
        skip.submit(GROUPS)
        skip = skip.shape(GROUPS)
        assert skip.marginals is None and skip.metrics["setpo/fallback_steps"] == 1
        assert all(b == 0.0 for group in skip.bonus for b in group)

        fail = SetpoShaper(client, weight=0.5, on_error="fail")
        fail.submit(GROUPS)  # returns: the work is elsewhere
        with pytest.raises(SetpoError, match="on_error='fail'"):
            fail.shape(GROUPS)


def test_weight_zero_submits_nothing(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.0)
    assert shaper.submit(GROUPS).work is None
    step = shaper.shape(GROUPS, advantages=ADVANTAGES)
    assert step.marginals is None and step.metrics["setpo/requests"] == 0


def test_a_failed_steps_time_counts_its_requests_hidden_or_not():
    """time_s is SetPO's own time whether the step is shaped or falls back: the requests that failed while the
    caller worked cost time too (on the steps where SetPO costs the most, time_s must not read as nothing)."""
    shaper = SetpoShaper(SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=2, backoff=0.5), weight=0.3)
    pending = shaper.submit(OTHER)
    assert pending.work is not None
    wait([pending.work])  # the framework's passes outlast the failing requests (two backoffs: 0.75 s at least)
    step = shaper.shape(OTHER)
    assert step.metrics["setpo/fallback_steps"] == 1 and pending.work_s > 0.5
    assert step.metrics["setpo/time_s"] >= pending.work_s > step.metrics["setpo/wait_s"]

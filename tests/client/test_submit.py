"""SetpoShaper.submit / PendingStep.result, SetPO off the trainer's critical path, against the real app in-process:
the answer is score()'s, the caller's work between the halves hides the requests (setpo/wait_s), and by
construction no answer reaches another step and no thread outlives its step."""

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
    step = pending.result(ADVANTAGES)

    assert step.bonus == whole.bonus and step.marginals == whole.marginals
    assert step.metrics["setpo/requests"] == whole.metrics["setpo/requests"] == 1
    # the requests ran while the caller worked: it blocked only for submit and the bonus's bookkeeping
    assert step.metrics["setpo/wait_s"] < step.metrics["setpo/time_s"]
    # score() waits at once: what blocked is all of SetPO's time, but for when its thread got the CPU (the two clocks
    # differ by the gap between the request thread's start and the caller's wait: milliseconds, tens under load)
    assert whole.metrics["setpo/wait_s"] == pytest.approx(whole.metrics["setpo/time_s"], rel=0.25, abs=0.02)


def test_the_step_is_what_was_submitted_even_if_the_caller_reuses_its_lists(inprocess):
    groups = [list(group) for group in GROUPS]
    rewards = [list(group) for group in REWARDS]
    shaper = SetpoShaper(inprocess, weight=0.3, min_reward=1.0)
    pending = shaper.submit(groups, rewards=rewards)
    groups[0][:] = ["overwritten"] * len(groups[0])  # the framework's next batch in the same buffers
    rewards[0][:] = [0.0] * len(rewards[0])
    del groups[1:]

    step = pending.result()
    assert step.bonus == SetpoShaper(inprocess, weight=0.3, min_reward=1.0).score(GROUPS, rewards=REWARDS).bonus
    assert [len(group) for group in step.bonus] == [len(group) for group in GROUPS]


def test_a_step_is_collected_once_and_an_uncollected_one_is_dropped_for_the_next(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.5)
    first = shaper.submit(GROUPS)
    second = shaper.submit(OTHER)  # the first was never collected: its thread is waited for, its answer dropped
    assert first.work is not None and first.work.done()

    with pytest.raises(RuntimeError, match="collected already, or dropped"):
        first.result()
    step = second.result()
    assert step.bonus == SetpoShaper(inprocess, weight=0.5).score(OTHER).bonus  # the second step's own answer
    assert step.metrics["setpo/dropped_steps"] == 1
    with pytest.raises(RuntimeError, match="collected already"):
        second.result()


def test_no_step_thread_outlives_its_step(inprocess):
    shaper = SetpoShaper(inprocess, weight=0.5)
    for groups in (GROUPS, OTHER):
        shaper.submit(groups).result()
    shaper.submit(GROUPS)
    shaper.submit(OTHER).result()  # the dropped one's thread ended too
    for thread in step_threads():  # a finished executor thread exits at once; one still working would not
        thread.join(timeout=10)
    assert not step_threads()


def test_a_failed_step_is_the_fault_policy_at_result_not_at_submit():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with SetpoClient(url, max_retries=0, timeout=2.0) as client:
        skip = SetpoShaper(client, weight=0.5, on_error="skip").submit(GROUPS).result()
        assert skip.marginals is None and skip.metrics["setpo/fallback_steps"] == 1
        assert all(b == 0.0 for group in skip.bonus for b in group)

        pending = SetpoShaper(client, weight=0.5, on_error="fail").submit(GROUPS)  # returns: the work is elsewhere
        with pytest.raises(SetpoError, match="on_error='fail'"):
            pending.result()


def test_weight_zero_submits_nothing(inprocess):
    pending = SetpoShaper(inprocess, weight=0.0).submit(GROUPS)
    assert pending.work is None
    step = pending.result(ADVANTAGES)
    assert step.marginals is None and step.metrics["setpo/requests"] == 0


def test_a_failed_steps_time_counts_its_requests_hidden_or_not():
    """time_s is SetPO's own time whether the step is shaped or falls back: the requests that failed while the
    caller worked cost time too (on the steps where SetPO costs the most, time_s must not read as nothing)."""
    shaper = SetpoShaper(SetpoClient(f"http://127.0.0.1:{free_port()}", max_retries=2, backoff=0.5), weight=0.3)
    pending = shaper.submit(OTHER)
    assert pending.work is not None
    wait([pending.work])  # the framework's passes outlast the failing requests (two backoffs: 0.75 s at least)
    step = pending.result()
    assert step.metrics["setpo/fallback_steps"] == 1 and pending.work_s > 0.5
    assert step.metrics["setpo/time_s"] >= pending.work_s > step.metrics["setpo/wait_s"]

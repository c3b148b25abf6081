"""veRL's v1 trainers run the advantage step parameter_sync_step (k) times a training step and reduce each metric of
the k passes by a rule its name picks (issue 41, item 3). Through veRL's own MetricsAggregator, as
PPOTrainer.step feeds it, SetPO's metrics of k = 2 real passes give the step's true figures."""

import logging

import pytest
import verl  # noqa: F401  (loads the plug-in)
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.utils import MetricsAggregator

from setpo_client import SetpoClient
from setpo_client.integrations.verl.start import check_start
from setpo_client.shaping import SetpoShaper
from setpo_client.weight import WeightController

from .test_verl_start import setpo, verl_config

GROUPS = [["48 / 2 = 24, so 72", "1.5 * 48 = 72", "a = 48, a + a/2 = 72"], ["five", "2 + 3 = 5", "it is 5"], ["x", "y"]]
ADVANTAGES = [[0.5, -1.0, 0.5], [-1.0, 0.5, 0.5], [0.0, 0.0]]


def test_two_advantage_passes_reduce_to_the_training_steps_figures(server):
    shaper = SetpoShaper(SetpoClient(server.url), weight=0.3, controller=WeightController(target_ratio=0.5))
    passes = [shaper.score(GROUPS, advantages=ADVANTAGES).metrics for _ in range(2)]
    first, second = passes
    assert first["setpo/unscored_groups_total"] == 1 and second["setpo/unscored_groups_total"] == 2
    assert first["setpo/weight"] != second["setpo/weight"]  # the controller moved lambda between the passes

    aggregator = MetricsAggregator()  # as PPOTrainer.step: one add a pass, weighted by its samples
    for metrics in passes:
        aggregator.add_step_metrics(metrics, sample_count=8)
    step = aggregator.get_aggregated_metrics()

    for name in ("setpo/requests", "setpo/scored_groups", "setpo/unscored_groups", "setpo/cut_texts"):
        assert step[name] == first[name] + second[name], name  # the step's counts: the passes' sum
    for name in ("setpo/time_s", "setpo/wait_s"):  # SetPO's time, and what of it the trainer blocked on
        assert step[name] == pytest.approx(first[name] + second[name]), name
    for name in ("setpo/unscored_groups_total", "setpo/fallback_steps", "setpo/weight"):
        assert step[name] == second[name], name  # running totals and lambda: where the step ended, not a sum or mean
    assert step["setpo/bonus_rms"] == pytest.approx((first["setpo/bonus_rms"] + second["setpo/bonus_rms"]) / 2)


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["trainer.v1.trainer_mode=separate_async", "+algorithm.setpo.target_ratio=0.3"], True),  # k = 4 by default
        (["trainer.v1.trainer_mode=separate_async"], False),  # lambda fixed: nothing counts steps
        (["+algorithm.setpo.target_ratio=0.3"], False),  # sync: one pass a step
    ],
)
def test_a_controller_under_several_passes_a_step_is_told_at_start_what_its_steps_count(
    server, caplog, overrides, warned
):
    config = verl_config(*overrides, *setpo(server.url))
    with caplog.at_level(logging.WARNING, logger="setpo_client.verl"):
        check_start(config, get_trainer_cls("sync"))
    said = "parameter_sync_step=4 runs the advantage step 4 times a training step; the weight controller steps once"
    assert (said in caplog.text) == warned


def test_steps_dropped_are_a_running_total_the_last_passs(server):
    """setpo/dropped_steps (a step submitted and never collected, dropped when another step is scored) counts the
    run's drops so far: the training step logs the last pass's count, not the passes' sum or mean."""
    shaper = SetpoShaper(SetpoClient(server.url), weight=0.3)
    passes = []
    for _ in range(2):
        shaper.submit(GROUPS[::-1])  # never collected: the step scored next is another, so this one is dropped
        passes.append(shaper.score(GROUPS, advantages=ADVANTAGES).metrics)
    assert [metrics["setpo/dropped_steps"] for metrics in passes] == [1, 2]
    aggregator = MetricsAggregator()
    for metrics in passes:
        aggregator.add_step_metrics(metrics, sample_count=8)
    assert aggregator.get_aggregated_metrics()["setpo/dropped_steps"] == 2

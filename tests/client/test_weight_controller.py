"""WeightController: lambda steered to a target ratio RMS(bonus) / RMS(advantage), against hand computations."""

import pytest

from setpo_client.weight import WeightController


def test_each_step_moves_lambda_toward_the_lambda_that_would_have_hit_the_target():
    controller = WeightController(target_ratio=0.5, ema=0.75, min_weight=1e-3, max_weight=10.0)
    controller.start(0.2)
    # lambda 0.2 gave a bonus RMS of 0.1 against advantages of RMS 1: ratio 0.1, lambda* = 0.2 * 0.5 / 0.1 = 1.0
    controller.update(bonus_rms=0.1, advantage_rms=1.0)
    assert controller.weight == pytest.approx(0.75 * 0.2 + 0.25 * 1.0)
    # the same unit bonus keeps pulling: lambda converges to 1.0
    for _ in range(60):
        controller.update(bonus_rms=controller.weight * 0.5, advantage_rms=1.0)
    assert controller.weight == pytest.approx(1.0, rel=1e-6)


def test_lambda_stays_within_its_bounds():
    controller = WeightController(target_ratio=1.0, ema=0.0, min_weight=0.05, max_weight=0.3)
    controller.start(5.0)
    assert controller.weight == 0.3
    controller.update(bonus_rms=1e-6, advantage_rms=1.0)  # lambda* would be huge
    assert controller.weight == 0.3
    controller.update(bonus_rms=100.0, advantage_rms=1.0)  # lambda* would be tiny
    assert controller.weight == 0.05


def test_warm_up_ramps_the_target_and_freeze_holds_lambda():
    controller = WeightController(target_ratio=0.4, ema=0.0, warmup_steps=4, freeze_after=6, max_weight=100.0)
    controller.start(1.0)
    seen = []
    for _ in range(8):
        controller.update(bonus_rms=controller.weight, advantage_rms=1.0)  # a unit bonus: lambda* = target
        seen.append(controller.weight)
    assert seen[:4] == pytest.approx([0.1, 0.2, 0.3, 0.4])  # target x 1/4, 2/4, 3/4, 4/4
    assert seen[4:6] == pytest.approx([0.4, 0.4])
    controller.update(bonus_rms=controller.weight * 10, advantage_rms=1.0)  # step 8 > freeze_after: no change
    assert controller.weight == pytest.approx(0.4) and controller.steps == 9


def test_a_step_with_no_bonus_or_no_advantage_spread_leaves_lambda_unchanged():
    controller = WeightController(target_ratio=0.3, ema=0.0)
    controller.start(0.7)
    controller.update(bonus_rms=0.0, advantage_rms=1.0)
    controller.update(bonus_rms=0.2, advantage_rms=0.0)
    assert controller.weight == 0.7


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_ratio": 0.0},
        {"target_ratio": float("nan")},
        {"target_ratio": 0.3, "min_weight": 0.0},
        {"target_ratio": 0.3, "min_weight": 2.0, "max_weight": 1.0},
        {"target_ratio": 0.3, "ema": 1.0},
        {"target_ratio": 0.3, "warmup_steps": -1},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        WeightController(**kwargs)

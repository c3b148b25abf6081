"""A scale-free weight: lambda steered so that the bonus is a chosen share of the advantage.

A raw lambda means nothing across tasks: the marginals' size depends on the embedder, the group size and the
task, while the advantages are unit-scale (docs/diversity.md). The controller asks instead for a target ratio

    ratio = RMS(bonus) / RMS(advantage)     over all responses of a step (unscored ones count as bonus 0)

Since the bonus is linear in lambda, each step tells the lambda that would have hit the target exactly,
lambda* = lambda * target / ratio; lambda follows an exponential moving average of lambda*, within
[min_weight, max_weight]. During the first `warmup_steps` the target ramps up linearly from target/warmup_steps
(diversity credit grows in as the policy starts to learn); after `freeze_after` steps lambda stays where it is,
so the rest of the run trains with a fixed weight. A step with no bonus or no advantage spread (no group had 3
scored members, every reward equal, a fallback step) leaves lambda unchanged.

    controller = WeightController(target_ratio=0.3, min_weight=0.01, max_weight=2.0)
    shaper = SetpoShaper(client, weight=0.1, controller=controller)   # 0.1: the first step's lambda
"""

import math
from dataclasses import dataclass


@dataclass
class WeightController:
    target_ratio: float  # RMS(bonus) / RMS(advantage) to steer to
    min_weight: float = 1e-3  # > 0: a lambda of 0 would leave nothing to measure the next lambda from
    max_weight: float = 10.0
    ema: float = 0.9  # weight of the past in the moving average of lambda*
    warmup_steps: int = 0
    freeze_after: int | None = None  # steps after which lambda no longer changes (None: never frozen)
    weight: float = 0.0  # the lambda the next step applies; SetpoShaper sets the first one (start)
    steps: int = 0  # steps seen so far (each call to update), for the warm-up and the freeze

    def __post_init__(self) -> None:
        finite = all(math.isfinite(x) for x in (self.target_ratio, self.min_weight, self.max_weight, self.ema))
        if not finite or self.target_ratio <= 0:
            raise ValueError(f"target_ratio must be a finite number > 0, got {self.target_ratio}")
        if not 0 < self.min_weight <= self.max_weight:
            raise ValueError(f"need 0 < min_weight <= max_weight, got {self.min_weight} and {self.max_weight}")
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema must be in [0, 1), got {self.ema}")
        if self.warmup_steps < 0 or (self.freeze_after is not None and self.freeze_after < 0):
            raise ValueError("warmup_steps and freeze_after must be >= 0")

    def start(self, weight: float) -> None:
        """The first step's lambda (bounded)."""
        self.weight = min(max(weight, self.min_weight), self.max_weight)

    def target(self) -> float:
        """This step's target ratio: ramped up during the warm-up."""
        if self.steps < self.warmup_steps:
            return self.target_ratio * (self.steps + 1) / self.warmup_steps
        return self.target_ratio

    def update(self, bonus_rms: float, advantage_rms: float) -> None:
        """After a step that applied self.weight: move lambda toward what would have hit the step's target."""
        target, frozen = self.target(), self.freeze_after is not None and self.steps >= self.freeze_after
        self.steps += 1
        if frozen or bonus_rms <= 0 or advantage_rms <= 0 or not math.isfinite(bonus_rms / advantage_rms):
            return
        ideal = self.weight * target * advantage_rms / bonus_rms  # lambda* for this step
        average = self.ema * self.weight + (1 - self.ema) * ideal
        self.weight = min(max(average, self.min_weight), self.max_weight)

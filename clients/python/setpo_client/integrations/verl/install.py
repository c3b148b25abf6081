"""install(): SetPO's hooks into veRL, each a wrapper around veRL's own method that calls it unchanged: the v1
trainer's advantage step and its old-log-prob pass (v1), DAPO's filter (dapo), the metrics aggregator (metrics), and
the constructors of both of veRL's trainers, which run the start checks (start). Why each: docs/trl-and-verl.md#verl."""

import functools

from . import dapo, metrics, start, v1


def install() -> None:
    """Wrap veRL's methods (idempotent). Called when `import verl` loads this plug-in."""
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import replay_buffer, trainer_base
    from verl.trainer.ppo.v1 import utils as v1_utils

    trainer = trainer_base.PPOTrainer
    if getattr(trainer._compute_advantage, "setpo_wrapped", False):
        return
    wrap(trainer, "_compute_advantage", v1.advantage_step)
    wrap(trainer, "_compute_old_log_prob", v1.submit_first)
    wrap(trainer, "_build_replay_buffer", dapo.build_replay_buffer)
    wrap(replay_buffer.ReplayBuffer, "_dapo_filtered_keys", dapo.filtered_keys)
    wrap(v1_utils.MetricsAggregator, "_init_aggregation_rules", metrics.aggregation_rules)
    wrap(trainer, "__init__", start.checked_init)
    wrap(ray_trainer.RayPPOTrainer, "__init__", start.checked_init)  # the legacy trainer: refused there with SetPO on


def wrap(owner: type, name: str, around) -> None:
    """owner.name becomes around(veRL's own owner.name, *its arguments), marked for the start checks."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return around(original, *args, **kwargs)

    wrapper.setpo_wrapped = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)

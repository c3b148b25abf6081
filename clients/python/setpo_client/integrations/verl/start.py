"""What can be known before any worker starts, checked in the trainer's constructor: the trainer is veRL's v1 one
with the plug-in's steps in place, the veRL behaviour the plug-in relies on holds (tried on tiny real objects), the
version is the tested range, the settings work and the service is ready. Each refusal names what to change.
The list: docs/trl-and-verl.md#verl."""

import logging
from typing import NoReturn

import numpy as np
import torch
from packaging.specifiers import SpecifierSet

from setpo_client.shaping import largest_group

from .rows import row_sessions, session_groups
from .settings import POLICY_SETTINGS, enabled, keeps_groups, setpo_settings, shaper_for, spell

log = logging.getLogger("setpo_client.verl")
# veRL versions whose advantage steps this plug-in was tested against: the `verl` extra's range (tests/integrations/verl
# checks they agree)
TESTED_RANGE = ">=0.9,<0.10"
# estimators that compare a prompt's samples with each other: SetPO's bonus is defined on those groups
GROUP_ESTIMATORS = (
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
    "gdpo",
)


def checked_init(original, trainer, config, *args, **kwargs) -> None:
    """A trainer's constructor (`original`), after check_start: before it builds anything (init() starts workers)."""
    check_start(config, type(trainer))
    original(trainer, config, *args, **kwargs)


def refuse(what: str) -> NoReturn:
    raise RuntimeError(f"SetPO is enabled but {what}. Use veRL's own v1 trainers (veRL 0.9.x), or disable SetPO.")


def check_start(config, trainer_class) -> None:
    """Everything that can be known before any worker starts; each failure says what to change."""
    if enabled(config.algorithm):
        check_trainer(trainer_class)  # first: a legacy trainer is refused whatever its settings
    settings = setpo_settings(config.algorithm)
    if settings is None:
        return
    check_verl_behaviour()
    import verl

    if not SpecifierSet(TESTED_RANGE).contains(verl.__version__, prereleases=True):
        log.warning(
            f"SetPO's veRL plug-in is tested with veRL {TESTED_RANGE} (setpo-client[verl]); this is {verl.__version__}"
        )
    keep = keeps_groups(settings)
    n, estimator = config.actor_rollout_ref.rollout.n, str(config.algorithm.adv_estimator)
    ready_timeout = float(settings.get("ready_timeout", 120.0))
    info = shaper_for(settings).start(n, estimator, GROUP_ESTIMATORS, spell, ready_timeout)
    limits = info.limits
    log.info(
        f"SetPO on: lambda={settings.get('weight', 0.05)} with {info.model} at {settings['url']} (groups of {n}; the "
        f"service takes {limits.max_groups} groups of at most {limits.max_group_size} a request, {limits.max_body_bytes} bytes)"
    )
    log.info("SetPO diversity policy: %s", " ".join(f"{name}={settings.get(name)}" for name in POLICY_SETTINGS))
    if settings.get("advantage") not in (None, "framework"):
        # veRL 0.9 has neither MaxRL nor W-REINFORCE among its estimators: the shaper computes them
        log.info(
            f"SetPO: {spell('advantage')}={settings['advantage']} replaces {spell('estimator')}={estimator}'s advantages "
            "for every group SetPO sees (veRL's estimator still runs); rewards (rm_scores summed) must be 0 or 1"
        )
    if (config.algorithm.get("filter_groups") or {}).get("enable", False):
        log.info(
            f"SetPO: DAPO's filter_groups {'keeps' if keep else 'drops'} the groups SetPO's bonus sets apart (keep_groups)"
        )
    v1 = config.trainer.get("v1") or {}
    passes = (v1.get(v1.get("trainer_mode", "sync")) or {}).get("parameter_sync_step", 1)
    if passes > 1 and settings.get("target_ratio") is not None:
        log.warning(
            f"SetPO: parameter_sync_step={passes} runs the advantage step {passes} times a training step; the weight "
            f"controller steps once a pass, so warmup_steps and freeze_after count passes ({passes} a training step)"
        )
    agent = config.actor_rollout_ref.rollout.get("agent") or {}
    built_in = agent.get("default_agent_loop", "single_turn_agent") in ("single_turn_agent", "tool_agent")
    if estimator != "grpo" and (agent.get("agent_loop_config_path") or not built_in):
        # veRL's own loops give one output a session; a user's may give several, each a member under every
        # estimator but grpo, and veRL's config does not say how many: only the run can (the advantage step fits a
        # group the service cannot take, counted)
        log.warning(
            f"SetPO: with a custom agent loop and {spell('estimator')}={estimator} a group holds {spell('group_size')}={n} "
            f"x the outputs a session returns; the service takes at most {largest_group(limits)} members a group. A "
            "group above that is fitted: one member a session, its final output, as veRL's GRPO counts them "
            "(setpo/fitted_groups); raise SETPO_MAX_GROUP_SIZE (and SETPO_MAX_REQUEST_ROWS) on the service to score every output"
        )


def check_trainer(trainer_class) -> None:
    """The trainer is veRL's v1 one (PPOTrainer: the legacy trainer is deprecated in veRL 0.9, see the docs) and the
    plug-in's wrappers are the ones veRL calls: else it would train without SetPO or misreport its metrics."""
    from verl.trainer.ppo.v1 import utils as v1_utils
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    if not issubclass(trainer_class, PPOTrainer):
        refuse(
            f"{trainer_class.__module__}.{trainer_class.__name__} is not veRL's v1 trainer: the plug-in does not "
            "support veRL's legacy trainer, deprecated since veRL 0.9. Set trainer.use_v1=True (veRL's default)"
        )
    if not getattr(trainer_class._compute_advantage, "setpo_wrapped", False):
        refuse(
            f"{trainer_class.__name__}'s advantage step is not the plug-in's: this trainer would train without SetPO"
        )
    if not all(getattr(cls._dapo_filtered_keys, "setpo_wrapped", False) for cls in (ReplayBuffer, ReplayBufferAsync)):
        refuse(
            "veRL's ReplayBuffer._dapo_filtered_keys is not the plug-in's: DAPO's filter would drop what SetPO keeps"
        )
    if not getattr(v1_utils.MetricsAggregator._init_aggregation_rules, "setpo_wrapped", False):
        refuse("veRL's MetricsAggregator is not the plug-in's: with parameter_sync_step > 1 it would misreduce setpo/*")


def check_verl_behaviour() -> None:
    """What the plug-in relies on inside veRL's functions, tried on a tiny step: a release that changes one stops
    the run here, naming it, instead of training on bonuses for the wrong members or rows."""
    from verl import DataProto
    from verl.trainer.ppo import padding_utils
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers.utils import padding

    # veRL's GRPO counts a multi-output session (rows {uid}_{session}_{index}) as one sample, its final output, and
    # gives all its rows that output's advantage: row_sessions must read the same members. One prompt, three
    # sessions, the first of two outputs of which the final one has the best reward.
    keys, rewards = ["q_0_0", "q_0_1", "q_1_0", "q_2_0"], [0.0, 1.0, 0.0, 0.5]
    tensors = {"token_level_rewards": torch.tensor(rewards)[:, None], "response_mask": torch.ones(4, 1)}
    step = DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(["q"] * 4, dtype=object)})
    sessions = row_sessions(keys, [{}] * 4, "grpo")
    finals, (members,) = session_groups(["q"] * 4, sessions)
    try:
        got = trainer_base.compute_advantage_for_multi_trajectories(step, keys, "grpo").batch["advantages"][:, 0]
        advantages = got.tolist()
    except Exception as exc:
        refuse(f"veRL's v1 GRPO step failed on a multi-output session: {exc!r}")
    ranked = np.argsort([advantages[row] for row in members]).tolist()
    if (
        advantages != [advantages[finals[session[0]]] for session in sessions if session is not None]
        or ranked != np.argsort([rewards[row] for row in members]).tolist()
    ):
        refuse(
            "veRL's GRPO no longer counts a session's outputs (rows keyed {uid}_{session_id}_{index}) as one sample, "
            "its final output (verl.trainer.ppo.v1.trainer_base.compute_advantage_for_multi_trajectories)"
        )
    # the shaped advantages go back to TransferQueue as veRL writes its own: padded rows cut to each row's length
    mask = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]])
    try:
        written = padding.response_to_nested(values, mask).to_padded_tensor(0.0)
    except Exception as exc:
        refuse(
            f"verl.workers.utils.padding.response_to_nested, which writes the shaped advantages back, failed: {exc!r}"
        )
    if not torch.equal(written, values):
        refuse("verl.workers.utils.padding.response_to_nested no longer writes a padded row back as its response")
    _, tag = padding_utils.construct_minimal_padding_template({}, {}, 0)  # how veRL marks its padding rows
    if tag.get("is_padding") is not True:
        refuse(f"veRL's padding rows no longer carry the tag is_padding (their tag: {sorted(tag)})")

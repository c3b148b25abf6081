"""veRL's v1 trainer (PPOTrainer, verl/trainer/ppo/v1), where SetPO joins its step: the first of veRL's passes
after the reward submits the step's scoring, and the advantage step adds lambda * s_i to the advantages veRL just
wrote to TransferQueue. How and why: docs/trl-and-verl.md#verl."""

import time

from .rows import fitted_sessions, listed, policy_texts, row_rewards_and_advantages
from .settings import keeps_groups, setpo_settings, shaper_for
from .step import largest_group_now, shape, submit, submitted_for, take_submitted

# veRL's passes between the reward and the advantage step: the first of them that runs starts the step's scoring
EARLY_PASSES = ("_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values")


def rejects_rows(algorithm_config) -> bool:
    """Whether veRL's rollout correction may reject whole rows inside the advantage step (a sequence-level
    rollout_rs in decoupled mode): those steps are scored at the advantage step, since an answer started earlier
    would almost always be for members that no longer exist. Token-level rejection rejects a row whole only if it
    rejects every token of it: that rare step is caught at collect (step.shape) and re-scored."""
    correction = algorithm_config.get("rollout_correction") or {}
    options = str(correction.get("rollout_rs") or "").split(",")
    return not correction.get("bypass_mode", False) and any(option.strip().startswith("seq") for option in options)


def submit_first(original, trainer, batch, *args, **kwargs):
    """veRL's pass `original` (EARLY_PASSES), which the step's scoring starts before, once a step: its members as
    the advantage step will take them (each row's text as the rollout wrote it, its reward the summed rm_scores).
    The later passes find it submitted, and the passes hide it."""
    import transfer_queue as tq

    started, algorithm = time.perf_counter(), trainer.config.get("algorithm")
    rows, settings = (batch.partition_id, tuple(batch.keys)), setpo_settings(algorithm)
    shaper = shaper_for(settings) if settings is not None and not rejects_rows(algorithm) else None
    if shaper is not None and submitted_for(shaper, rows) is None:
        fields = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["uid", "responses", "response_mask", "rm_scores"],
        )
        texts = policy_texts(trainer.tokenizer, fields["responses"].unbind(), fields["response_mask"].unbind())
        uids, estimator = listed(fields["uid"]), trainer.config.algorithm.adv_estimator
        sessions, _ = fitted_sessions(batch.keys, batch.tags, uids, estimator, largest_group_now(shaper, started))
        rewards = fields["rm_scores"].to_padded_tensor(0.0).sum(-1).tolist()
        submit(shaper, rows, texts, uids, sessions, rewards, started)
    return original(trainer, batch, *args, **kwargs)


def advantage_step(original, trainer, batch, metrics: dict):
    """veRL's PPOTrainer._compute_advantage (`original`) unchanged, then the step's advantages read back from
    TransferQueue, shaped and written back; setpo/* join veRL's metrics of the step. The texts are read before
    veRL's step (or at the early submit), as its rollout correction then masks tokens; the bonus lands on the
    tokens veRL trains, and a row it rejected whole (response mask all 0) is not sent."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    settings = setpo_settings(trainer.config.algorithm)
    if settings is None:
        return original(trainer, batch, metrics)
    decoding_started, shaper = time.perf_counter(), shaper_for(settings)
    early = take_submitted(shaper, (batch.partition_id, tuple(batch.keys)))
    if early is None:
        read = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses", "response_mask"]
        )
        texts = policy_texts(trainer.tokenizer, read["responses"].unbind(), read["response_mask"].unbind())
    else:
        texts = early.texts
    decoding = time.perf_counter() - decoding_started
    batch = original(trainer, batch, metrics)
    started = time.perf_counter() - decoding  # setpo/time_s: the plug-in's own work, not veRL's step between

    fields = tq.kv_batch_get(
        keys=batch.keys,
        partition_id=batch.partition_id,
        select_fields=["uid", "response_mask", "rm_scores", "advantages"],
    )
    nested_mask = fields["response_mask"]  # after rollout correction: what veRL trains; a rejected row is all 0
    texts = [text if trained.any() else None for text, trained in zip(texts, nested_mask.unbind())]
    uids, estimator = listed(fields["uid"]), trainer.config.algorithm.adv_estimator
    largest = largest_group_now(shaper, started, early)
    sessions, fitted = fitted_sessions(batch.keys, batch.tags, uids, estimator, largest)
    advantages, padded_mask = fields["advantages"].to_padded_tensor(0.0), nested_mask.to_padded_tensor(0)  # (B, T)
    # v1's advantage step reads the reward model's rm_scores as veRL's token_level_scores
    rewards, row_advantages = row_rewards_and_advantages(
        fields["rm_scores"].to_padded_tensor(0.0), advantages, padded_mask
    )
    bonus, step_metrics = shape(texts, uids, sessions, rewards, row_advantages, shaper, started, early)
    shaped = advantages + bonus.to(advantages.dtype)[:, None] * padded_mask
    fields = TensorDict({"advantages": response_to_nested(shaped, nested_mask)}, batch_size=len(batch))
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    metrics.update(step_metrics, **{"setpo/fitted_groups": float(fitted)})
    if keeps_groups(settings) and (trainer.config.algorithm.get("filter_groups") or {}).get("enable", False):
        # the groups DAPO's filter kept since the last pass (they were kept before the step sampled them)
        metrics["setpo/kept_by_bonus"] = float(vars(trainer.replay_buffer).pop("setpo_kept_by_bonus", 0))
    return batch

"""DAPO's dynamic sampling under SetPO (+algorithm.setpo.keep_groups): veRL's v1 filter,
ReplayBuffer._dapo_filtered_keys (the sync and async samplers share it), keeps the groups it would drop whose
shaped advantages would still differ. What is kept and why: docs/trl-and-verl.md#dapos-dynamic-sampling-verl."""

import logging

from setpo_client.shaping import SetpoShaper, would_shape

from .rows import policy_texts, row_sessions, session_groups
from .settings import keeps_groups, setpo_settings, shaper_for

log = logging.getLogger("setpo_client.verl")


def build_replay_buffer(original, trainer):
    """veRL's PPOTrainer._build_replay_buffer: the buffer it builds knows its trainer, whose config and tokenizer
    (made later) the filter reads."""
    buffer = original(trainer)
    buffer.setpo_trainer = trainer
    return buffer


def filtered_keys(original, buffer, partition_id: str):
    """veRL's filter (`original`: the uids it drops, and their counts by reward), less the groups SetPO keeps."""
    uids, counts = original(buffer, partition_id)
    trainer = getattr(buffer, "setpo_trainer", None)  # None: a buffer the trainer did not build
    settings = None if trainer is None or not uids else setpo_settings(trainer.config.algorithm)
    if trainer is None or settings is None or not keeps_groups(settings):
        return uids, counts
    # veRL re-returns its cached verdicts every poll: decide each group once
    dropped = vars(buffer).setdefault("setpo_dropped", {}).setdefault(partition_id, set())
    dropped &= uids
    shaper = shaper_for(settings)
    fresh = uids - dropped
    keys = [key for key in buffer.partitions[partition_id] if key.split("_")[0] in fresh]
    try:
        kept = kept_by_bonus(keys, partition_id, trainer.tokenizer, trainer.config.algorithm.adv_estimator, shaper)
    except Exception as exc:  # a key function that raises: on_error decides, as for a step's scoring
        if settings.get("on_error", "skip") == "fail":
            raise
        log.error("SetPO: could not tell which filtered groups to keep (%r); DAPO drops them", exc)
        kept = set()
    dropped |= fresh - kept
    cache = buffer._dapo_classification_cache[partition_id]
    for uid in kept:
        counts[cache[uid]] -= 1
        cache[uid] = None  # an ordinary sampleable group to veRL from now on
    buffer.setpo_kept_by_bonus = getattr(buffer, "setpo_kept_by_bonus", 0) + len(kept)
    return uids - kept, +counts


def kept_by_bonus(keys: list[str], partition_id: str, tokenizer, estimator: str, shaper: SetpoShaper) -> set[str]:
    """Of the groups DAPO drops (keys: their rows, {uid}_{session}_{index}), the uids whose shaped advantages would
    still differ (would_shape). Members as the advantage step takes them (row_sessions); reward: rm_scores summed."""
    import transfer_queue as tq

    if not keys:
        return set()
    fields = tq.kv_batch_get(
        keys=keys, partition_id=partition_id, select_fields=["responses", "response_mask", "rm_scores"]
    )
    texts = policy_texts(tokenizer, fields["responses"].unbind(), fields["response_mask"].unbind())
    rewards = [float(scores.sum()) for scores in fields["rm_scores"].unbind()]
    uids = [key.rsplit("_", 2)[0] for key in keys]
    _, groups = session_groups(uids, row_sessions(keys, [{}] * len(keys), estimator))
    return {
        uids[rows[0]]
        for rows in groups
        if would_shape(shaper, [texts[row] for row in rows], [rewards[row] for row in rows])
    }

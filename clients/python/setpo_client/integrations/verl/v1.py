"""veRL's v1 trainer (PPOTrainer, verl/trainer/ppo/v1), where SetPO joins its step through SetpoShaper's two calls:
veRL's old-log-prob pass submits the step's scoring (SetpoShaper.submit), and the advantage step shapes it
(SetpoShaper.shape, which collects that answer only if it is for these very members and rewards) and moves the
advantages veRL just wrote to TransferQueue to the shaped ones. How and why: docs/trl-and-verl.md#verl."""

import time

import torch

from .rows import fitted_sessions, listed, member_lists, policy_texts, session_groups
from .settings import keeps_groups, setpo_settings, shaper_for


def rejects_rows(algorithm_config) -> bool:
    """Whether veRL's rollout correction may reject whole rows inside the advantage step (a sequence-level
    rollout_rs in decoupled mode): those steps are scored at the advantage step, since an answer started earlier
    would almost always be for members that no longer exist. Token-level rejection rejects a row whole only if it
    rejects every token of it: SetpoShaper.shape re-scores that rare step."""
    correction = algorithm_config.get("rollout_correction") or {}
    options = str(correction.get("rollout_rs") or "").split(",")
    return not correction.get("bypass_mode", False) and any(option.strip().startswith("seq") for option in options)


def step_sessions(trainer, batch, uids: list, shaper, started: float) -> tuple[list, int]:
    """Each row's member of its prompt's group as veRL's estimator counts samples, and how many groups were fitted
    (rows.fitted_sessions), the service's limits asked within the step's budget that began at `started`."""
    estimator, n = trainer.config.algorithm.adv_estimator, trainer.config.actor_rollout_ref.rollout.n
    return fitted_sessions(batch.keys, batch.tags, uids, estimator, n, lambda: shaper.limits(started))


def submit_first(original, trainer, batch, *args, **kwargs):
    """veRL's PPOTrainer._compute_old_log_prob (`original`), the step's scoring submitted first: its members as the
    advantage step will take them (each row's text as the rollout wrote it, its reward the summed rm_scores). Every
    v1 step runs this pass once, first after the reward (in bypass mode it only copies the rollout's log-probs), so
    the passes after it (old and reference log-probs, values) hide SetPO's requests."""
    import transfer_queue as tq

    started, algorithm = time.perf_counter(), trainer.config.get("algorithm")
    settings = setpo_settings(algorithm)
    if settings is not None and not rejects_rows(algorithm):
        shaper = shaper_for(settings)
        fields = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["uid", "responses", "response_mask", "rm_scores"],
        )
        texts = policy_texts(trainer.tokenizer, fields["responses"].unbind(), fields["response_mask"].unbind())
        uids = listed(fields["uid"])
        _, members = session_groups(uids, step_sessions(trainer, batch, uids, shaper, started)[0])
        groups, rewards = member_lists(members, texts, fields["rm_scores"].to_padded_tensor(0.0).sum(-1).tolist())
        shaper.submit(groups, rewards=rewards, started=started)
    return original(trainer, batch, *args, **kwargs)


def advantage_step(original, trainer, batch, metrics: dict):
    """veRL's PPOTrainer._compute_advantage (`original`) unchanged, then the step's advantages read back from
    TransferQueue, shaped and written back; setpo/* join veRL's metrics of the step. The texts are read before
    veRL's step, as its rollout correction then masks tokens; the shaped advantages land on the tokens veRL
    trains, and a row it rejected whole (response mask all 0) is not sent."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    settings = setpo_settings(trainer.config.algorithm)
    if settings is None:
        return original(trainer, batch, metrics)
    decoding_started, shaper = time.perf_counter(), shaper_for(settings)
    # decoded again, as at the submit: SetpoShaper.shape compares them with the texts submitted
    read = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses", "response_mask"]
    )
    texts = policy_texts(trainer.tokenizer, read["responses"].unbind(), read["response_mask"].unbind())
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
    uids = listed(fields["uid"])
    sessions, fitted = step_sessions(trainer, batch, uids, shaper, started)
    finals, members = session_groups(uids, sessions)
    advantages, padded_mask = fields["advantages"].to_padded_tensor(0.0), nested_mask.to_padded_tensor(0)  # (B, T)
    # a row's reward: its rm_scores summed, as v1's GRPO sums them (the scores, not the rewards, so a KL penalty does
    # not put a correct answer below min_reward); its advantage: the mean over the tokens veRL trains (one value there)
    trained = padded_mask.to(advantages.dtype)
    row_advantages = ((advantages * trained).sum(-1) / trained.sum(-1).clamp(min=1)).tolist()  # (B,)
    groups, scores = member_lists(members, texts, fields["rm_scores"].to_padded_tensor(0.0).sum(-1).tolist())
    given = [[row_advantages[row] for row in group] for group in members]  # veRL's, a member's one value
    step = shaper.shape(groups, rewards=scores, advantages=given, started=started)
    assert step.advantages is not None  # veRL's advantages were passed
    # Each row moves by its member's shaped advantage minus veRL's (a session's rows by its final output's): veRL's
    # per-token layout stays (0 on tool output, padding and rejected tokens), and on the tokens it trains, where a
    # group estimator writes one value, the row trains on exactly the shaped advantage, whichever base made it.
    moved = {
        row: new - old
        for rows, olds, news in zip(members, given, step.advantages)
        for row, old, new in zip(rows, olds, news)
    }
    shift = torch.tensor([moved[finals[session[0]]] if session is not None else 0.0 for session in sessions])  # (B,)
    shaped = advantages + shift.to(advantages.dtype)[:, None] * padded_mask
    fields = TensorDict({"advantages": response_to_nested(shaped, nested_mask)}, batch_size=len(batch))
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    metrics.update(step.metrics, **{"setpo/fitted_groups": float(fitted)})
    if keeps_groups(settings) and (trainer.config.algorithm.get("filter_groups") or {}).get("enable", False):
        # the groups DAPO's filter kept since the last pass (they were kept before the step sampled them)
        metrics["setpo/kept_by_bonus"] = float(vars(trainer.replay_buffer).pop("setpo_kept_by_bonus", 0))
    return batch

"""SetPO off the critical path on veRL (issue 39.4): the step's scoring is submitted at veRL's old-log-prob pass, the
first after the reward in every v1 step (bypass mode too), runs while the passes do, and the advantage step's
SetpoShaper.shape collects it. Through veRL's real pass, v1's PPOTrainer._compute_old_log_prob over a real local
TransferQueue, with a stand-in actor worker group (the model's forward pass is the one thing not run here), against
a real setpo-server. The answer applied is the synchronous path's; a batch that changed between the two halves is
scored again, never given the other's answer; no setpo-step thread outlives its step."""

import itertools
import threading
import time
from concurrent.futures import wait

import pytest
import torch
import verl  # noqa: F401  (loads the plug-in)
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from setpo_client import SetpoError
from setpo_client.integrations.verl.settings import shaper_for
from setpo_server.local import free_port

from . import test_verl_v1
from .test_verl_v1 import ANSWERS, REWARDS, WEIGHT, advantages_per_row, put_rollouts

transfer_queue, tokenizer = test_verl_v1.transfer_queue, test_verl_v1.tokenizer  # its fixtures, for this module too


def step_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("setpo-step")]


def no_step_thread_left() -> bool:
    for thread in step_threads():  # a finished executor thread exits at once; one still working would not
        thread.join(timeout=10)
    return not step_threads()


class Actor:
    """A stand-in actor worker group: each log-prob pass records which SetPO step was in flight when it ran, and
    lasts until that step's requests are answered (a pass longer than SetPO's). It gives every token log-prob -1,
    as put_rollouts' old log-probs, and writes them to TransferQueue as veRL's workers do."""

    def __init__(self, shaper, tq):
        self.shaper, self.tq, self.seen = shaper, tq, []

    def compute_log_prob(self, batch):
        pending = self.shaper.pending
        self.seen.append(pending)
        if pending is not None and pending.work is not None:
            wait([pending.work])
        from tensordict import TensorDict

        got = self.tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        # per row its prompt (one token here) and response, as veRL's workers write them
        full = [torch.full((len(mask) + 1,), -1.0) for mask in got["response_mask"].unbind()]
        nested = torch.nested.as_nested_tensor(full, layout=torch.jagged)
        fields = TensorDict({"log_probs": nested, "entropy": nested.abs()}, batch_size=len(batch))
        self.tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        return batch


def v1_trainer(tokenizer, actor, rollout_correction=None, **setpo):
    """What veRL's v1 PPOTrainer reads in its old-log-prob pass and its advantage step."""
    owner = test_verl_v1.trainer(tokenizer, rollout_correction, **setpo)
    owner.config = OmegaConf.merge(
        owner.config,
        {
            "actor_rollout_ref": {
                "rollout": {"temperature": 1.0, "calculate_log_probs": False},
                "actor": {"loss_agg_mode": "token-mean", "loss_scale_factor": None},
            }
        },
    )
    owner.actor_rollout_wg = actor
    return owner


_shapers = itertools.count()


def fresh(url: str, **more) -> dict:
    """algorithm.setpo settings of a shaper of its own (the plug-in keeps one per configuration and process): its
    counts (dropped_steps) and its step in flight are this test's alone."""
    return {"enable": True, "url": url, "weight": WEIGHT, "timeout": 60 + next(_shapers), **more}


def v1_step(tq, tokenizer, partition, settings, rows=None, off_policy=None, rollout_correction=None, collect=None):
    """One v1 step as veRL's _step_once runs it: the old-log-prob pass, then the advantage step (on the batch
    `collect` when given: another batch than the one the passes ran on). Between the two, the step submitted
    (None: none) is waited for, as veRL's later passes would outlast it. (advantage per row, metrics, submitted,
    actor)."""
    meta, _ = put_rollouts(tq, tokenizer, partition, rows, off_policy)
    shaper = shaper_for(settings)
    actor = Actor(shaper, tq)
    owner = v1_trainer(tokenizer, actor, rollout_correction, **settings)
    PPOTrainer._compute_old_log_prob(owner, meta, metrics={})
    submitted = shaper.pending
    if submitted is not None and submitted.work is not None:
        wait([submitted.work])
    if collect is not None:
        meta = collect
    metrics: dict = {}
    PPOTrainer._compute_advantage(owner, meta, metrics=metrics)
    return advantages_per_row(tq, meta.keys, meta.partition_id), metrics, submitted, actor


def v1_synchronous(tq, tokenizer, partition, settings, rows=None, off_policy=None, rollout_correction=None):
    """The same step scored at the advantage step alone, as before issue 39.4."""
    meta, _ = put_rollouts(tq, tokenizer, partition, rows, off_policy)
    owner = test_verl_v1.trainer(tokenizer, rollout_correction, **settings)
    metrics: dict = {}
    PPOTrainer._compute_advantage(owner, meta, metrics=metrics)
    return advantages_per_row(tq, meta.keys, partition), metrics


@pytest.mark.parametrize("bypass", [False, True], ids=["decoupled", "bypass"])
def test_v1_scoring_starts_before_the_old_log_prob_pass_and_the_advantage_step_applies_that_answer(
    transfer_queue, tokenizer, server, bypass
):
    correction = {"bypass_mode": True} if bypass else None
    settings = fresh(server.url)
    shaped, metrics, submitted, actor = v1_step(
        transfer_queue, tokenizer, f"early-{bypass}", settings, rollout_correction=correction
    )
    assert submitted is not None and submitted.work is not None  # submitted by the old-log-prob pass
    if not bypass:  # veRL's pass ran its worker with the step's requests already in flight
        assert actor.seen == [submitted]
    # the advantage step applied that very answer: collected, not dropped and scored again
    assert shaper_for(settings).pending is None and metrics["setpo/dropped_steps"] == 0
    expected, synchronous = v1_synchronous(
        transfer_queue, tokenizer, f"early-{bypass}-sync", fresh(server.url), rollout_correction=correction
    )
    assert shaped == pytest.approx(expected, abs=1e-6)
    assert metrics["setpo/requests"] == 1 and metrics["setpo/dropped_steps"] == 0
    # the requests ran during the passes: the advantage step waited for none of them
    assert metrics["setpo/wait_s"] < metrics["setpo/time_s"]
    # scored at the advantage step: it waited for all of it, but for scheduling (tests/client/test_submit.py)
    assert synchronous["setpo/wait_s"] == pytest.approx(synchronous["setpo/time_s"], rel=0.25, abs=0.02)
    assert no_step_thread_left()


def test_v1_a_service_that_is_down_costs_a_step_no_more_than_its_budget(transfer_queue, tokenizer):
    """Down (a redeploy, a crash), the service fails each step under skip within the step's one budget: the limits,
    unknown (or forgotten after a failure), are learned by the step's own work, never asked on veRL's critical path
    without a deadline (that was a client call's whole retries, twice a step)."""
    budget = 5.0  # the step's own work (TransferQueue, decoding) has a whole budget of margin on a slow, shared CPU
    settings = fresh(f"http://127.0.0.1:{free_port()}", timeout=budget)
    for partition in ("down-1", "down-2"):
        began = time.monotonic()
        _, metrics, _, _ = v1_step(transfer_queue, tokenizer, partition, settings)
        assert time.monotonic() - began < 2 * budget, partition
    assert metrics["setpo/fallback_steps"] == 2
    with pytest.raises(SetpoError, match="on_error='fail'"):  # the fault policy's other branch stops the run
        v1_step(transfer_queue, tokenizer, "down-fail", {**settings, "on_error": "fail"})


def test_v1_a_batch_other_than_the_one_submitted_gets_its_own_answer_never_the_others(
    transfer_queue, tokenizer, server, caplog
):
    other_answers = {"q0": ["seven", "3 + 4 = 7", "it is 7"], "q1": ["ten", "5 + 5", "2 * 5 = 10"]}
    rows = [(uid, s, 0, text, 1.0) for uid, texts in other_answers.items() for s, text in enumerate(texts)]
    other, _ = put_rollouts(transfer_queue, tokenizer, "other", rows)
    settings = fresh(server.url)
    # the passes ran on one batch; the advantage step is given another (a trainer that swapped its batch between)
    shaped, metrics, submitted, _ = v1_step(transfer_queue, tokenizer, "swapped", settings, collect=other)
    assert submitted is not None
    expected, _ = v1_synchronous(transfer_queue, tokenizer, "other-sync", fresh(server.url), rows=rows)
    assert shaped == pytest.approx(expected, abs=1e-6)
    # never applied to the other batch: SetpoShaper.shape dropped it and scored the batch at hand
    assert metrics["setpo/dropped_steps"] == 1 and "for other members or rewards" in caplog.text
    assert no_step_thread_left()


def test_v1_a_row_rejected_whole_after_the_scoring_started_is_scored_again_without_it(
    transfer_queue, tokenizer, server, caplog
):
    # token_k2 rejects every token of p0_3_0 inside the advantage step: a row rejected whole, after its text was sent
    rows = [("p0", s, 0, text, REWARDS["p0"][s]) for s, text in enumerate(ANSWERS["p0"])]
    rows += [("p0", 3, 0, "seventy-two", 1.0)]
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]
    correction = {"rollout_rs": "token_k2", "rollout_rs_threshold": 1.0}
    step = {"rows": rows, "off_policy": {"p0_3_0": None}, "rollout_correction": correction}
    shaped, metrics, submitted, _ = v1_step(transfer_queue, tokenizer, "rejected-late", fresh(server.url), **step)
    assert submitted is not None and len(submitted.groups[0]) == 4  # the row was among the members sent
    expected, _ = v1_synchronous(transfer_queue, tokenizer, "rejected-late-sync", fresh(server.url), **step)
    assert shaped == pytest.approx(expected, abs=1e-6) and shaped[3] == 0.0  # as if scored late: without the row
    assert metrics["setpo/dropped_steps"] == 1 and "for other members or rewards" in caplog.text
    assert no_step_thread_left()


def test_v1_with_sequence_level_rejection_the_step_is_scored_at_the_advantage_step(transfer_queue, tokenizer, server):
    # seq_max_k2 may reject whole rows in the advantage step: an answer started earlier would be for other members
    correction = {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 1.0}
    shaped, metrics, submitted, actor = v1_step(
        transfer_queue, tokenizer, "seq-rejection", fresh(server.url), rollout_correction=correction
    )
    assert submitted is None and actor.seen == [None]
    expected, _ = v1_synchronous(
        transfer_queue, tokenizer, "seq-rejection-sync", fresh(server.url), rollout_correction=correction
    )
    assert shaped == pytest.approx(expected, abs=1e-6) and metrics["setpo/dropped_steps"] == 0

"""The plug-in on veRL's default v1 trainer: PPOTrainer._compute_advantage over a real local TransferQueue."""

import types

import pytest
import ray
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

import verl  # noqa: F401  (loads the plug-in)
from setpo_trainer.models import smollm2_path
from verl.trainer.ppo.v1.agent_loop_tq import list_of_dict_to_tensordict
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

ANSWERS = {"p0": ["48 / 2 = 24, so 72", "1.5 * 48 = 72", "48 / 2 = 24, so 72"], "p1": ["five", "2 + 3 = 5", "it is 5"]}
REWARDS = {"p0": [1.0, 0.0, 1.0], "p1": [0.0, 1.0, 1.0]}


@pytest.fixture(scope="module")
def transfer_queue():
    import transfer_queue as tq

    # TransferQueue's controller and storage units are Ray actors: declare enough logical CPUs for them
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


def put_rollouts(tq, tokenizer, partition: str):
    """Rows as veRL's agent loop stores them: key {uid}_{session}_{index}, nested responses and scores."""
    keys, fields = [], []
    for uid, texts in ANSWERS.items():
        for session, (text, reward) in enumerate(zip(texts, REWARDS[uid])):
            ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
            # a multi-turn row: the policy's answer, then a tool's output that response_mask leaves out
            tool = torch.tensor(tokenizer(f" [tool output {uid} {session}: 42 rows]", add_special_tokens=False)["input_ids"])
            scores = torch.zeros(len(ids) + len(tool))
            scores[len(ids) - 1] = reward
            mask = torch.cat([torch.ones_like(ids), torch.zeros_like(tool)])
            keys.append(f"{uid}_{session}_0")
            fields.append({"uid": uid, "responses": torch.cat([ids, tool]), "response_mask": mask, "rm_scores": scores})
    return tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), partition_id=partition), keys


def trainer(tokenizer, **setpo):
    algorithm = {"adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False}
    if setpo:
        algorithm["setpo"] = setpo
    config = OmegaConf.create({"algorithm": algorithm, "actor_rollout_ref": {"rollout": {"n": 3}}})
    return types.SimpleNamespace(config=config, tokenizer=tokenizer)  # the two attributes the step reads


def advantages_per_row(tq, keys, partition) -> list[float]:
    """The one advantage of each row's answer tokens; the tool's tokens must keep 0."""
    got = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["advantages", "response_mask"])
    values = []
    for row, mask in zip(got["advantages"].unbind(), got["response_mask"].unbind()):
        answer, tool = row[mask.bool()], row[~mask.bool()]
        assert torch.all(answer == answer[0]) and torch.all(tool == 0)
        values.append(answer[0].item())
    return values


def test_v1_advantage_step_adds_weight_times_marginals_through_transfer_queue(transfer_queue, server, client):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    meta, keys = put_rollouts(transfer_queue, tokenizer, "base")
    PPOTrainer._compute_advantage(trainer(tokenizer), meta, metrics={})
    base = advantages_per_row(transfer_queue, keys, "base")

    meta, keys = put_rollouts(transfer_queue, tokenizer, "setpo")
    metrics = {}
    PPOTrainer._compute_advantage(trainer(tokenizer, enable=True, url=server.url, weight=0.3), meta, metrics=metrics)
    shaped = advantages_per_row(transfer_queue, keys, "setpo")

    marginals = [s for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups for s in g.marginals]
    assert shaped == pytest.approx([b + 0.3 * s for b, s in zip(base, marginals)], abs=1e-6)
    assert base != pytest.approx(shaped, abs=1e-6)
    assert metrics["setpo/weight"] == 0.3 and "setpo/set_score_mean" in metrics

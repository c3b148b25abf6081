"""The veRL plug-in at veRL's real advantage step (v0's compute_advantage on real DataProto), on CPU."""

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the plug-in through veRL's own entry-point discovery)
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo import ray_trainer, rollout_corr_helper
from verl.trainer.ppo.core_algos import AdvantageEstimator

from setpo_client import SetpoError
from setpo_server.local import free_port
from setpo_trainer.models import smollm2_path

G = 4
ANSWERS = [
    ["48 / 2 = 24 and 48 + 24 = 72", "half of 48 is 24, so 72", "1.5 * 48 = 72", "48 / 2 = 24 and 48 + 24 = 72"],
    ["the answer is 5", "2 + 3 = 5", "five", "3 + 2 equals 5"],
    ["x = 7", "seven", "7", "6 + 1 = 7"],
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(smollm2_path())


def rollout_batch(tokenizer, rewards: list[list[float]], answers=ANSWERS, split_reward=False, off_policy=None):
    """A real DataProto as veRL's trainer holds it at the advantage step: right-padded responses, a response
    mask, token-level rewards on each response's last token (split_reward: half on its first token, half on its
    last, as a reward with a format part and an answer part), the rollout's and the trainer's log-probs, and the
    group id `uid` of every row. An answer that is a tuple of turns has a tool's output between its turns, which
    response_mask leaves out. off_policy: row -> token positions whose rollout log-probs are far from the
    trainer's (for rejection sampling)."""
    tool = tokenizer(" [tool: 42 rows]", add_special_tokens=False)["input_ids"]
    ids, policy = [], []  # per row: its tokens, and which of them the policy wrote
    for answer in [a for group in answers for a in group]:
        tokens, mine = [], []
        for turn, text in enumerate((answer,) if isinstance(answer, str) else answer):
            words = tokenizer(text, add_special_tokens=False)["input_ids"]
            between = tool if turn else []
            tokens, mine = tokens + between + words, mine + [0] * len(between) + [1] * len(words)
        ids.append(tokens)
        policy.append(mine)
    width = max(map(len, ids)) + 3  # padding after every response
    responses = torch.full((len(ids), width), tokenizer.pad_token_id or 0)  # (B, T)
    mask, real, scores = torch.zeros(len(ids), width), torch.zeros(len(ids), width), torch.zeros(len(ids), width)
    for row, (tokens, reward) in enumerate(zip(ids, [r for group in rewards for r in group])):
        responses[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = torch.tensor(policy[row], dtype=torch.float)
        real[row, : len(tokens)] = 1
        scores[row, len(tokens) - 1] += reward / 2 if split_reward else reward
        scores[row, 0] += reward / 2 if split_reward else 0.0
    log_probs = torch.full((len(ids), width), -1.0)  # (B, T)
    rollout_log_probs = log_probs.clone()
    for row, positions in (off_policy or {}).items():
        rollout_log_probs[row, positions] -= 3.0
    uids = np.array([f"prompt-{g}" for g in range(len(answers)) for _ in range(G)], dtype=object)
    prompts = torch.ones(len(ids), 2, dtype=torch.long)  # (B, P), what the data metrics read
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": mask,
        "attention_mask": torch.cat([torch.ones_like(prompts), real.long()], 1),
        "token_level_scores": scores,
        "token_level_rewards": scores,
        "old_log_probs": log_probs,
        "rollout_log_probs": rollout_log_probs,
    }
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uids})


def algorithm(norm_by_std: bool = True, **setpo) -> object:
    config = {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": norm_by_std, "gamma": 1.0, "lam": 1.0}
    if setpo:
        config["setpo"] = setpo
    return OmegaConf.create(config)


def advantages(data: DataProto, config, estimator=AdvantageEstimator.GRPO) -> torch.Tensor:
    out = ray_trainer.compute_advantage(
        data,
        adv_estimator=estimator,
        num_repeat=G,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        config=config,
    )
    return out.batch["advantages"], out


REWARDS = [[1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 1]]


@pytest.mark.parametrize("norm_by_std", [True, False], ids=["grpo-gspo-dapo", "dr-grpo"])
def test_every_response_token_gets_weight_times_the_services_marginal(tokenizer, server, client, norm_by_std):
    base, _ = advantages(rollout_batch(tokenizer, REWARDS), algorithm(norm_by_std))
    settings = {"enable": True, "url": server.url, "weight": 0.2, "tokenizer": str(smollm2_path())}
    shaped, out = advantages(rollout_batch(tokenizer, REWARDS), algorithm(norm_by_std, **settings))
    mask = out.batch["response_mask"]
    marginals = torch.tensor([s for g in client.diversity([{"texts": g} for g in ANSWERS]).groups for s in g.marginals])
    assert torch.allclose(
        shaped - base, 0.2 * marginals[:, None] * mask, atol=1e-6
    )  # + lambda*s on tokens, 0 on padding
    assert (mask == 0).any() and torch.equal((shaped - base)[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert out.meta_info["setpo_metrics"]["setpo/weight"] == 0.2
    merged = ray_trainer.compute_data_metrics(batch=out, use_critic=False)  # reaches veRL's metrics of the step
    assert merged["setpo/set_score_mean"] == pytest.approx(
        sum(g.set_score for g in client.diversity([{"texts": g} for g in ANSWERS]).groups) / 3, abs=1e-6
    )


def test_off_or_absent_reproduces_verl_exactly(tokenizer):
    assert getattr(ray_trainer.compute_advantage, "setpo_wrapped", False), "the entry-point plug-in did not install"
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    data = rollout_batch(tokenizer, REWARDS)
    expected, _ = compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    for config in (algorithm(), algorithm(enable=False, url="http://unused")):
        got, out = advantages(rollout_batch(tokenizer, REWARDS), config)
        assert torch.equal(got, expected) and "setpo_metrics" not in out.meta_info


def test_groups_follow_uid_not_row_order(tokenizer, server, client):
    data = rollout_batch(tokenizer, REWARDS)
    order = np.random.default_rng(0).permutation(len(data))  # rows of a group scattered, as after balancing
    shuffled = data.select_idxs(order)
    settings = {"enable": True, "url": server.url, "weight": 1.0, "tokenizer": str(smollm2_path())}
    base, _ = advantages(data.select_idxs(order), algorithm())
    shaped, _ = advantages(shuffled, algorithm(**settings))
    marginals = torch.tensor(
        [s for g in client.diversity([{"texts": g} for g in ANSWERS]).groups for s in g.marginals]
    )[order]
    assert torch.allclose((shaped - base).sum(-1) / shuffled.batch["response_mask"].sum(-1), marginals, atol=1e-6)


def test_service_down_skip_trains_on_verls_advantages_and_fail_raises(tokenizer):
    down = f"http://127.0.0.1:{free_port()}"
    base, _ = advantages(rollout_batch(tokenizer, REWARDS), algorithm())
    skip = {
        "enable": True,
        "url": down,
        "weight": 0.2,
        "tokenizer": str(smollm2_path()),
        "on_error": "skip",
        "timeout": 2,
    }
    shaped, out = advantages(rollout_batch(tokenizer, REWARDS), algorithm(**skip))
    assert torch.equal(shaped, base) and out.meta_info["setpo_metrics"]["setpo/fallback_steps"] >= 1
    with pytest.raises(SetpoError, match="on_error='fail'"):
        advantages(
            rollout_batch(tokenizer, REWARDS),
            algorithm(**{**skip, "on_error": "fail", "url": f"http://127.0.0.1:{free_port()}"}),
        )


def test_clear_errors_for_incomplete_settings(tokenizer):
    with pytest.raises(ValueError, match=r"\+algorithm.setpo.url"):
        advantages(rollout_batch(tokenizer, REWARDS), algorithm(enable=True))
    with pytest.raises(ValueError, match=r"setpo.tokenizer"):
        advantages(rollout_batch(tokenizer, REWARDS), algorithm(enable=True, url="http://127.0.0.1:1"))


def test_min_reward_scores_only_responses_whose_summed_scores_reach_it(tokenizer, server, client):
    # each reward split over two tokens: only veRL's sum over the response (what its GRPO uses) reaches 1
    settings = {"enable": True, "url": server.url, "weight": 0.4, "tokenizer": str(smollm2_path())}
    policy = {"min_reward": 1.0, "normalize": "zscore"}
    base, _ = advantages(rollout_batch(tokenizer, REWARDS, split_reward=True), algorithm())
    shaped, out = advantages(rollout_batch(tokenizer, REWARDS, split_reward=True), algorithm(**settings, **policy))
    direct = client.diversity(
        [{"texts": g, "rewards": r} for g, r in zip(ANSWERS, REWARDS)], weight=0.4, **policy
    )  # group 0 has 3 correct answers; groups 1 and 2 fewer, so nothing is scored there
    bonus = torch.tensor([b for g in direct.groups for b in g.bonus])
    assert torch.allclose(shaped - base, bonus[:, None] * out.batch["response_mask"], atol=1e-6)
    correct = torch.tensor(REWARDS).flatten() == 1
    assert torch.all(bonus[~correct] == 0) and torch.all(bonus[:G][correct[:G]] != 0)
    metrics = ray_trainer.compute_data_metrics(batch=out, use_critic=False)
    assert metrics["setpo/scored_groups"] == 1 and metrics["setpo/small_scope_groups"] == 2


COUNTDOWN = [  # to the key function, rows 0 and 1 are one solution however they are spelt; row 3 has none
    ["<answer>(3+5)*2</answer>", "I add first. <answer>2*(5+3)</answer>", "<answer>(9-1)*2</answer>", "no idea"],
    ["<answer>4*6-8</answer>", "<answer>8+8</answer>", "so <answer>6*4-8</answer>", "<answer>2*8</answer>"],
]


@pytest.mark.parametrize(
    "kernel,key", [("key", "countdown_expression"), ("hybrid", "setpo_client.keys:countdown_expression")]
)
def test_the_key_function_names_solutions_for_the_key_and_hybrid_kernels(tokenizer, server, client, kernel, key):
    from setpo_client.keys import countdown_expression

    settings = {"enable": True, "url": server.url, "weight": 0.5, "tokenizer": str(smollm2_path())}
    rewards = [[1, 1, 1, 0], [1, 1, 1, 1]]
    base, _ = advantages(rollout_batch(tokenizer, rewards, COUNTDOWN), algorithm())
    shaped, out = advantages(
        rollout_batch(tokenizer, rewards, COUNTDOWN), algorithm(**settings, kernel=kernel, key=key)
    )
    keys = [[countdown_expression(text) for text in group] for group in COUNTDOWN]
    assert keys[0][0] == keys[0][1] != keys[0][2] and keys[0][3] is None and keys[1][0] == keys[1][2]
    sent = [{"keys": k} if kernel == "key" else {"texts": g, "keys": k} for g, k in zip(COUNTDOWN, keys)]
    bonus = torch.tensor([b for g in client.diversity(sent, weight=0.5, kernel=kernel).groups for b in g.bonus])
    assert torch.allclose(shaped - base, bonus[:, None] * out.batch["response_mask"], atol=1e-6)
    if kernel == "key":  # one solution spelt twice: one marginal, below the solution nobody else found
        assert bonus[0].item() == pytest.approx(bonus[1].item(), abs=1e-9) and bonus[2] > bonus[0]


def test_the_weight_controller_steers_lambda_to_the_target_ratio_and_the_metrics_say_so(tokenizer, server, client):
    settings = {"enable": True, "url": server.url, "weight": 0.3, "tokenizer": str(smollm2_path())}
    controller = {"target_ratio": 0.5, "weight_ema": 0.0, "max_weight": 100.0}
    base, out = advantages(rollout_batch(tokenizer, REWARDS), algorithm())
    mask = out.batch["response_mask"]
    logged = []
    for _ in range(2):  # two steps of one run: the shaper, and so the controller, carries over
        shaped, out = advantages(rollout_batch(tokenizer, REWARDS), algorithm(**settings, **controller))
        logged.append(ray_trainer.compute_data_metrics(batch=out, use_critic=False))
    first, second = logged
    per_row = (base * mask).sum(-1) / mask.sum(-1)  # veRL's GRPO advantage of each response
    assert first["setpo/advantage_rms"] == pytest.approx(per_row.square().mean().sqrt().item(), rel=1e-6)
    assert first["setpo/weight"] == 0.3
    # ema 0: step 2 applies the lambda that would have hit the target at step 1; the same step then hits it
    assert second["setpo/weight"] == pytest.approx(0.3 * 0.5 / first["setpo/bonus_ratio"], rel=1e-6)
    assert second["setpo/bonus_ratio"] == pytest.approx(0.5, rel=1e-5)
    marginals = torch.tensor([s for g in client.diversity([{"texts": g} for g in ANSWERS]).groups for s in g.marginals])
    assert torch.allclose(shaped - base, second["setpo/weight"] * marginals[:, None] * mask, atol=1e-6)


def test_legacy_per_token_rejection_and_tool_turns_leave_the_text_as_the_policy_wrote_it(tokenizer, server, client):
    # row 0 answers in two turns around a tool's output; token_k2 rejects two tokens of row 1's answer
    answers = [[("I will ask the calculator", "it says 72"), *ANSWERS[0][1:]], *ANSWERS[1:]]
    settings = {"enable": True, "url": server.url, "weight": 0.25, "tokenizer": str(smollm2_path())}

    def legacy_step(config):  # as veRL's legacy trainer: rollout correction, then the advantage step
        data = rollout_batch(tokenizer, REWARDS, answers, off_policy={1: [1, 2]})
        correction = {"rollout_rs": "token_k2", "rollout_rs_threshold": 1.0}
        data, _ = rollout_corr_helper.compute_rollout_correction_and_add_to_batch(data, correction)
        return advantages(data, config)

    base, base_out = legacy_step(algorithm())
    shaped, out = legacy_step(algorithm(**settings))
    trained = out.batch["response_mask"]
    assert trained[1, 1:3].tolist() == [0, 0]  # veRL rejected the two tokens
    texts = [["I will ask the calculator\nit says 72", *ANSWERS[0][1:]], *ANSWERS[1:]]  # one turn a line, no holes
    marginals = torch.tensor([s for g in client.diversity([{"texts": t} for t in texts]).groups for s in g.marginals])
    assert torch.allclose(shaped - base, 0.25 * marginals[:, None] * trained, atol=1e-6)
    for batch in (base_out, out):  # the rollout's mask the plug-in kept does not travel on to veRL's workers
        assert "setpo_generated_mask" not in list(batch.batch.keys())


@pytest.mark.parametrize(
    "estimator", [AdvantageEstimator.RLOO, AdvantageEstimator.OPO, AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE]
)
def test_legacy_non_grpo_group_estimators_get_the_bonus_on_their_own_advantages(tokenizer, server, client, estimator):
    settings = {"enable": True, "url": server.url, "weight": 0.35, "tokenizer": str(smollm2_path())}
    base, _ = advantages(rollout_batch(tokenizer, REWARDS), algorithm(), estimator)
    shaped, out = advantages(rollout_batch(tokenizer, REWARDS), algorithm(**settings), estimator)
    marginals = torch.tensor([s for g in client.diversity([{"texts": g} for g in ANSWERS]).groups for s in g.marginals])
    assert torch.allclose(shaped - base, 0.35 * marginals[:, None] * out.batch["response_mask"], atol=1e-5)
    assert not torch.equal(base, torch.zeros_like(base))  # the estimator's own advantages are there underneath

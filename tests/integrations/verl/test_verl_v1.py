"""The plug-in on veRL's default v1 trainer: PPOTrainer._compute_advantage over a real local TransferQueue, with
what a real step holds: multi-turn rows with tool output, veRL's own synthetic padding rows, a group left short
by a failed session, multi-output agent-loop sessions, and rows rejected by rollout correction."""

import types

import pytest
import ray
import torch
import verl  # noqa: F401  (loads the plug-in)
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.v1.agent_loop_tq import list_of_dict_to_tensordict
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from setpo_server.local import LocalServer
from setpo_trainer.models import smollm2_path

from .conftest import ROOT_VENV_PYTHON

ANSWERS = {"p0": ["48 / 2 = 24, so 72", "1.5 * 48 = 72", "48 / 2 = 24, so 72"], "p1": ["five", "2 + 3 = 5", "it is 5"]}
REWARDS = {"p0": [1.0, 0.0, 1.0], "p1": [0.0, 1.0, 1.0]}
WEIGHT = 0.3


@pytest.fixture(scope="module")
def transfer_queue():
    import transfer_queue as tq

    # TransferQueue's controller and storage units are Ray actors: declare enough logical CPUs for them
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(smollm2_path())


def put_rollouts(tq, tokenizer, partition: str, rows=None, off_policy=None):
    """Rows as veRL's agent loop stores them: key {uid}_{session}_{index}, nested responses and scores, the
    rollout's and the trainer's log-probs. rows: (uid, session, index, text, reward), text one policy turn or a
    tuple of turns, each followed by a tool's output, reward a number on the policy's last token or a pair on its
    first and last (a format part and an answer part); default one output per session of ANSWERS. off_policy:
    key -> the token positions whose rollout log-probs are far from the trainer's (None: all), for rejection."""
    rows = rows or [
        (uid, s, 0, text, REWARDS[uid][s]) for uid, texts in ANSWERS.items() for s, text in enumerate(texts)
    ]
    off_policy = off_policy or {}
    keys, fields = [], []
    for uid, session, index, text, reward in rows:
        # a multi-turn row: each of the policy's turns, then a tool's output that response_mask leaves out
        tool = tokenizer(f" [tool output {uid} {session}: 42 rows]", add_special_tokens=False)["input_ids"]
        ids, mask = [], []
        for turn in (text,) if isinstance(text, str) else text:
            answer = tokenizer(turn, add_special_tokens=False)["input_ids"]
            ids, mask = ids + answer + tool, mask + [1] * len(answer) + [0] * len(tool)
        scores = torch.zeros(len(ids))
        first, last = reward if isinstance(reward, tuple) else (0.0, reward)
        scores[0] += first
        scores[len(ids) - len(tool) - 1] += last
        key = f"{uid}_{session}_{index}"
        log_probs = torch.full((len(ids),), -1.0)
        rollout_log_probs = log_probs.clone()
        if key in off_policy:
            rollout_log_probs[off_policy[key] if off_policy[key] is not None else slice(None)] -= 3.0
        keys.append(key)
        fields.append(
            {
                "uid": uid,
                "responses": torch.tensor(ids),
                "response_mask": torch.tensor(mask),
                "rm_scores": scores,
                "old_log_probs": log_probs,
                "rollout_log_probs": rollout_log_probs,
            }
        )
    tags = [{"is_padding": False, "seq_len": len(field["responses"]) + 8} for field in fields]  # as the agent loop
    return tq.kv_batch_put(
        keys=keys, fields=list_of_dict_to_tensordict(fields), partition_id=partition, tags=tags
    ), keys


def trainer(tokenizer, rollout_correction=None, estimator="grpo", **setpo):
    algorithm = {
        "adv_estimator": estimator,
        "gamma": 1.0,
        "lam": 1.0,
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
    }
    if rollout_correction:
        algorithm["rollout_correction"] = rollout_correction
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
        assert torch.all(answer == answer[:1]) and torch.all(tool == 0)
        values.append(answer[0].item() if len(answer) else 0.0)  # a padding or rejected row has no answer token left
    return values


def balanced(tokenizer, meta, dp_size: int):
    """veRL's own v1 _balance_batch on the step, for dp_size actor ranks: padding rows up to the batch multiple,
    then every row reordered for equal work per rank, so padding rows land among the real ones."""
    owner = types.SimpleNamespace(
        config=OmegaConf.create(
            {
                "actor_rollout_ref": {"rollout": {"n": 3}, "actor": {"ppo_mini_batch_size": 1}},
                "trainer": {"critic_warmup": 0},
            }
        ),
        use_critic=False,
        global_steps=1,
        tokenizer=tokenizer,
        actor_rollout_wg=types.SimpleNamespace(_dispatch_info={"actor": list(range(dp_size))}),
    )
    owner._get_required_batch_multiple = types.MethodType(PPOTrainer._get_required_batch_multiple, owner)
    return PPOTrainer._balance_batch(owner, meta, metrics={})


def base_and_shaped(tq, tokenizer, name, rows=None, pad_to=None, policy=None, dp_size=None, **kwargs):
    """veRL's own advantages and the plug-in's, each on its own copy of the same step: (base, shaped, metrics, keys).
    policy: more algorithm.setpo settings (the diversity policy); dp_size: balance the step first, as veRL does."""
    results = []
    for setpo in ({}, {"enable": True, "url": kwargs.pop("url"), "weight": WEIGHT, **(policy or {})}):
        partition = f"{name}-{'setpo' if setpo else 'base'}"
        meta, _ = put_rollouts(tq, tokenizer, partition, rows, kwargs.get("off_policy"))
        if pad_to:  # veRL's own synthetic padding rows, as the trainer adds them to make the batch divisible
            meta = upsample_batch_to_divisible_size(meta, pad_to, tokenizer.eos_token_id)
        if dp_size:
            meta = balanced(tokenizer, meta, dp_size)
        metrics = {}
        PPOTrainer._compute_advantage(
            trainer(tokenizer, kwargs.get("rollout_correction"), kwargs.get("estimator", "grpo"), **setpo),
            meta,
            metrics=metrics,
        )
        results.append((dict(zip(meta.keys, advantages_per_row(tq, meta.keys, partition))), metrics, meta.keys))
    (base, _, keys), (shaped, metrics, shaped_keys) = results
    if dp_size:  # each copy was balanced on its own (its padding rows are new): by key, in the shaped copy's order
        return base, shaped, metrics, shaped_keys
    return list(base.values()), list(shaped.values()), metrics, keys


@pytest.mark.parametrize("setpo", [{}, {"enable": False, "url": "http://unused"}], ids=["absent", "off"])
def test_with_setpo_absent_or_off_the_advantage_step_is_verls_own(transfer_queue, tokenizer, setpo):
    assert getattr(PPOTrainer._compute_advantage, "setpo_wrapped", False), "the entry-point plug-in did not install"
    results = []
    for name, step in (("own", PPOTrainer._compute_advantage.__wrapped__), ("plug-in", PPOTrainer._compute_advantage)):
        partition = f"{'off' if setpo else 'absent'}-{name}"
        meta, _ = put_rollouts(transfer_queue, tokenizer, partition)
        metrics: dict = {}
        step(trainer(tokenizer, **setpo), meta, metrics=metrics)
        results.append((advantages_per_row(transfer_queue, meta.keys, partition), metrics))
    (own, own_metrics), (got, metrics) = results
    assert got == own and metrics == own_metrics and not any(name.startswith("setpo/") for name in metrics)


def test_v1_advantage_step_adds_weight_times_marginals_through_transfer_queue(
    transfer_queue, tokenizer, server, client
):
    base, shaped, metrics, _ = base_and_shaped(transfer_queue, tokenizer, "plain", url=server.url)
    marginals = [s for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups for s in g.marginals]
    assert shaped == pytest.approx([b + WEIGHT * s for b, s in zip(base, marginals)], abs=1e-6)
    assert base != pytest.approx(shaped, abs=1e-6)
    assert metrics["setpo/weight"] == WEIGHT and "setpo/set_score_mean" in metrics and metrics["setpo/active"] == 1


def test_verls_padding_rows_are_left_out(transfer_queue, tokenizer, server, client):
    # 6 rows padded to 8: two synthetic rows of one pad{uuid} uid, which must not be sent as a group of 2
    base, shaped, metrics, keys = base_and_shaped(transfer_queue, tokenizer, "padded", pad_to=8, url=server.url)
    assert len(keys) == 8 and keys[-1].startswith("pad")
    marginals = [s for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups for s in g.marginals]
    assert shaped[:6] == pytest.approx([b + WEIGHT * s for b, s in zip(base, marginals)], abs=1e-6)
    assert shaped[6:] == base[6:] and metrics["setpo/unscored_groups"] == 0 and metrics["setpo/fallback_steps"] == 0


def test_a_group_left_short_by_a_failed_session_gets_zero_and_is_counted(transfer_queue, tokenizer, server, client):
    rows = [("p0", 0, 0, ANSWERS["p0"][0], 1.0), ("p0", 2, 0, ANSWERS["p0"][2], 0.0)]  # session 1 failed: 2 of n = 3
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]
    base, shaped, metrics, _ = base_and_shaped(transfer_queue, tokenizer, "short", rows=rows, url=server.url)
    marginals = client.diversity([{"texts": ANSWERS["p1"]}]).groups[0].marginals
    assert shaped[:2] == base[:2] and shaped[2:] == pytest.approx(
        [b + WEIGHT * s for b, s in zip(base[2:], marginals)], abs=1e-6
    )
    assert metrics["setpo/unscored_groups"] == 1 and metrics["setpo/active"] == 1


def test_a_multi_output_session_is_one_member_its_final_output_with_its_bonus_on_every_row(
    transfer_queue, tokenizer, server, client
):
    first_turn = "let me think: 48 halves to 24"
    rows = [("p0", 0, 0, first_turn, 0.0), ("p0", 0, 1, ANSWERS["p0"][0], 1.0)]  # session 0: two outputs, index 1 final
    rows += [("p0", s, 0, ANSWERS["p0"][s], REWARDS["p0"][s]) for s in (1, 2)]
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]
    base, shaped, metrics, _ = base_and_shaped(transfer_queue, tokenizer, "multi", rows=rows, url=server.url)
    marginals = [
        g.marginals for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups
    ]  # groups of n = 3 sessions
    per_row = [marginals[0][0], marginals[0][0], marginals[0][1], marginals[0][2], *marginals[1]]
    assert shaped == pytest.approx([b + WEIGHT * s for b, s in zip(base, per_row)], abs=1e-6)
    assert metrics["setpo/unscored_groups"] == 0


def test_rows_rejected_by_rollout_correction_are_not_sent(transfer_queue, tokenizer, server, client):
    rows = [("p0", s, 0, text, REWARDS["p0"][s]) for s, text in enumerate(ANSWERS["p0"])] + [
        ("p0", 3, 0, "seventy-two", 1.0)
    ]
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]
    correction = {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 1.0}
    base, shaped, metrics, _ = base_and_shaped(
        transfer_queue,
        tokenizer,
        "rejected",
        rows=rows,
        url=server.url,
        off_policy={"p0_3_0": None},
        rollout_correction=correction,
    )
    marginals = [
        g.marginals for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups
    ]  # without the rejected row
    expected = [b + WEIGHT * s for b, s in zip(base, [*marginals[0], 0.0, *marginals[1]])]
    assert shaped == pytest.approx(expected, abs=1e-6) and metrics["setpo/unscored_groups"] == 0


def test_v1_min_reward_scores_sessions_by_their_final_outputs_reward_and_the_controller_steers(
    transfer_queue, tokenizer, server, client
):
    p0 = ["48 / 2 = 24, so 72", "1.5 * 48 = 72", "seventy-two", "it is 74"]
    # session 0 answers in two outputs: its first earns nothing, its final one is correct, so the session is.
    # A correct answer's reward is split over two tokens: only veRL's sum over the response reaches min_reward
    rows = [("p0", 0, 0, "let me think: 48 halves to 24", 0.0), ("p0", 0, 1, p0[0], (0.5, 0.5))]
    rows += [("p0", s, 0, p0[s], reward) for s, reward in ((1, (0.5, 0.5)), (2, (0.5, 0.5)), (3, 0.0))]
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]  # 2 correct: too few
    policy = {"min_reward": 1.0, "normalize": "zscore", "target_ratio": 0.5, "weight_ema": 0.0, "max_weight": 100.0}
    steps = [  # two steps of one run: the controller carries over
        base_and_shaped(transfer_queue, tokenizer, f"scoped-{step}", rows=rows, url=server.url, policy=policy)
        for step in range(2)
    ]
    for base, shaped, metrics, _ in steps:
        groups = [{"texts": p0, "rewards": [1.0, 1.0, 1.0, 0.0]}, {"texts": ANSWERS["p1"], "rewards": REWARDS["p1"]}]
        direct = client.diversity(groups, weight=metrics["setpo/weight"], min_reward=1.0, normalize="zscore")
        p0_bonus, p1_bonus = (g.bonus for g in direct.groups)
        assert p0_bonus[0] != 0 and p0_bonus[3] == 0 and p1_bonus == [0.0, 0.0, 0.0]
        per_row = [p0_bonus[0], *p0_bonus, *p1_bonus]  # session 0's bonus on both its rows
        assert shaped == pytest.approx([b + s for b, s in zip(base, per_row)], abs=1e-6)
    (_, _, first, _), (_, _, second, _) = steps
    assert first["setpo/weight"] == WEIGHT and first["setpo/small_scope_groups"] == 1
    assert second["setpo/weight"] == pytest.approx(WEIGHT * 0.5 / first["setpo/bonus_ratio"], rel=1e-6)
    assert second["setpo/bonus_ratio"] == pytest.approx(0.5, rel=1e-5)


def test_per_token_rejection_leaves_the_text_whole_and_the_bonus_only_on_trained_tokens(
    transfer_queue, tokenizer, server, client
):
    # token_k2 rejects single tokens of p0's second answer: veRL trains on the rest of it, but the answer the
    # policy gave, the member of its group, is still the whole text
    correction = {"rollout_rs": "token_k2", "rollout_rs_threshold": 1.0}
    base, shaped, _, keys = base_and_shaped(
        transfer_queue,
        tokenizer,
        "token-rejected",
        url=server.url,
        off_policy={"p0_1_0": [1, 2]},
        rollout_correction=correction,
    )
    got = transfer_queue.kv_batch_get(keys=keys, partition_id="token-rejected-setpo", select_fields=["response_mask"])
    assert got["response_mask"].unbind()[1][1:3].tolist() == [0, 0]  # veRL did reject the two tokens
    marginals = [s for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups for s in g.marginals]
    assert shaped == pytest.approx([b + WEIGHT * s for b, s in zip(base, marginals)], abs=1e-6)


def test_a_multi_turn_row_is_embedded_as_its_turns_read_with_the_tool_output_left_out(
    transfer_queue, tokenizer, server, client
):
    turns = ("I will ask the calculator", "it says 72")  # run together: "calculatorit"
    rows = [("p0", 0, 0, turns, 1.0)] + [("p0", s, 0, ANSWERS["p0"][s], REWARDS["p0"][s]) for s in (1, 2)]
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]
    base, shaped, _, _ = base_and_shaped(transfer_queue, tokenizer, "turns", rows=rows, url=server.url)
    texts = [["\n".join(turns), *ANSWERS["p0"][1:]], ANSWERS["p1"]]  # one turn a line, as the chat shows them
    marginals = [s for g in client.diversity([{"texts": t} for t in texts]).groups for s in g.marginals]
    assert shaped == pytest.approx([b + WEIGHT * s for b, s in zip(base, marginals)], abs=1e-6)


@pytest.mark.parametrize("estimator", ["rloo", "grpo_vectorized", "opo", "reinforce_plus_plus_baseline"])
def test_under_an_estimator_whose_baseline_counts_every_output_each_output_is_a_member(
    transfer_queue, tokenizer, server, client, estimator
):
    # veRL's v1 step folds a multi-output session into one sample for "grpo" only; rloo and the others compare
    # every output of the prompt, so SetPO's group is every output too
    first_turn = "let me think: 48 halves to 24"
    rows = [("p0", 0, 0, first_turn, 0.0), ("p0", 0, 1, ANSWERS["p0"][0], 1.0)]
    rows += [("p0", s, 0, ANSWERS["p0"][s], REWARDS["p0"][s]) for s in (1, 2)]
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]
    base, shaped, metrics, _ = base_and_shaped(
        transfer_queue, tokenizer, f"rows-{estimator}", rows=rows, url=server.url, estimator=estimator
    )
    texts = [[first_turn, *ANSWERS["p0"]], ANSWERS["p1"]]  # p0: its 4 outputs, as the estimator's baseline has it
    marginals = [s for g in client.diversity([{"texts": t} for t in texts]).groups for s in g.marginals]
    assert shaped == pytest.approx([b + WEIGHT * s for b, s in zip(base, marginals)], abs=1e-6)
    assert metrics["setpo/unscored_groups"] == 0


def test_after_verls_real_balance_padding_among_real_rows_is_left_out_and_a_lone_sample_is_counted(
    transfer_queue, tokenizer, server, client
):
    rows = [(uid, s, 0, text, REWARDS[uid][s]) for uid, texts in ANSWERS.items() for s, text in enumerate(texts)]
    rows.append(("p2", 0, 0, "seventy-two, I think", 1.0))  # a group of 1: its other sessions failed
    base, shaped, metrics, keys = base_and_shaped(
        transfer_queue, tokenizer, "balanced", rows=rows, url=server.url, dp_size=4
    )
    real = [f"{uid}_{s}_0" for uid, texts in ANSWERS.items() for s in range(len(texts))]
    padding = [key for key in keys if key.startswith("pad")]
    assert len(keys) == 12 and len(padding) == 5  # 7 rows up to lcm(4 ranks, 3 a mini-batch)
    assert keys.index(padding[0]) < max(keys.index(key) for key in real)  # reordered: padding among real rows
    marginals = [s for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups for s in g.marginals]
    assert [shaped[key] for key in real] == pytest.approx(
        [base[key] + WEIGHT * s for key, s in zip(real, marginals)], abs=1e-6
    )
    assert shaped["p2_0_0"] == base["p2_0_0"] and all(shaped[key] == 0 for key in padding)
    assert metrics["setpo/unscored_groups"] == 1 and metrics["setpo/scored_groups"] == 2


@pytest.fixture(scope="module")
def small_server():
    """A service that takes groups of at most 3 members."""
    with LocalServer(command=[str(ROOT_VENV_PYTHON), "-m", "setpo_server.cli"], dtype="float32", max_group_size=3) as s:
        yield s


def test_a_group_of_more_outputs_than_the_service_takes_is_fitted_one_member_a_session(
    transfer_queue, tokenizer, small_server, client
):
    """Issue 41, item 4: under rloo a session of 2 outputs makes p0 a group of 4, over the service's 3: the group is
    scored as veRL's GRPO counts it, one member a session (its final output), the bonus on all the session's rows,
    and counted; before, it went unscored on every step."""
    first_turn = "let me think: 48 halves to 24"
    rows = [("p0", 0, 0, first_turn, 0.0), ("p0", 0, 1, ANSWERS["p0"][0], 1.0)]
    rows += [("p0", s, 0, ANSWERS["p0"][s], REWARDS["p0"][s]) for s in (1, 2)]
    rows += [("p1", s, 0, text, REWARDS["p1"][s]) for s, text in enumerate(ANSWERS["p1"])]
    base, shaped, metrics, _ = base_and_shaped(
        transfer_queue, tokenizer, "fitted", rows=rows, url=small_server.url, estimator="rloo"
    )
    marginals = [g.marginals for g in client.diversity([{"texts": t} for t in ANSWERS.values()]).groups]
    session_bonus = [marginals[0][0], *marginals[0], *marginals[1]]  # session 0's bonus on both of its rows
    assert shaped == pytest.approx([b + WEIGHT * s for b, s in zip(base, session_bonus)], abs=1e-6)
    assert metrics["setpo/fitted_groups"] == 1 and metrics["setpo/unscored_groups"] == 0

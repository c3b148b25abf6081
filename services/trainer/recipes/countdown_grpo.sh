#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# SetPO+GRPO on Countdown, Qwen2.5-3B (MODEL_PATH). Paper, section 5.2 and appendix E, Countdown table:
# global batch 128 prompts, G = ROLLOUTS (3 or 7) rollouts, KL = KL (0.001 or 0.005), lr 1e-6, 1 epoch over
# 86400 puzzles, max prompt 512, max response 2048, marginal weight 0.5, reward with the 0.1 format term.
# Training temperature 1.0 (the table lists 1.0 / 0.5 for evaluation only). GRPO alone: --setpo.weight 0.
# The diversity policy is the form experiment v2 recommends (docs/experiments.md): the bonus among correct answers
# only, solutions told apart by their key (hybrid kernel), z-scored, held at half the advantage's RMS (the ratio
# its tested lambda 0.3 kept). SETPO_FORM=paper: the paper's own form (whole group, raw lambda 0.5).
#   python -m setpo_trainer.openrlhf.data countdown --size 86400 --out data/countdown.jsonl
#   ROLLOUTS=7 KL=0.001 MODEL_PATH=Qwen/Qwen2.5-3B DATA_PATH=data/countdown.jsonl SETPO_URL=http://setpo:8000 bash countdown_grpo.sh
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
require ROLLOUTS KL
if ! [[ "$ROLLOUTS" =~ ^[0-9]+$ ]] || [ "$ROLLOUTS" -lt 3 ]; then
    echo "$RECIPE: ROLLOUTS must be a whole number >= 3 (the paper: 3 or 7), got '$ROLLOUTS'" >&2
    exit 2
fi
case "$ROLLOUTS/$KL" in
    3/0.001 | 3/0.005 | 7/0.001 | 7/0.005) ;;
    *) echo "$RECIPE: note: ROLLOUTS=$ROLLOUTS KL=$KL is outside the paper's grid (3|7 x 0.001|0.005)" >&2 ;;
esac

case "${SETPO_FORM:-recommended}" in
    recommended) FORM_FLAGS=(--setpo.min_reward 1.0 --setpo.key countdown_expression --setpo.kernel hybrid
        --setpo.normalize zscore --setpo.target_ratio 0.5) ;;
    paper) FORM_FLAGS=() ;;
    *) echo "$RECIPE: SETPO_FORM must be recommended or paper, got '$SETPO_FORM'" >&2; exit 2 ;;
esac

exec setpo-train "${CLUSTER_FLAGS[@]}" \
    --actor.model_name_or_path "$MODEL_PATH" \
    --data.prompt_dataset "$DATA_PATH" --data.input_key input --data.label_key label --data.max_samples 86400 \
    --reward.remote_url "$(reward_file countdown)" \
    --algo.advantage.estimator group_norm \
    --rollout.n_samples_per_prompt "$ROLLOUTS" --rollout.batch_size 128 --train.batch_size $((128 * ROLLOUTS)) \
    --rollout.micro_batch_size 8 --train.micro_batch_size 4 \
    --train.num_episodes 1 --train.max_epochs 1 \
    --rollout.temperature 1.0 --rollout.max_new_tokens 2048 --data.max_len $((512 + 2048)) \
    --actor.adam.lr 1e-6 --actor.lr_scheduler constant --actor.lr_warmup_ratio 0 \
    --actor.eps_clip 0.2 \
    --algo.kl.init_coef "$KL" --algo.kl.use_loss --algo.kl.estimator k3 \
    --setpo.url "$SETPO_URL" --setpo.weight 0.5 "${FORM_FLAGS[@]}" "${POLICY_FLAGS[@]}" \
    "$@"

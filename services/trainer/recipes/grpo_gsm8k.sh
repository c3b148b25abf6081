#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# SetPO+GRPO on GSM8K, Qwen2.5-Math-1.5B or -7B (MODEL_PATH). Paper, appendix E, table "SetPO+GRPO and GRPO":
# global batch 64 prompts x 6 rollouts, lr 3e-6 constant, KL 1e-4, 2 epochs, temperature 0.9, clip 0.2,
# max response 756, marginal weight 0.05. GRPO alone: the same with --setpo.weight 0.
# The diversity policy is the keyless form experiment v3 recommends (docs/experiments.md; GSM8K has no solution
# key): the bonus among correct answers only, compared by the embedder over the whole response, z-scored, held at
# 0.7 of the advantage's RMS (the ratio its tested lambda 0.3 kept). SETPO_FORM=paper: the paper's own form.
# SETPO_FORM=coverage: MaxRL's advantage and no bonus, what experiment v4's test split supports for reach (pass@64)
# in setpo-train; v4's winner also replays verified answers, which only the TRL plug-in has (docs/diversity.md).
#   python -m setpo_trainer.openrlhf.data gsm8k --out data/gsm8k_train.jsonl
#   MODEL_PATH=Qwen/Qwen2.5-Math-1.5B DATA_PATH=data/gsm8k_train.jsonl SETPO_URL=http://setpo:8000 bash grpo_gsm8k.sh
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

case "${SETPO_FORM:-recommended}" in
    recommended) WEIGHT=0.05 FORM_FLAGS=(--setpo.min_reward 1.0 --setpo.normalize zscore --setpo.target_ratio 0.7) ;;
    paper) WEIGHT=0.05 FORM_FLAGS=() ;;
    coverage) WEIGHT=0 FORM_FLAGS=(--setpo.advantage maxrl) ;;
    *) echo "$RECIPE: SETPO_FORM must be recommended, paper or coverage, got '$SETPO_FORM'" >&2; exit 2 ;;
esac

exec setpo-train "${CLUSTER_FLAGS[@]}" \
    --actor.model_name_or_path "$MODEL_PATH" \
    --data.prompt_dataset "$DATA_PATH" --data.input_key input --data.label_key label --data.apply_chat_template \
    --reward.remote_url "$(reward_file math)" \
    --algo.advantage.estimator group_norm \
    --rollout.n_samples_per_prompt 6 --rollout.batch_size 64 --train.batch_size 384 \
    --rollout.micro_batch_size 8 --train.micro_batch_size 4 \
    --train.num_episodes 2 --train.max_epochs 1 \
    --rollout.temperature 0.9 --rollout.max_new_tokens 756 --data.max_len 2048 \
    --actor.adam.lr 3e-6 --actor.lr_scheduler constant --actor.lr_warmup_ratio 0 \
    --actor.eps_clip 0.2 \
    --algo.kl.init_coef 1e-4 --algo.kl.use_loss --algo.kl.estimator k3 \
    --setpo.url "$SETPO_URL" --setpo.weight "$WEIGHT" "${FORM_FLAGS[@]}" "${POLICY_FLAGS[@]}" \
    "$@"

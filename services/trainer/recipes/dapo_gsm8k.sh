#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# SetPO+DAPO on GSM8K, Qwen2.5-Math-1.5B or -7B (MODEL_PATH). Paper, appendix E, table "SetPO+DAPO and DAPO":
# global batch 64 prompts x 6 rollouts, mini batch 64 prompts, lr 1e-6, KL 1e-4, 2 epochs, temperature 0.9,
# clip-higher 0.2 / 0.28, max response 756, marginal weight 0.2; DAPO's dynamic sampling drops groups whose
# rollouts are all right or all wrong (they are never sent to the service; with SETPO_MIN_REWARD, setpo-train's
# --setpo.keep_groups keeps the all-right ones, where the scoped bonus acts), token-mean loss. DAPO's overlong
# penalty is not in the paper's table: add --reward.overlong_buffer_len N to use it. DAPO alone: --setpo.weight 0.
#   MODEL_PATH=Qwen/Qwen2.5-Math-1.5B DATA_PATH=data/gsm8k_train.jsonl SETPO_URL=http://setpo:8000 bash dapo_gsm8k.sh
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

exec setpo-train "${CLUSTER_FLAGS[@]}" \
    --actor.model_name_or_path "$MODEL_PATH" \
    --data.prompt_dataset "$DATA_PATH" --data.input_key input --data.label_key label --data.apply_chat_template \
    --reward.remote_url "$(reward_file math)" \
    --algo.advantage.estimator group_norm \
    --algo.dynamic_filtering_enable --algo.dynamic_filtering_range 0 1 \
    --rollout.n_samples_per_prompt 6 --rollout.batch_size 64 --train.batch_size 384 \
    --rollout.micro_batch_size 8 --train.micro_batch_size 4 \
    --train.num_episodes 2 --train.max_epochs 1 \
    --rollout.temperature 0.9 --rollout.max_new_tokens 756 --data.max_len 2048 \
    --actor.adam.lr 1e-6 --actor.lr_scheduler constant --actor.lr_warmup_ratio 0 \
    --actor.eps_clip_low_high 0.2 0.28 --actor.loss_agg_mode token-mean \
    --algo.kl.init_coef 1e-4 --algo.kl.use_loss --algo.kl.estimator k3 \
    --setpo.url "$SETPO_URL" --setpo.weight 0.2 "${POLICY_FLAGS[@]}" \
    "$@"

#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# SetPO+GRPO on Math-Hard (SimpleRL-Zoo's hard subset: MATH levels 3-5), Qwen2.5-32B (MODEL_PATH). Paper,
# section 5.3 and appendix E, 32B table: global batch 1024 prompts x 6 rollouts, PPO mini batch 256 prompts
# (4 updates a rollout), lr 1e-6, KL 1e-3, 15 epochs, clip 0.2, max response 4096, marginal weight 0.1.
# Temperature: the table says 1, the text 0.1; we follow the table (TEMPERATURE=0.1 for the text's value).
# Default cluster: 4 nodes x 8 GPUs, vLLM engines of 4 GPUs (VLLM_TP).
#   python -m setpo_trainer.openrlhf.data math-hard --out data/math_hard.jsonl
#   NODES=4 MODEL_PATH=Qwen/Qwen2.5-32B DATA_PATH=data/math_hard.jsonl SETPO_URL=http://setpo:8000 bash math_hard_32b.sh
NODES=${NODES:-4}
VLLM_TP=${VLLM_TP:-4}
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

exec setpo-train "${CLUSTER_FLAGS[@]}" --ds.adam_offload \
    --actor.model_name_or_path "$MODEL_PATH" \
    --data.prompt_dataset "$DATA_PATH" --data.input_key input --data.label_key label --data.apply_chat_template \
    --reward.remote_url "$(reward_file math)" \
    --algo.advantage.estimator group_norm \
    --rollout.n_samples_per_prompt 6 --rollout.batch_size 1024 --train.batch_size 1536 \
    --rollout.micro_batch_size 4 --train.micro_batch_size 1 \
    --train.num_episodes 15 --train.max_epochs 1 \
    --rollout.temperature "${TEMPERATURE:-1.0}" --rollout.max_new_tokens 4096 --data.max_len 5120 \
    --actor.adam.lr 1e-6 --actor.lr_scheduler constant --actor.lr_warmup_ratio 0 \
    --actor.eps_clip 0.2 \
    --algo.kl.init_coef 1e-3 --algo.kl.use_loss --algo.kl.estimator k3 \
    --setpo.url "$SETPO_URL" --setpo.weight 0.1 "${POLICY_FLAGS[@]}" \
    "$@"

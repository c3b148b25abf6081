# shellcheck shell=bash
# Sourced by the recipes. Inputs are environment variables (a KubeRay RayJob sets them):
#   MODEL_PATH  the policy to train (HF folder or hub id)         required
#   DATA_PATH   an OpenRLHF prompt file from `python -m setpo_trainer.openrlhf.data ...`   required
#   SETPO_URL   the setpo service, e.g. http://setpo:8000          required
#               (several replicas comma-separated: http://a:8000,http://b:8000)
#   SAVE_PATH   where the trained model and TensorBoard logs go   (default: ./ckpt/<recipe>)
#   NODES, GPUS_PER_NODE   the Ray cluster's GPU nodes            (default: 1 x 8)
#   WANDB_API_KEY          log to Weights & Biases too            (optional; read from the environment only)
#   SETPO_API_KEY          the service's key                      (optional; read from the environment only)
# The diversity policy, each variable one --setpo.* flag (optional; unset or empty: the flag is not passed and
# the recipe's form holds: the paper's, except countdown_grpo.sh's and grpo_gsm8k.sh's, SETPO_FORM). docs/diversity.md:
#   SETPO_MIN_REWARD    --setpo.min_reward     score only responses with this reward or more (1.0: correct)
#   SETPO_KEY           --setpo.key            solution key function: countdown_expression or package.module:function
#   SETPO_KERNEL        --setpo.kernel         embedding | hybrid | key
#   SETPO_NORMALIZE     --setpo.normalize      none | zscore
#   SETPO_EMBED_SPAN    --setpo.embed_span     embed only the last match of this regular expression of each text
#   SETPO_ADVANTAGE     --setpo.advantage      framework | maxrl | w_reinforce: how 0/1 rewards become advantages
#   SETPO_POSITIVE_WEIGHT  --setpo.positive_weight  w_reinforce's weight on correct answers
#   SETPO_COMBINE       --setpo.combine        add | reshare: the bonus re-shares the base's positive push (zscore)
#   SETPO_TARGET_RATIO  --setpo.target_ratio   steer lambda to RMS(bonus) / RMS(advantage); the recipe's lambda starts it
#   SETPO_MIN_WEIGHT, SETPO_MAX_WEIGHT, SETPO_WEIGHT_EMA, SETPO_WARMUP_STEPS, SETPO_FREEZE_AFTER
#                       --setpo.min_weight, ... the controller's bounds, averaging, warm-up and freeze
# Passed the same way, though not the diversity policy:
#   SETPO_IN_FLIGHT     --setpo.in_flight      a step's requests in flight at once (default: one per replica)
#   SETPO_KEEP_GROUPS   --setpo.keep_groups    on | off: keep DAPO's all-correct groups (default: on with min_reward)
# Any argument given to a recipe is passed on to setpo-train after the recipe's own flags, so it wins.
set -euo pipefail

RECIPE=$(basename "$0" .sh)

require() {
    local name
    for name in "$@"; do
        if [ -z "${!name:-}" ]; then
            echo "$RECIPE: set $name (see services/trainer/recipes/common.sh for every input)" >&2
            exit 2
        fi
    done
}

reward_file() {  # the OpenRLHF reward function file of setpo_trainer: math or countdown
    python -c "from setpo_trainer.openrlhf.rewards import path; print(path('$1'))"
}

require MODEL_PATH DATA_PATH SETPO_URL
SAVE_PATH=${SAVE_PATH:-./ckpt/$RECIPE}
NODES=${NODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

# The diversity policy (and in_flight) from the environment, as flags placed after the recipe's --setpo.weight and
# before the recipe's own arguments (so an argument still wins). setpo-train checks the values, as it checks its flags.
POLICY_FLAGS=()
for name in min_reward key kernel normalize embed_span advantage positive_weight combine target_ratio min_weight max_weight weight_ema warmup_steps freeze_after in_flight keep_groups; do
    variable=SETPO_${name^^}
    if [ -n "${!variable:-}" ]; then
        POLICY_FLAGS+=("--setpo.$name" "${!variable}")
    fi
done

# Where things run, for every recipe: actor and reference share the GPUs with the vLLM engines (colocate_all,
# sleep modes), DeepSpeed ZeRO-3 in bf16, packed samples. VLLM_TP: GPUs per vLLM engine.
VLLM_TP=${VLLM_TP:-1}
CLUSTER_FLAGS=(
    --actor.num_nodes "$NODES" --actor.num_gpus_per_node "$GPUS_PER_NODE"
    --ref.num_nodes "$NODES" --ref.num_gpus_per_node "$GPUS_PER_NODE"
    --vllm.num_engines $((NODES * GPUS_PER_NODE / VLLM_TP)) --vllm.tensor_parallel_size "$VLLM_TP"
    --vllm.gpu_memory_utilization 0.6 --vllm.enable_sleep --ds.enable_sleep --train.colocate_all
    --ds.zero_stage 3 --ds.param_dtype bf16 --actor.gradient_checkpointing_enable --ds.packing_samples
    --ckpt.output_dir "$SAVE_PATH" --ckpt.path "$SAVE_PATH/checkpoints" --ckpt.save_steps 50 --ckpt.save_hf
    --logger.tensorboard_dir "$SAVE_PATH/tensorboard" --logger.wandb.project setpo --logger.wandb.run_name "$RECIPE"
)
# Secrets stay in the environment: a key on a command line is in `ps`, in OpenRLHF's printed arguments and in
# W&B's run config. `--logger.wandb.key env` turns W&B on; W&B itself reads WANDB_API_KEY.
if [ -n "${WANDB_API_KEY:-}" ]; then
    CLUSTER_FLAGS+=(--logger.wandb.key env)
fi

#!/usr/bin/env bash
# The CPU LLM experiment end to end (docs/experiments.md): one setpo service, GRPO and SetPO+GRPO training
# through the TRL plug-in, then setpo-eval of both on 30 held-out puzzles, 8 samples each. ~1 hour on 2 cores.
# Needs .venv-trl (make test-trl builds it) and the root .venv (make venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/llm_cpu}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PORT=${PORT:-8765}
mkdir -p "$OUT"
SETPO_PORT=$PORT .venv/bin/setpo-server > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER' EXIT
until curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null; do
  kill -0 $SERVER 2> /dev/null || { echo "setpo-server exited; see $OUT/server.log" >&2; exit 1; }
  sleep 1
done
for method in grpo setpo; do
  .venv-trl/bin/python experiments/llm_cpu/train_trl.py --method $method --out "$OUT" --setpo-url "http://127.0.0.1:$PORT"
done
for method in grpo setpo; do
  .venv/bin/setpo-eval run --model "$OUT/$method/model" --dataset "$OUT/eval_problems.jsonl" --kind countdown --limit 30 \
    --n 8 --temperature 1.0 --top-p 1.0 --max-new-tokens 96 --chat no --method $method --out "$OUT/eval_$method" \
    --setpo-url "http://127.0.0.1:$PORT"
done
.venv/bin/setpo-eval compare "$OUT/eval_grpo" "$OUT/eval_setpo" --out "$OUT/compare"

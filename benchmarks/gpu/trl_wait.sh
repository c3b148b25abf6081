#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .gpu/ carried (`.venv-trl/bin/python -m benchmarks.gpu.prepare
# --trl` here first): what of SetPO's time a real TRL GRPO step waits for (benchmarks/trl_wait.py), with a policy of
# Qwen2.5-Math-1.5B's shape (benchmarks/gpu/policy_shaped.py) and the service on the same GPU, first with MiniLM
# (float16), then with the Qwen3-Embedding-0.6B-shaped model (bfloat16, 65536 tokens a pass). Logs and JSON in OUT_DIR.
#   bash benchmarks/gpu/trl_wait.sh OUT_DIR
set -uo pipefail
out=${1:?usage: trl_wait.sh OUT_DIR}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/core:$PWD/clients/python:$PWD/services/embedding_server:$PWD/services/trainer
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
python3 -c "import torch, transformers, trl, pyarrow; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'pyarrow', pyarrow.__version__)"
python3 -m benchmarks.gpu.policy_shaped /tmp/policy --tokenizer .gpu/smollm2-tokenizer 2>&1 | tail -1
step=(--device cuda --model /tmp/policy --rows .gpu/gsm8k.jsonl --prompts 16 --generations 8 --max-completion 384)
# the summary lines and any failure; TRL's per-step dicts are in the log and the JSON
shown() { tee "$1" | grep --line-buffered -E "wait_s / time_s|wrote|Error|Traceback|^  File"; }
timeout 240 python3 -m benchmarks.trl_wait "${step[@]}" --steps 3 --service model=.gpu/minilm-f16 \
  --out "$out/trl_wait_minilm.json" 2>&1 | shown "$out/trl_wait_minilm.log"
python3 -c "import torch; from pathlib import Path; from benchmarks.gpu.qwen_shaped import build; build(Path('/tmp/qwen'), Path('.gpu/minilm-f16'), 1024, torch.bfloat16)" 2>&1 | tail -1
timeout 170 python3 -m benchmarks.trl_wait "${step[@]}" --steps 2 --service model=/tmp/qwen --service dtype=bfloat16 \
  --service max_batch_tokens=65536 --out "$out/trl_wait_qwen.json" 2>&1 | shown "$out/trl_wait_qwen.log"

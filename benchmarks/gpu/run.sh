#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .gpu/ (benchmarks/gpu/prepare.py) carried along:
#   bash benchmarks/gpu/run.sh OUT_DIR [DEADLINE_S [ARGS...]]
# Installs the carried wheels, checks every section at toy sizes (a broken one stops here, cheaply; QUICK=0
# skips that where the same sections just passed `--quick` on a CPU), then measures with ARGS (python -m
# benchmarks.gpu --help); logs and gpu.json land in OUT_DIR.
set -euo pipefail
out=${1:?usage: run.sh OUT_DIR [DEADLINE_S]}
deadline=${2:-400}
shift $(($# < 2 ? $# : 2))
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
lscpu | grep -E "Model name|^CPU\(s\)" || true
# whether this host's CPU runs bfloat16 natively: a quiet CPU for issue 29's measurement if it does
echo "cpu bf16 flags: $(grep -o -w -E 'amx_bf16|avx512_bf16|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/core:$PWD/clients/python:$PWD/services/embedding_server:$PWD/services/trainer
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
quiet() { grep --line-buffered -v -E "Loading weights|Writing model|Token indices sequence"; }
# the toy run exits non-zero if a section failed, and pipefail ends the script there
if [[ ${QUICK:-1} != 0 ]]; then
  python3 -m benchmarks.gpu --quick --rounds 1 --sections loo service qwen stages arenas --out "$out/quick" 2>&1 | quiet | tee "$out/quick.log"
fi
python3 -m benchmarks.gpu --deadline "$deadline" --out "$out/full" "$@" 2>&1 | quiet | tee "$out/full.log"

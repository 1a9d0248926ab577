#!/usr/bin/env bash
# The GPU path in one prepared run, for a machine with a CUDA device (e.g. a lent H100/H200):
#   1. tests/gpu: CUDA fp32 == CPU and == transformers, grouped-GEMM experts == loop (bf16), autocast, compiled
#      blocks == eager, engine == naive and speculative == greedy, a 3-step pretrain with MFU;
#   2. bench/train_step.py on CUDA (bf16 autocast): our whole step vs transformers + AdamW, same weights;
#   3. MFU at a real width: GLM-4.5-Air's layers (hidden 4096, 128 experts top-8), 2 of them + the MTP layer,
#      4K context, synthetic tokens, 20 steps, eager and compiled (the log prints tok/s and MFU per step).
#
#     bash bench/device_check.sh            # figures under $OUT (default runs/device_check)
#
# Expects the repository's environment (.venv from `make install` on the CPU box does not carry CUDA torch:
# on the GPU machine install torch with CUDA first, then `pip install -e ".[dev]"`).
set -uo pipefail
OUT=${OUT:-runs/device_check}
PY=${PY:-python}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
$PY -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt"
$PY bench/train_step.py --json --repeats 10 2>&1 | tail -1 | tee "$OUT/train_step.json"
for compile in off on; do
  $PY -m glmstack.cli pretrain tiny --set model=glm-4.5-air --set model_overrides.num_hidden_layers=2 \
    --set seq_len=4096 --set micro_batch_size=2 --set steps=20 --set compile=$compile --set data.kind=synthetic \
    --set log.val_every=0 --set log.plots=false --set ckpt.every=0 --set schedule.batch_warmup_tokens=0 \
    --set "out_dir=$OUT/mfu_compile_$compile" 2>&1 | tail -5 | tee "$OUT/mfu_compile_$compile.txt"
done
echo "figures in $OUT"

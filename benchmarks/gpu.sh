#!/usr/bin/env bash
# The GPU table in one command (one H100/H200, under 10 minutes): the GPT-Neo train step at T=2048 in bf16 for the
# 125M and 1.3B shapes next to transformers' PyTorch GPT-Neo (bf16 autocast, torch.compile), the 2.7B shape
# alone (compile time and memory; scanned, full remat), and KV-cached decoding at batch 1 and 16 next to
# transformers' generate with a static cache. Every table states the device, the load and the settings.
#     bash benchmarks/gpu.sh 2>&1 | tee gpu_table.txt
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/train_step.py --shape 125M --seq 2048 --batch 8 --precision bfloat16 --steps 10 --torch-compile
python benchmarks/train_step.py --shape 1.3B --seq 2048 --batch 4 --precision bfloat16 --steps 5 --torch-compile
# 2.7B scanned with full rematerialisation: on XLA:CPU's plan only that fits 80 GB (55.9 GiB; unrolled, remat
# saves nothing there: 184 GiB), see the README's Speed section.
python benchmarks/train_step.py --shape 2.7B --seq 2048 --batch 4 --precision bfloat16 --steps 3 \
    --remat full --scan --no-peer
python benchmarks/generate.py --config configs/gpt_neo_125M.json --precision bfloat16 --batch-sizes 1,16 \
    --prompt-tokens 32 --new-tokens 256 --static-cache
python benchmarks/generate.py --config configs/gpt_neo_1.3B.json --precision bfloat16 --batch-sizes 1,16 \
    --prompt-tokens 32 --new-tokens 256 --static-cache

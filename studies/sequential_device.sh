#!/usr/bin/env bash
# On the GPU machine: the sequential design's A/A at `ci` on CPU lanes (validity.py --max-replicates), and
# beside it the CUDA tests, within one call.
#   bash studies/sequential_device.sh OUT N_SWEEPS LANES SEED_BASE DEADLINE_S
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1 n=$2 lanes=$3 seed=$4 deadline=$5
source benchmarks/device_setup.sh || exit 1
mkdir -p "$out/val"
nproc; nvidia-smi --query-gpu=name --format=csv,noheader
PERCEPTION_VALIDITY_RESULTS=$out/val timeout "$deadline" python3 studies/validity.py aa --experiment ci \
  --n "$n" --max-replicates 2 --parallel "$lanes" --cpu-workers 1 --seed-base "$seed" --budget-s $((deadline - 200)) \
  2>&1 | tr '\r' '\n' | grep -v " sweeps: " > "$out/val.log" &
SECONDS=0
{ python3 -m perception.ops.build && echo "build: ${SECONDS} s" &&
  timeout $((deadline - SECONDS - 20)) python3 -m pytest -q -m cuda -p no:cacheprovider -n 0 \
    tests/data/test_prefetch.py tests/train/test_evaluate.py tests/ops tests/model; echo "tests: ${SECONDS} s"; } \
  > "$out/cuda_tests.log" 2>&1
wait
tail -5 "$out/cuda_tests.log"; tail -8 "$out/val.log"

#!/usr/bin/env bash
# On a CUDA machine: build the extension, run the CUDA op tests, then each op family's benchmark.
#   bash benchmarks/gpu_check.sh [results-dir] [benchmarks/ops_pool.py arguments...]
# Writes ops_tests.log, ops_pool.json|md and ops_cfc.json|md into results-dir (default benchmarks/results)
# and exits with the tests' status, or the first benchmark's failure. Needs torch with CUDA, nvcc, ninja,
# pytest and hypothesis; nothing else.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
SECONDS=0
python3 -m perception.ops.build || exit 1
echo "build: ${SECONDS} s"
python3 -m pytest -q -m cuda -p no:cacheprovider tests/ops 2>&1 | tee "$out/ops_tests.log"
status=${PIPESTATUS[0]}
echo "tests: ${SECONDS} s"
python3 benchmarks/ops_pool.py --out "$out/ops_pool.json" "$@" || status=$(( status ? status : 1 ))
echo "pool benchmark: ${SECONDS} s"
python3 benchmarks/ops_cfc.py --out "$out/ops_cfc.json" || status=$(( status ? status : 1 ))
echo "cfc benchmark: ${SECONDS} s"
exit "$status"

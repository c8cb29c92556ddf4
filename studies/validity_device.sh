#!/usr/bin/env bash
# On the GPU machine: install the carried wheels and the package, then run validity tests.
#   bash studies/validity_device.sh OUT "aa --n 40 ..." ["&no_signal --n 20 ..."] ...
# Each argument after OUT is one `studies/validity.py` invocation, run in turn; one that starts with
# "&" runs beside the next ones (e.g. GPU lanes beside CPU lanes, on disjoint seeds). Results go to OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
source benchmarks/device_setup.sh || exit 1
mkdir -p "$out"
[ -f studies/results/validity_runs.jsonl ] && cp studies/results/validity_runs.jsonl "$out/"
export PERCEPTION_VALIDITY_RESULTS=$out
nproc; nvidia-smi --query-gpu=name --format=csv,noheader
lscpu | grep "Model name"
run_one() { python3 studies/validity.py $1 2>&1 | tr '\r' '\n' | grep -v " sweeps: " | tail -20 > "$out/log-$2.txt"; }
i=0
for call in "$@"; do
  i=$((i + 1))
  if [ "${call:0:1}" = "&" ]; then
    echo "== (beside) validity.py ${call:1}"; run_one "${call:1}" "$i" &
  else
    echo "== validity.py $call"; run_one "$call" "$i"
  fi
done
wait
cat "$out"/log-*.txt
cp perception/gate/noise/*.json "$out/" 2>/dev/null || true

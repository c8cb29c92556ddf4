#!/usr/bin/env bash
# On the GPU machine: install the carried wheels and the package, then run validity tests.
#   bash benchmarks/validity_device.sh OUT "aa --n 40 ..." ["&no_signal --n 20 ..."] ...
# Each argument after OUT is one `benchmarks/validity.py` invocation, run in turn; one that starts with
# "&" runs beside the next ones (e.g. GPU lanes beside CPU lanes, on disjoint seeds). Results go to OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# The package from this tree, as an install lays it out (conf/ and workflows/ inside it), and its commands.
ln -sfn ../conf perception/conf && ln -sfn ../workflows perception/workflows
mkdir -p /tmp/site/bin
while read -r name module; do
  printf '#!/bin/sh\nexec python3 -m %s "$@"\n' "$module" > "/tmp/site/bin/$name" && chmod +x "/tmp/site/bin/$name"
done <<'COMMANDS'
perception-sweep perception.sweep.cli
perception-train perception.train.cli
perception-data perception.train.data_cli
perception-gate perception.gate.cli
COMMANDS
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
perception-sweep --help >/dev/null || { echo "perception-sweep does not start"; exit 1; }
mkdir -p "$out"
[ -f benchmarks/results/validity_runs.jsonl ] && cp benchmarks/results/validity_runs.jsonl "$out/"
export PERCEPTION_VALIDITY_RESULTS=$out
nproc; nvidia-smi --query-gpu=name --format=csv,noheader
lscpu | grep "Model name"
run_one() { python3 benchmarks/validity.py $1 2>&1 | tr '\r' '\n' | grep -v " sweeps: " | tail -20 > "$out/log-$2.txt"; }
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

#!/usr/bin/env bash
# On the GPU machine: this tree's CfC kernels (B) against another tree's (A), on one GPU in one call.
#   bash benchmarks/cfc_ab.sh OUT A   # A: the other tree, a directory or a tar of its sources (git archive REV -o
#                                     # a.tar perception benchmarks conf workflows pyproject.toml, carried)
# Builds both extensions side by side; records benchmarks/cfc_bits.py's digests in each and compares them (a change
# that keeps the arithmetic and its order must give the same bits); times benchmarks/ops_cfc.py in each, A first;
# runs the CfC CUDA tests and benchmarks/cfc_phases.py (the step's phases, a model built from this tree's
# kernel parts) in this tree. Needs the carried wheels in .whl/ (DESIGN §8). Writes OUT/{cfc_bits,ops_cfc}_{a,b}.json
# (ops_cfc's with its .md table), OUT/cfc_phases.json|md, OUT/cfc_bits.log and OUT/cuda_tests_cfc.log; exits 1
# when a build, the tests or the comparison fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "$1") other=$2
mkdir -p "$out"
a=$(mktemp -d /tmp/cfc-ab-a.XXXX)
if [ -d "$other" ]; then cp -r "$other"/. "$a"/; else tar xf "$other" -C "$a"; fi
cp benchmarks/cfc_bits.py "$a"/benchmarks/  # one measure for both
source benchmarks/device_setup.sh || exit 1
(cd "$a" && ln -sfn ../conf perception/conf && ln -sfn ../workflows perception/workflows)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SECONDS=0
python3 -m perception.ops.build > "$out/build_b.log" 2>&1 & built_b=$!
(cd "$a" && PYTHONPATH="$a:/tmp/site" python3 -m perception.ops.build > "$out/build_a.log" 2>&1) & built_a=$!
wait $built_b || { tail -20 "$out/build_b.log"; exit 1; }
wait $built_a || { tail -20 "$out/build_a.log"; exit 1; }
echo "builds: ${SECONDS} s"
in_a() { (cd "$a" && PYTHONPATH="$a:/tmp/site" "$@"); }
status=0
in_a timeout 120 python3 benchmarks/cfc_bits.py --out "$out/cfc_bits_a.json" > "$out/cfc_bits.log" 2>&1
timeout 120 python3 benchmarks/cfc_bits.py --out "$out/cfc_bits_b.json" >> "$out/cfc_bits.log" 2>&1
python3 benchmarks/cfc_bits.py --compare "$out/cfc_bits_a.json" "$out/cfc_bits_b.json" 2>&1 | tee -a "$out/cfc_bits.log" | tail -4
status=$(( status ? status : PIPESTATUS[0] ))
timeout 200 python3 -m pytest -q -m cuda -p no:cacheprovider tests/ops/test_cuda_cfc.py > "$out/cuda_tests_cfc.log" 2>&1
status=$(( status ? status : $? )); tail -1 "$out/cuda_tests_cfc.log"
in_a timeout 150 python3 benchmarks/ops_cfc.py --eager-reps 1 --out "$out/ops_cfc_a.json" 2>&1 | grep "| cuda"
timeout 150 python3 benchmarks/ops_cfc.py --eager-reps 1 --out "$out/ops_cfc_b.json" 2>&1 | grep "| cuda"
echo "timed: ${SECONDS} s"
timeout 250 python3 benchmarks/cfc_phases.py --out "$out/cfc_phases.json" 2>&1 | grep "product kernel" || status=1
echo "phases: ${SECONDS} s"
exit "$status"

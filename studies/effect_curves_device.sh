#!/usr/bin/env bash
# On the GPU machine: per_horizon and shared_skip learning curves on one world, every setting's two
# trainings side by side on the one GPU (fold 0), each cut at LIMIT seconds; then
#   python studies/effect_curves.py OUT --settings SETTINGS     (here, on what came back)
#   bash studies/effect_curves_device.sh OUT LIMIT SETTINGS [WORLD] [SEED]
# SETTINGS: lines "NAME|overrides"; overrides starting with NULL train in WORLD's null twin.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; limit=$2; settings=$3; world=${4:-per_horizon_extremes}; seed=${5:-72000}
source benchmarks/device_setup.sh || exit 1
export PERCEPTION_OPS_JIT=0 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python3 -m perception.ops.build > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
common="experiment=ci trainer.progress=false trainer.eval_batch_size=512 data.fold=0 seed=$seed data.synthetic_seed=$seed"
while IFS='|' read -r name overrides; do
  w=$world
  [[ $overrides == NULL* ]] && { w=${world}_null; overrides=${overrides#NULL }; }
  for arm in per_horizon shared_skip; do
    ( PERCEPTION_HOME=/tmp/curves-$name timeout "$limit" perception-train arm=$arm $common data.synthetic_world=$w $overrides 2>&1 \
      | grep --line-buffered " epoch " | while read -r line; do echo "$(date +%s) $line"; done > "$out/$name.$arm.log" ) &
  done
done < "$settings"
wait

#!/usr/bin/env bash
# On the GPU machine: the known yes's power and its twin's false ships at one scale, 15 trainings
# sharing GPU 0 (one CPU core each).
#   lane A: the A/A noise file of this scale (10 calibrate sweeps side by side; kept once shipped in
#           perception/gate/noise/), then the three-arm sweeps in per_horizon_extremes_null (10 at a time);
#   lane B: the three-arm sweeps in per_horizon_extremes (5 at a time), decided once the noise file is
#           there (a sweep outlasts the calibration).
# The checkout is copied to WORK/src first: a later device call re-syncs the checkout and would drop the
# links device_setup.sh makes under a running sweep.
# Everything resumes: the noise file is kept once written, validity.py skips the sweeps its runs file
# holds. Long: start it in its own session and collect while it runs.
#   setsid nohup bash studies/extremes_device.sh WORK > WORK.log 2>&1 < /dev/null &
#   bash studies/extremes_device.sh --collect WORK OUT   # copies what is done so far to OUT
#   SEQUENTIAL=R N=16 PARALLEL=16 SEED=86000 bash studies/extremes_device.sh WORK   # the known yes as a sequential study
#     of up to R waves, N sweeps PARALLEL at a time, decided with the shipped noise file; no twin, no calibration
set -uo pipefail
cd "$(dirname "$0")/.."
SCALE="data.n_snapshots=240000 model.d_model=32 model.vsn.d_var=8 model.mamba.d_state=16 model.mamba.headdim=16
trainer.batch_size=256 trainer.eval_batch_size=512 trainer.lr=2e-3 trainer.epochs=4 trainer.max_train_batches=null"
SCALE=$(echo $SCALE)

if [ "${1:-}" = "--collect" ]; then
  work=$2 out=$3
  mkdir -p "$out"
  cp "$work"/results/validity_runs.jsonl "$work"/noise/*.json "$out"/ 2>/dev/null
  for f in "$work"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "^$" | tail -4; done
  grep -h '"test": "extremes' "$work"/results/validity_runs.jsonl 2>/dev/null \
    | python3 -c 'import sys,json,collections; c=collections.Counter((r["test"],r.get("decision"),r.get("attribution"),bool(r.get("training_noise"))) for r in map(json.loads,sys.stdin)); [print(k,v) for k,v in sorted(c.items(),key=str)]'
  exit 0
fi

work=$1
mkdir -p "$work"/results "$work"/noise
# run from a copy: a later call re-syncs the checkout, which drops the links device_setup.sh makes
if [ "$PWD" != "$work/src" ]; then
  rm -rf "$work/src" && cp -a . "$work/src" && cd "$work/src" || exit 1
fi
source benchmarks/device_setup.sh || exit 1
python3 -m perception.ops.build || exit 1
[ -f studies/results/validity_runs.jsonl ] && [ ! -f "$work"/results/validity_runs.jsonl ] \
  && cp studies/results/validity_runs.jsonl "$work"/results/
export CUDA_VISIBLE_DEVICES=0 PERCEPTION_OPS_JIT=0 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PERCEPTION_VALIDITY_RESULTS=$work/results PERCEPTION_GATE_NOISE_DIR=$work/noise
noise=$work/noise/ci_extremes.json
[ -f perception/gate/noise/ci_extremes.json ] && cp -n perception/gate/noise/ci_extremes.json "$noise"  # measured earlier
world=data.synthetic_world=per_horizon_extremes
nproc; nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"

if [ -n "${SEQUENTIAL:-}" ]; then
  [ -f "$noise" ] || { echo "no noise file $noise: run the calibration first"; exit 1; }
  python3 studies/validity.py extremes --experiment ci --n "${N:-16}" --gpus 1 --parallel "${PARALLEL:-16}" \
    --max-replicates "$SEQUENTIAL" --seed-base "${SEED:-86000}" $SCALE > "$work"/laneS.log 2>&1
  echo "extremes_device: done"
  exit 0
fi

(
  if [ ! -f "$noise" ]; then
    export PERCEPTION_HOME=$work/calibrate
    printf '%s\n' shared:9000{0..4} per_horizon:9000{0..4} | xargs -P 10 -I{} sh -c 'a=${1%:*}; s=${1#*:};
      perception-sweep calibrate --experiment ci --arms $a --seed-base $s --sweeps 1 --no-write \
        trainer.progress=false '"$world $SCALE"' > '"$work"'/calibrate-$a-$s.txt 2>&1' _ {}
    perception-sweep calibrate --experiment ci --sweeps 5 --out "$noise" trainer.progress=false $world $SCALE \
      || exit 1
  fi
  python3 studies/validity.py extremes_null --experiment ci --n 20 --gpus 1 --parallel 10 $SCALE
) > "$work"/laneA.log 2>&1 &
# the power sweeps beside the calibration: decided after it (a sweep outlasts it)
python3 studies/validity.py extremes --experiment ci --n 20 --gpus 1 --parallel 5 $SCALE > "$work"/laneB.log 2>&1 &
wait
echo "extremes_device: done"

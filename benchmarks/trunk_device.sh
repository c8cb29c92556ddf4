#!/usr/bin/env bash
# On the GPU machine: the trunk's speed, quality and determinism checks.
#   bash benchmarks/trunk_device.sh OUT speed     # build the extension, train_step.py, CUDA tests
#     (env: PRECISIONS, COMPILED, CHUNKS, FLA, MAMBA, FUSED_GRN, FOLD_EMBED, FUSED_GRN_FOLDED, FUSED_GRN_SSD, PROJECT, REF_REPS, GRAPH as train_step.py's flags; TRAIN_S=0
#     skips it; TEST_S=0 skips the CUDA tests beyond the CfC's, CUDA_TESTS narrows them; GRN=1 the fused GRN's (GRN_PRECISIONS, VSN_FORMS its VSN rows); LOOP=1 also runs
#     benchmarks/train_loop.py; SSD=1 also runs benchmarks/trunk_forms.py ssd; CFC=0 skips the CfC tests and table)
#   bash benchmarks/trunk_device.sh OUT quality   # model_step.py at the fast setting, precision_quality.py
#     (env: LOCAL_SETTINGS, SETTING_SEEDS (seeds per setting at local scale, paired verdict from 2), LOCAL_S;
#     PARALLEL (local runs at once, default 10), SEED (the first seed, default 0); MODEL_STEP=0 and
#     PRODUCTION_S=0 skip model_step.py and the production-K runs; PRODUCTION_SETTINGS, PRODUCTION_SEEDS (fp32 seeds),
#     PRODUCTION_SETTING_SEEDS, PRODUCTION_PARALLEL, PRODUCTION_TAG for those runs, e.g. the mamba SSD's check:
#     MODEL_STEP=0 LOCAL_S=0 PRODUCTION_S=560 PRODUCTION_SETTINGS=bf16+compiled+mamba PRODUCTION_SEEDS=5
#     PRODUCTION_SETTING_SEEDS=5 PRODUCTION_PARALLEL=4 PRODUCTION_TAG=quality_mamba_seeds0-4 SEED=0 ... quality;
#     PRODUCTION_FP32_FROM=ROWS.jsonl pairs the settings with that file's fp32 runs instead of training them: on an
#     H100, ten seeds of one setting in about 3 minutes, e.g. MODEL_STEP=0 LOCAL_S=0 PRODUCTION_S=300
#     PRODUCTION_SETTINGS=bf16+compiled+mamba+fusedgrn PRODUCTION_SEEDS=10 PRODUCTION_SETTING_SEEDS=10
#     PRODUCTION_PARALLEL=5 PRODUCTION_FP32_FROM=studies/results/precision_quality_production_short_final.rows.jsonl
#     PRODUCTION_TAG=precision_quality_production_short_fusedgrn ... quality)
#   bash benchmarks/trunk_device.sh OUT fusion    # trunk_forms.py fusion (the fused forms before/after), compile_check.py
#   bash benchmarks/trunk_device.sh OUT determinism   # determinism.py: 10 fresh processes per setting at B = 8, 3 at B = 64
#     (env: SETTINGS, e.g. "bf16+compiled bf16+compiled+mamba"; DET_S, DET_B64_S the two runs' limits in seconds,
#     DET_B64_PARALLEL the B = 64 processes at once, default 3: about 11 GiB each)
#   the mamba SSD in one call: MAMBA=tf32,bf16 CFC=0 CUDA_TESTS=tests/model/test_ssd_mamba.py bash benchmarks/trunk_device.sh OUT speed
#   the fused GRN in one call: GRN=1 CFC=0 TRAIN_S=0 TEST_S=0 bash benchmarks/trunk_device.sh OUT speed (GRN=1: also
#     its CUDA tests, benchmarks/ops_grn.py and the VSN in trunk_forms.py fusion)
# Needs the carried wheels in .whl/ (DESIGN §8; benchmarks/device_wheels.sh), fla-core and einops among them. Logs and JSON go to OUT.
# device_setup.sh links conf/ into the package inside the working tree: where the tree is copied afresh while
# a job runs, the link goes with it and perception-train stops finding its configs (source it again).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1 mode=$2
mkdir -p "$out"
source benchmarks/device_setup.sh || exit 1
export PERCEPTION_RESULTS=$out
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
SECONDS=0
python3 -m perception.ops.build > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "build: ${SECONDS} s"
status=0
if [ "$mode" = speed ]; then
  # the CfC kernels' tests and table first (they changed most), then the step, then every other CUDA test
  if [ "${CFC:-1}" != 0 ]; then
    timeout 150 python3 -m pytest -x -q -m cuda -p no:cacheprovider tests/ops/test_cuda_cfc.py 2>&1 | tee "$out/cuda_tests_cfc.log" | tail -4
    status=${PIPESTATUS[0]}
    [ "$status" = 0 ] || exit "$status"  # a wrong or hanging kernel: no benchmark of it
    echo "cfc tests: ${SECONDS} s"
    timeout 90 python3 benchmarks/ops_cfc.py --eager-reps 1 --out "$out/ops_cfc.json" 2>&1 | tail -8
    echo "cfc: ${SECONDS} s"
  fi
  if [ "${GRN:-0}" = 1 ]; then  # the VSN's GRNs in Triton (model.vsn.fused_grn): tests, the op, the VSN
    timeout 120 python3 -m pytest -q -m cuda -p no:cacheprovider tests/ops/test_cuda_grn.py 2>&1 | tee "$out/cuda_tests_grn.log" | tail -3
    timeout 240 python3 benchmarks/ops_grn.py --out "$out/ops_grn.json" 2>&1 | tee "$out/ops_grn.log" | tail -16 || status=1
    timeout 320 python3 benchmarks/trunk_forms.py fusion --modules vsn --vsn-forms "${VSN_FORMS:-after,fused_grn}" --precisions "${GRN_PRECISIONS:-bf16,tf32}" \
      --out "$out/trunk_fusion_grn.json" 2>&1 | grep -v "^USDT\|SyncActivityProfiler" | tail -8 || status=1
    echo "grn: ${SECONDS} s"
  fi
  if [ "${SSD:-0}" = 1 ]; then  # one compiled Mamba2 block, the SSD's decay in both forms
    timeout 240 python3 benchmarks/trunk_forms.py ssd --precisions "${SSD_PRECISIONS:-bf16,tf32}" --chunks "${SSD_CHUNKS:-${CHUNKS:-64}}" ${SSD_FLAGS-} \
      --out "$out/mamba_ssd.json" 2>&1 | grep -v "^USDT\|SyncActivityProfiler" | tee "$out/mamba_ssd.log" | tail -40 || status=1
    echo "mamba_ssd: ${SECONDS} s"
  fi
  if [ "${LOOP:-0}" = 1 ]; then  # the trainer's own loop, data loading included (ahead vs inline)
    timeout 300 python3 benchmarks/train_loop.py --out "$out/train_loop.json" 2>&1 | grep -v "^USDT\|SyncActivityProfiler" \
      | tee "$out/train_loop.log" | tail -9 || status=1
    echo "train_loop: ${SECONDS} s"
  fi
  if [ "${TRAIN_S:-400}" != 0 ]; then  # TRAIN_S=0: no train_step.py this call
    timeout "${TRAIN_S:-400}" python3 benchmarks/train_step.py --out "$out/train_step.json" --precisions "${PRECISIONS-}" \
      --compiled "${COMPILED-tf32,bf16}" --chunks "${CHUNKS:-64}" --fla "${FLA-}" --mamba "${MAMBA-}" --fused-grn "${FUSED_GRN-}" --fold-embed "${FOLD_EMBED-}" --fused-grn-folded "${FUSED_GRN_FOLDED-}" --fused-grn-ssd "${FUSED_GRN_SSD:-chunked}" --project "${PROJECT-}" --ref-reps "${REF_REPS:-2}" --graph "${GRAPH-}" \
      2>&1 | grep -v "^USDT\|SyncActivityProfiler" | tee "$out/train_step.log" | tail -45 || status=1
    echo "train_step: ${SECONDS} s"
  fi
  if [ "${TEST_S:-300}" != 0 ]; then  # TEST_S=0: leave every other CUDA test to a later call
    timeout "${TEST_S:-300}" python3 -m pytest -q -m cuda -p no:cacheprovider ${CUDA_TESTS:-tests/ops tests/model tests/data/test_prefetch.py} 2>&1 | tee "$out/cuda_tests.log" | tail -15
    status=$(( status ? status : PIPESTATUS[0] ))
    echo "tests: ${SECONDS} s"
  fi
elif [ "$mode" = determinism ]; then
  timeout "${DET_S:-330}" python3 benchmarks/determinism.py --processes 10 --settings ${SETTINGS:-tf32+compiled bf16+compiled} \
    --out "$out/determinism.json" 2>&1 | tail -4 || status=1
  timeout "${DET_B64_S:-290}" python3 benchmarks/determinism.py --processes 3 --batch 64 --parallel "${DET_B64_PARALLEL:-3}" --settings ${SETTINGS:-tf32+compiled bf16+compiled} \
    --out "$out/determinism_b64.json" 2>&1 \
    | tail -4 || status=1
  echo "determinism: ${SECONDS} s"
elif [ "$mode" = fusion ]; then
  timeout 300 python3 benchmarks/trunk_forms.py fusion --precisions "${PRECISIONS:-bf16}" --out "$out/trunk_fusion.json" 2>&1 \
    | grep -v "^USDT\|SyncActivityProfiler" | tee "$out/trunk_fusion.log" | tail -20 || status=1
  echo "trunk_fusion: ${SECONDS} s"
  timeout 150 python3 benchmarks/compile_check.py --ways model --out "$out/compile_check.json" 2>&1 | tail -30 || status=1
  echo "compile_check: ${SECONDS} s"
else
  [ "${MODEL_STEP:-1}" = 0 ] || timeout 110 python3 benchmarks/model_step.py --device cuda --repeats 2 --variants per_horizon --precision bf16 --compile-trunk \
    --chunk "${CHUNK:-64}" --out "$out/model_step_cuda_fast.json" 2>&1 | tr '\r' '\n' | grep -v "repeat" | tail -14
  echo "model_step: ${SECONDS} s"
  [ "${LOCAL_S:-180}" = 0 ] || timeout "${LOCAL_S:-180}" python3 studies/precision_quality.py --experiment local --fp32-seeds 5 --parallel "${PARALLEL:-10}" \
    --setting-seeds "${SETTING_SEEDS:-1}" --seed "${SEED:-0}" --settings ${LOCAL_SETTINGS:-tf32 bf16 tf32+compiled bf16+compiled} 2>&1 | tr '\r' '\n' | tail -16
  echo "quality local: ${SECONDS} s"
  [ "${PRODUCTION_S:-270}" = 0 ] || timeout "${PRODUCTION_S:-270}" python3 studies/precision_quality.py --experiment production \
    --fp32-seeds "${PRODUCTION_SEEDS:-3}" --setting-seeds "${PRODUCTION_SETTING_SEEDS:-1}" --seed "${SEED:-0}" --parallel "${PRODUCTION_PARALLEL:-5}" \
    --settings ${PRODUCTION_SETTINGS:-bf16+compiled tf32+compiled} --tag "${PRODUCTION_TAG:-precision_quality_production_short}" \
    ${PRODUCTION_FP32_FROM:+--fp32-from "$PRODUCTION_FP32_FROM"} -- \
    data.n_snapshots=300000 trainer.epochs=2 trainer.max_train_batches=40 model.mamba.chunk="${CHUNK:-64}" 2>&1 | tr '\r' '\n' | tail -12
  echo "quality production-K: ${SECONDS} s"
fi
exit "$status"

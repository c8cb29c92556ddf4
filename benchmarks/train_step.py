"""One full training step (forward, masked BCE, backward, AdamW) of PerceptionModel at production size
(B=64, K=6000, D=128, F=65 as the production data has, H=5) on one GPU: reference ops vs CUDA kernels
and the kernel path at each trainer.precision (fp32, tf32, bf16), with peak memory, the
kernels that dominate, and the projected cost of the production study (DESIGN §4 "Scales": 2 variants
x 3 folds x 30 epochs over 2,000,000 snapshots, window stride 50) on this GPU and on six L40S.

    PYTHONPATH=. python3 benchmarks/train_step.py [--out benchmarks/results/train_step.json]

The L40S projection scales this GPU's times by the larger of the measured copy-bandwidth and fp32
GEMM ratios against the L40S datasheet (864 GB/s, 91.6 TFLOP/s fp32), starting from the portable
kernel path, the one sm_89 runs (it has no thread-block clusters)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cuda_timing import cuda_median_ms as median_ms  # noqa: E402
from perception.model import ModelConfig, PerceptionModel, masked_bce  # noqa: E402
from perception.train.precision import configure as configure_precision, forward_context  # noqa: E402

HORIZONS = [30, 100, 300, 1000, 6000]
STUDY = dict(n_snapshots=2_000_000, window_stride=50, n_folds=3, variants=2, epochs=30, eval_batch=64)
L40S = dict(copy_gbps=864.0, fp32_tflops=91.6)  # datasheet
TARGET_SPEEDUP, MEMORY_LIMIT_GIB = 20.0, 44.0
TARGET_STEP_MS = 65.0  # the study in about an hour on six L40S: 4x the 266 ms fp32 kernel step at F = 65 (H200)




def measure_ceilings() -> dict:
    """Device-to-device copy bandwidth (bytes read + written) and fp32 GEMM rate (no TF32)."""
    src = torch.empty(1 << 29, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), 10)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda")
    mm_ms = median_ms(lambda: a @ b, 5)
    torch.backends.cuda.matmul.allow_tf32 = prev
    del src, dst, a, b
    return dict(copy_gbps=2 * (1 << 29) * 4 / copy_ms / 1e6, fp32_tflops=2 * 8192**3 / mm_ms / 1e9)


def build(args, ops: str, variant: str, precision: str = "fp32", compiled: bool = False):
    cfg = ModelConfig(attention_pool=variant, d_model=args.d_model, ops=ops, compile_trunk=compiled)
    model = PerceptionModel(cfg, n_features=args.features, horizons=HORIZONS, seed=0).cuda()
    model.set_dt_scale(1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.window, args.features, generator=g).cuda()
    dt = torch.exp(0.5 * torch.randn(args.batch, args.window, generator=g)).cuda()
    y = (torch.rand(args.batch, len(HORIZONS), generator=g) > 0.5).float().cuda()
    mask = torch.ones(args.batch, len(HORIZONS), dtype=torch.bool).cuda()

    configure_precision(precision, x.device)

    def amp():
        return forward_context(precision, x.device)

    def train_step():
        opt.zero_grad(set_to_none=True)
        with amp():
            logits = model(x, dt)
        loss = masked_bce(logits.float(), y, mask)
        loss.backward()
        opt.step()

    def eval_step():
        with torch.no_grad(), amp():
            model(x, dt)

    return model, train_step, eval_step


def measure(args, ops: str, variant: str, reps: int, path: str | None = None, precision: str = "fp32",
            compiled: bool = False) -> dict:
    if path:
        os.environ["PERCEPTION_CFC_PATH"] = path
    model, train_step, eval_step = build(args, ops, variant, precision, compiled)
    if compiled:  # compile outside the timed region: the first step and the first eval
        train_step()
        model.eval()
        eval_step()
        model.train()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step_ms = median_ms(train_step, reps)
    peak = torch.cuda.max_memory_allocated() / 2**30
    model.eval()
    eval_ms = median_ms(eval_step, reps)
    model.train()
    os.environ.pop("PERCEPTION_CFC_PATH", None)
    configure_precision("fp32", torch.device("cuda"))  # the next row starts from plain fp32
    label = f"{ops}" + (f" ({path})" if path else "") + (f" {precision}" if precision != "fp32" else "") + (
        " compiled" if compiled else "")
    print(f"  {variant:12} ops={label:16} step {step_ms:10.2f} ms  eval {eval_ms:9.2f} ms  peak {peak:6.2f} GiB", flush=True)
    return dict(variant=variant, ops=ops, cfc_path=path, precision=precision, compiled=compiled, step_ms=step_ms,
                eval_ms=eval_ms, peak_gib=peak)


def dominant_kernels(args, variant: str, top: int = 8) -> list[dict]:
    """CUDA time per kernel name over one kernel-path training step."""
    _, train_step, _ = build(args, "cuda", variant)
    train_step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        train_step()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) or 1.0
    return [dict(name=e.key[:90], ms=e.device_time_total / 1e3, share=e.device_time_total / total) for e in events[:top]]


def project(step_ms: float, eval_ms: float, batch: int, window: int) -> dict:
    """Hours for the whole study: every run trains on (n_folds-1)/n_folds of the windows, validates on the rest."""
    s = STUDY
    n_windows = (s["n_snapshots"] - window - max(HORIZONS)) // s["window_stride"] + 1
    train_w = n_windows * (s["n_folds"] - 1) // s["n_folds"]
    val_w = n_windows - train_w
    run_s = s["epochs"] * (math.ceil(train_w / batch) * step_ms + math.ceil(val_w / s["eval_batch"]) * eval_ms) / 1e3
    runs = s["variants"] * s["n_folds"]
    return dict(n_windows=n_windows, run_hours=run_s / 3600, gpu_hours=runs * run_s / 3600, runs=runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--features", type=int, default=65)  # the production data's feature count
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ref-reps", type=int, default=2)
    parser.add_argument("--precisions", default="tf32,bf16", help="kernel-path rows beyond fp32")
    parser.add_argument("--no-compile", action="store_true", help="skip the model.compile_trunk rows")
    parser.add_argument("--out", default="benchmarks/results/train_step.json")
    args = parser.parse_args()

    gpu = torch.cuda.get_device_name()
    print(f"training step, B={args.batch} K={args.window} D={args.d_model} F={args.features} on {gpu}", flush=True)
    ceilings = measure_ceilings()
    rows = [
        measure(args, "ref", "per_horizon", args.ref_reps),
        measure(args, "cuda", "per_horizon", args.reps),
        measure(args, "cuda", "shared", args.reps),
    ]
    portable = measure(args, "cuda", "per_horizon", args.reps, path="portable")
    rows.append(portable)
    for precision in [p for p in args.precisions.split(",") if p and p != "fp32"]:
        rows.append(measure(args, "cuda", "per_horizon", args.reps, precision=precision))
    if not args.no_compile:
        for precision in ["fp32", *[p for p in args.precisions.split(",") if p and p != "fp32"]]:
            rows.append(measure(args, "cuda", "per_horizon", args.reps, precision=precision, compiled=True))
    kernels = dominant_kernels(args, "per_horizon")

    ref, fast = rows[0], rows[1]
    speedup = ref["step_ms"] / fast["step_ms"]
    here = project(fast["step_ms"], fast["eval_ms"], args.batch, args.window)
    here_ref = project(ref["step_ms"], ref["eval_ms"], args.batch, args.window)
    scale = max(ceilings["copy_gbps"] / L40S["copy_gbps"], ceilings["fp32_tflops"] / L40S["fp32_tflops"])
    l40s = project(portable["step_ms"] * scale, portable["eval_ms"] * scale, args.batch, args.window)
    peak = max(r["peak_gib"] for r in rows)

    print(f"\n{'variant':12} {'ops':27} {'step ms':>10} {'eval ms':>10} {'peak GiB':>9}")
    for r in rows:
        label = r["ops"] + (f" ({r['cfc_path']})" if r["cfc_path"] else "") + (
            f" {r['precision']}" if r["precision"] != "fp32" else "") + (" compiled" if r["compiled"] else "")
        print(f"{r['variant']:12} {label:27} {r['step_ms']:10.2f} {r['eval_ms']:10.2f} {r['peak_gib']:9.2f}")
    print(f"\nspeed-up kernels vs reference ops: {speedup:.1f}x (target >= {TARGET_SPEEDUP:.0f}x: "
          f"{'met' if speedup >= TARGET_SPEEDUP else 'missed'}); peak memory {peak:.2f} GiB "
          f"(limit {MEMORY_LIMIT_GIB:.0f} GiB: {'fits' if peak <= MEMORY_LIMIT_GIB else 'exceeds'})")
    best = min((r for r in rows if r["ops"] == "cuda" and r["cfc_path"] is None), key=lambda r: r["step_ms"])
    print(f"fastest kernel-path step: {best['step_ms']:.1f} ms at {best['precision']}"
          f"{', compiled' if best['compiled'] else ''}, peak {best['peak_gib']:.2f} GiB (target <= {TARGET_STEP_MS:.0f} ms: "
          f"{'met' if best['step_ms'] <= TARGET_STEP_MS else 'missed'})")
    print("what dominates the kernel-path step (CUDA time):")
    for k in kernels:
        print(f"  {k['ms']:9.2f} ms {100 * k['share']:5.1f}%  {k['name']}")
    print(f"\nceilings here: copy {ceilings['copy_gbps']:.0f} GB/s, fp32 GEMM {ceilings['fp32_tflops']:.1f} TFLOP/s; "
          f"L40S/this-GPU time factor {scale:.2f}")
    print(f"production study ({here['runs']} runs x {STUDY['epochs']} epochs, {here['n_windows']} windows):")
    print(f"  one {gpu}, kernels:        {here['gpu_hours']:8.1f} GPU-h, wall {here['gpu_hours']:8.1f} h")
    print(f"  one {gpu}, reference ops:  {here_ref['gpu_hours']:8.1f} GPU-h, wall {here_ref['gpu_hours']:8.1f} h")
    print(f"  six L40S (portable path):   {l40s['gpu_hours']:8.1f} GPU-h, wall {l40s['run_hours']:8.1f} h (one run per GPU)")

    result = dict(
        machine=dict(gpu=gpu, torch=torch.__version__, cuda=torch.version.cuda),
        config=dict(batch=args.batch, window=args.window, d_model=args.d_model, features=args.features, horizons=HORIZONS),
        rows=rows, speedup=speedup, target_speedup=TARGET_SPEEDUP, fastest=best, target_step_ms=TARGET_STEP_MS, peak_gib=peak, memory_limit_gib=MEMORY_LIMIT_GIB,
        dominant_kernels=kernels, ceilings=ceilings, l40s_datasheet=L40S, l40s_time_factor=scale,
        study=STUDY, projection=dict(this_gpu_kernels=here, this_gpu_reference=here_ref, six_l40s=l40s),
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

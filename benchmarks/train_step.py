"""One full training step (forward, masked BCE, backward, AdamW) of PerceptionModel at production size
(B=64, K=6000, D=128, F=65 as the production data has, H=5) on one GPU: reference ops vs CUDA kernels
and the kernel path at each trainer.precision (fp32, tf32, bf16), with the trunk compiled
(model.compile_trunk) and with fla-core's or mamba_ssm's SSD (model.mamba.ssd=fla|mamba); peak memory, the kernels that
dominate, and the projected cost of the production study (DESIGN §4 "Scales": 2 variants x 3 folds x 30
epochs over 2,000,000 snapshots, window stride 50) on this GPU and on six L40S.

    PYTHONPATH=. python3 benchmarks/train_step.py [--out benchmarks/results/train_step.json]

The L40S projection starts from the fastest setting on the portable kernel path, the one sm_89 runs (it
has no thread-block clusters), and is per module: the CfC scan's kernels (timed by the profiler) are a
chain of K dependent steps bound by on-chip latency, not by DRAM, so they keep this GPU's time times
CFC_L40S_FACTOR; everything else is bandwidth-bound and scales by the larger of the measured
copy-bandwidth and fp32 GEMM ratios against the L40S datasheet (864 GB/s, 91.6 TFLOP/s fp32)."""

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
from benchmarks.cuda_timing import graphed  # noqa: E402
from perception.model import ModelConfig, PerceptionModel, masked_bce  # noqa: E402
from perception.model.config import MambaConfig, VSNConfig  # noqa: E402
from perception.model.ssd_fla import fla_refusal  # noqa: E402
from perception.model.ssd_mamba import mamba_refusal  # noqa: E402
from perception.train.precision import configure as configure_precision, forward_context  # noqa: E402

HORIZONS = [30, 100, 300, 1000, 6000]
STUDY = dict(n_snapshots=2_000_000, window_stride=50, n_folds=3, variants=2, epochs=30, eval_batch=64)
L40S = dict(copy_gbps=864.0, fp32_tflops=91.6)  # datasheet
TARGET_SPEEDUP, MEMORY_LIMIT_GIB = 20.0, 44.0
TARGET_STEP_MS = 65.0  # the study in about an hour on six L40S: 4x the 266 ms fp32 kernel step at F = 65 (H200)
# The CfC scan's per-step time on an L40S relative to this GPU: each of its K steps waits on the last, and
# on the portable path a block reads part of W_out from L2 every step (36 of 256 KiB at D = 128, ~600 cycles
# at 64 B per cycle per SM), so SM clock, on-chip latency and each SM's L2 read rate set it, not DRAM; the L40S clocks
# higher (2.52 vs 1.98 GHz boost) and the kernel is the same, so 1.0 (an estimate: no sm_89 GPU measured);
# the pessimistic projection doubles it.
CFC_L40S_FACTOR, CFC_L40S_PESSIMISTIC = 1.0, 2.0
DEFAULT_CHUNK = MambaConfig().chunk


def measure_ceilings() -> dict:
    """Device-to-device copy bandwidth (bytes read + written) and fp32 GEMM rate (no TF32)."""
    src = torch.empty(1 << 29, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), 10)  # noqa: F821 (deleted after use; the lambda runs first)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda")
    mm_ms = median_ms(lambda: a @ b, 5)  # noqa: F821 (deleted after use; the lambda runs first)
    torch.backends.cuda.matmul.allow_tf32 = prev
    del src, dst, a, b
    return dict(copy_gbps=2 * (1 << 29) * 4 / copy_ms / 1e6, fp32_tflops=2 * 8192**3 / mm_ms / 1e9)


def build(
    args,
    ops: str,
    variant: str,
    precision: str = "fp32",
    compiled: bool = False,
    ssd: str = "chunked",
    chunk: int | None = None,
    graph: bool = False,
    fused_grn: bool = False,
    fold_embed: bool = False,
):
    mamba = MambaConfig(ssd=ssd) if chunk is None else MambaConfig(ssd=ssd, chunk=chunk)
    cfg = ModelConfig(
        attention_pool=variant,
        d_model=args.d_model,
        ops=ops,
        compile_trunk=compiled,
        mamba=mamba,
        vsn=VSNConfig(fused_grn=fused_grn, fold_embed=fold_embed),
    )
    model = PerceptionModel(cfg, n_features=args.features, horizons=HORIZONS, seed=0).cuda()
    model.set_dt_scale(1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=graph)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.window, args.features, generator=g).cuda()
    dt = torch.exp(0.5 * torch.randn(args.batch, args.window, generator=g)).cuda()
    y = (torch.rand(args.batch, len(HORIZONS), generator=g) > 0.5).float().cuda()
    mask = torch.ones(args.batch, len(HORIZONS), dtype=torch.bool).cuda()

    configure_precision(precision, x.device)

    def amp():
        return forward_context(precision, x.device)

    def forward_backward_step():
        with amp():
            logits = model(x, dt)
        loss = masked_bce(logits.float(), y, mask)
        loss.backward()
        opt.step()

    def train_step():
        opt.zero_grad(set_to_none=True)
        forward_backward_step()

    def eval_step():
        with torch.no_grad(), amp():
            model(x, dt)

    if not graph:
        return model, train_step, eval_step

    def warm_up():
        train_step()
        opt.zero_grad(set_to_none=True)  # the capture allocates the gradients; each replay overwrites them

    replay_train = graphed(forward_backward_step, warm_up_with=warm_up)
    model.eval()
    replay_eval = graphed(eval_step)
    model.train()
    return model, replay_train, replay_eval


def label(row: dict) -> str:
    return (
        row["ops"]
        + (f" ({row['cfc_path']})" if row["cfc_path"] else "")
        + (f" {row['precision']}" if row["precision"] != "fp32" else "")
        + (" compiled" if row["compiled"] else "")
        + (f" {row['ssd']}" if row["ssd"] != "chunked" else "")
        + (" fused GRN" if row.get("fused_grn") else "")
        + (" folded embedding" if row.get("fold_embed") else "")
        + (f" chunk {row['chunk']}" if row["chunk"] != DEFAULT_CHUNK else "")
        + (" CUDA graph" if row.get("graph") else "")
        + (" [profiled]" if "kernels" in row else "")
    )


def measure(
    args,
    ops: str,
    variant: str,
    reps: int,
    path: str | None = None,
    precision: str = "fp32",
    compiled: bool = False,
    ssd: str = "chunked",
    profile: bool = False,
    chunk: int | None = None,
    graph: bool = False,
    fused_grn: bool = False,
    fold_embed: bool = False,
) -> dict:
    """Median step and eval time and peak memory; with `profile`, also the CUDA time of every kernel
    over one step and one eval, the CfC scan's share of each, and the step's GPU time in kernels (the
    rest of the step the GPU waits for the host). `graph`: the step and the eval replayed as CUDA graphs."""
    if path:
        os.environ["PERCEPTION_CFC_PATH"] = path
    torch._dynamo.reset()  # every row compiles afresh, never into the recompile limit
    chunk = chunk or DEFAULT_CHUNK
    model, train_step, eval_step = build(
        args, ops, variant, precision, compiled, ssd, chunk, graph, fused_grn, fold_embed
    )
    train_step()  # warm-up: autotuning, compilation, allocator
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
    row = dict(
        variant=variant,
        ops=ops,
        cfc_path=path,
        precision=precision,
        compiled=compiled,
        ssd=ssd,
        chunk=chunk,
        graph=graph,
        fused_grn=fused_grn,
        fold_embed=fold_embed,
        step_ms=step_ms,
        eval_ms=eval_ms,
        peak_gib=peak,
    )
    if profile:
        row["kernels"], row["cfc_step_ms"], row["gpu_step_ms"] = kernel_times(train_step, args.top)
        model.eval()
        row["eval_kernels"], row["cfc_eval_ms"], row["gpu_eval_ms"] = kernel_times(eval_step, args.top)
        model.train()
    os.environ.pop("PERCEPTION_CFC_PATH", None)
    configure_precision("fp32", torch.device("cuda"))  # the next row starts from plain fp32
    del model
    torch.cuda.empty_cache()
    print(
        f"  {variant:12} {label(row):32} step {step_ms:10.2f} ms  eval {eval_ms:9.2f} ms  peak {peak:6.2f} GiB",
        flush=True,
    )
    return row


def kernel_times(fn, top: int = 10) -> tuple[list[dict], float, float]:
    """CUDA time per kernel name over one call of `fn` (the top ones), the CfC scan kernels' total ms and
    the GPU time of all of them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) or 1.0
    cfc_ms = sum(e.device_time_total for e in events if "cfc_scan" in e.key) / 1e3
    return (
        [dict(name=e.key[:120], ms=e.device_time_total / 1e3, share=e.device_time_total / total) for e in events[:top]],
        cfc_ms,
        total / 1e3,
    )


def project(step_ms: float, eval_ms: float, batch: int, window: int) -> dict:
    """Hours for the whole study: every run trains on (n_folds-1)/n_folds of the windows, validates on the rest."""
    s = STUDY
    n_windows = (s["n_snapshots"] - window - max(HORIZONS)) // s["window_stride"] + 1
    train_w = n_windows * (s["n_folds"] - 1) // s["n_folds"]
    val_w = n_windows - train_w
    run_s = s["epochs"] * (math.ceil(train_w / batch) * step_ms + math.ceil(val_w / s["eval_batch"]) * eval_ms) / 1e3
    runs = s["variants"] * s["n_folds"]
    return dict(
        n_windows=n_windows,
        run_hours=run_s / 3600,
        gpu_hours=runs * run_s / 3600,
        runs=runs,
        step_ms=step_ms,
        eval_ms=eval_ms,
    )


def l40s_projection(portable: dict, scale: float, cfc_factor: float, batch: int, window: int) -> dict:
    """Per module: the CfC scan at `cfc_factor` times its time here, the rest at `scale` times."""
    step = (portable["step_ms"] - portable["cfc_step_ms"]) * scale + portable["cfc_step_ms"] * cfc_factor
    evl = (portable["eval_ms"] - portable["cfc_eval_ms"]) * scale + portable["cfc_eval_ms"] * cfc_factor
    return dict(**project(step, evl, batch, window), cfc_factor=cfc_factor, bandwidth_factor=scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--features", type=int, default=65)  # the production data's feature count
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ref-reps", type=int, default=2)
    parser.add_argument("--precisions", default="tf32,bf16", help="eager kernel-path rows beyond fp32")
    parser.add_argument(
        "--compiled", default="tf32,bf16", help="precisions of the model.compile_trunk rows ('' for none)"
    )
    parser.add_argument(
        "--chunks", default=str(DEFAULT_CHUNK), help="model.mamba.chunk values of the compiled rows, e.g. 128,64"
    )
    parser.add_argument(
        "--fla",
        default="tf32,bf16",
        help="precisions of the compiled model.mamba.ssd=fla rows ('' for none; skipped without fla-core)",
    )
    parser.add_argument(
        "--mamba",
        default="",
        help="precisions of the compiled model.mamba.ssd=mamba rows, one per --chunks value ('' for none; skipped "
        "without mamba_ssm)",
    )
    parser.add_argument(
        "--fused-grn",
        default="",
        help="precisions of compiled rows with model.vsn.fused_grn (the VSN's GRNs in Triton), with the "
        "SSD backend of --fused-grn-ssd, one per --chunks value ('' for none)",
    )
    parser.add_argument(
        "--fold-embed",
        default="",
        help="precisions of compiled rows with model.vsn.fold_embed (the linears that read the VSN's embedding "
        "folded into it), with the SSD backend of --fused-grn-ssd, one per --chunks value ('' for none)",
    )
    parser.add_argument(
        "--fused-grn-folded",
        default="",
        help="precisions of compiled rows with both model.vsn.fused_grn and model.vsn.fold_embed, one per --chunks "
        "value ('' for none)",
    )
    parser.add_argument(
        "--fused-grn-ssd",
        default="chunked",
        help="model.mamba.ssd of the --fused-grn, --fold-embed and --fused-grn-folded rows",
    )
    parser.add_argument(
        "--project",
        default="",
        help="profile and project the fastest row at each of these "
        "precisions, e.g. tf32,bf16 (default: the fastest row of all)",
    )
    parser.add_argument(
        "--graph",
        default="",
        help="precisions of compiled rows replayed as one CUDA graph per "
        "step ('' for none): how much of the step is host launch time; the trainer does not capture "
        "graphs, so these rows are never the headline or projected",
    )
    parser.add_argument("--top", type=int, default=10, help="kernels listed for the profiled rows' step and eval")
    parser.add_argument("--out", default="benchmarks/results/train_step.json")
    args = parser.parse_args()
    listed = lambda text: [p for p in text.split(",") if p]  # noqa: E731

    gpu = torch.cuda.get_device_name()
    print(f"training step, B={args.batch} K={args.window} D={args.d_model} F={args.features} on {gpu}", flush=True)
    ceilings = measure_ceilings()
    rows = [
        measure(args, "ref", "per_horizon", args.ref_reps),
        measure(args, "cuda", "per_horizon", args.reps),
        measure(args, "cuda", "shared", args.reps),
    ]
    for precision in [p for p in listed(args.precisions) if p != "fp32"]:
        rows.append(measure(args, "cuda", "per_horizon", args.reps, precision=precision))
    chunks = [int(c) for c in listed(args.chunks)]

    def compiled(precision: str, **setting) -> dict:  # a model.compile_trunk row of the per-horizon model
        return measure(args, "cuda", "per_horizon", args.reps, precision=precision, compiled=True, **setting)

    rows += [compiled(p, chunk=c) for p in listed(args.compiled) for c in chunks]
    rows += [compiled(p, chunk=c, graph=True) for p in listed(args.graph) for c in chunks]
    refusal = fla_refusal() if listed(args.fla) else None
    if refusal is None:
        rows += [compiled(p, ssd="fla") for p in listed(args.fla)]
    else:
        print(f"  (model.mamba.ssd=fla rows skipped: {refusal})")
    refusal = mamba_refusal() if listed(args.mamba) else None
    if refusal is None:  # the library's chunk is model.mamba.chunk too
        rows += [compiled(p, ssd="mamba", chunk=c) for p in listed(args.mamba) for c in chunks]
    else:
        print(f"  (model.mamba.ssd=mamba rows skipped: {refusal})")
    for fused_grn, fold_embed, precisions in (
        (True, False, args.fused_grn),
        (False, True, args.fold_embed),
        (True, True, args.fused_grn_folded),
    ):  # one row per precision and --chunks value
        rows += [
            compiled(p, ssd=args.fused_grn_ssd, chunk=c, fused_grn=fused_grn, fold_embed=fold_embed)
            for p in listed(precisions)
            for c in chunks
        ]

    kernel_rows = [r for r in rows if r["ops"] == "cuda" and not r["graph"]]
    scale = max(ceilings["copy_gbps"] / L40S["copy_gbps"], ceilings["fp32_tflops"] / L40S["fp32_tflops"])
    by_precision = {}
    for precision in listed(args.project) or [""]:
        best = min((r for r in kernel_rows if precision in ("", r["precision"])), key=lambda r: r["step_ms"])
        setting = dict(
            precision=best["precision"],
            compiled=best["compiled"],
            ssd=best["ssd"],
            chunk=best["chunk"],
            fused_grn=best["fused_grn"],
            fold_embed=best["fold_embed"],
        )
        fast = measure(args, "cuda", "per_horizon", args.reps, profile=True, **setting)  # again, under the profiler
        portable = measure(args, "cuda", "per_horizon", args.reps, path="portable", profile=True, **setting)
        rows += [fast, portable]
        by_precision[best["precision"]] = dict(
            best=best,
            fast=fast,
            portable=portable,
            this_gpu=project(best["step_ms"], best["eval_ms"], args.batch, args.window),
            six_l40s=l40s_projection(portable, scale, CFC_L40S_FACTOR, args.batch, args.window),
            six_l40s_pessimistic_cfc=l40s_projection(portable, scale, CFC_L40S_PESSIMISTIC, args.batch, args.window),
        )
    # the headline is the fastest of the projected settings
    head = min(by_precision.values(), key=lambda p: p["best"]["step_ms"])
    best, fast, portable, here = head["best"], head["fast"], head["portable"], head["this_gpu"]
    l40s, l40s_pessimistic = head["six_l40s"], head["six_l40s_pessimistic_cfc"]

    ref, fp32 = rows[0], rows[1]
    speedup = ref["step_ms"] / fp32["step_ms"]
    here_fp32 = project(fp32["step_ms"], fp32["eval_ms"], args.batch, args.window)
    peak = max(r["peak_gib"] for r in rows)

    print(f"\n{'variant':12} {'ops':34} {'step ms':>10} {'eval ms':>10} {'peak GiB':>9}")
    for r in rows:
        print(f"{r['variant']:12} {label(r):34} {r['step_ms']:10.2f} {r['eval_ms']:10.2f} {r['peak_gib']:9.2f}")
    print(
        f"\nspeed-up fp32 kernels vs reference ops: {speedup:.1f}x (target >= {TARGET_SPEEDUP:.0f}x: "
        f"{'met' if speedup >= TARGET_SPEEDUP else 'missed'}); peak memory {peak:.2f} GiB "
        f"(limit {MEMORY_LIMIT_GIB:.0f} GiB: {'fits' if peak <= MEMORY_LIMIT_GIB else 'exceeds'})"
    )
    print(
        f"fastest kernel-path step: {best['step_ms']:.1f} ms ({label(best)}), {fp32['step_ms'] / best['step_ms']:.1f}x "
        f"the fp32 kernel step, peak {best['peak_gib']:.2f} GiB (target <= {TARGET_STEP_MS:.0f} ms: "
        f"{'met' if best['step_ms'] <= TARGET_STEP_MS else 'missed'})"
    )
    print(
        f"what dominates that step (CUDA time {fast['gpu_step_ms']:.1f} ms of {fast['step_ms']:.1f}, the rest the GPU "
        f"waits for the host; the CfC scan {fast['cfc_step_ms']:.1f} ms):"
    )
    for k in fast["kernels"]:
        print(f"  {k['ms']:9.2f} ms {100 * k['share']:5.1f}%  {k['name']}")
    print(f"and the eval batch's (CUDA time {fast['gpu_eval_ms']:.1f} ms of {fast['eval_ms']:.1f}):")
    for k in fast["eval_kernels"]:
        print(f"  {k['ms']:9.2f} ms {100 * k['share']:5.1f}%  {k['name']}")
    print(
        f"\nceilings here: copy {ceilings['copy_gbps']:.0f} GB/s, fp32 GEMM {ceilings['fp32_tflops']:.1f} TFLOP/s; "
        f"L40S/this-GPU time factor {scale:.2f} (all but the CfC scan), CfC scan factor {CFC_L40S_FACTOR:.1f}"
    )
    print(
        f"portable path at that setting: step {portable['step_ms']:.1f} ms of which CfC "
        f"{portable['cfc_step_ms']:.1f} ms; "
        f"eval {portable['eval_ms']:.1f} ms of which CfC {portable['cfc_eval_ms']:.1f} ms"
    )
    print(f"production study ({here['runs']} runs x {STUDY['epochs']} epochs, {here['n_windows']} windows):")
    print(f"  one {gpu}, fastest setting: {here['gpu_hours']:8.1f} GPU-h")
    print(f"  one {gpu}, fp32 kernels:    {here_fp32['gpu_hours']:8.1f} GPU-h")
    print(
        f"  six L40S (portable path):   step {l40s['step_ms']:.0f} ms, eval {l40s['eval_ms']:.0f} ms: "
        f"{l40s['gpu_hours']:6.1f} GPU-h, wall {l40s['run_hours']:5.2f} h (one run per GPU)"
    )
    print(
        f"  six L40S, CfC at {CFC_L40S_PESSIMISTIC:.0f}x:        step {l40s_pessimistic['step_ms']:.0f} ms: "
        f"wall {l40s_pessimistic['run_hours']:5.2f} h"
    )
    for precision, p in by_precision.items():
        print(
            f"  at {precision} ({label(p['best'])}): step {p['best']['step_ms']:.1f} ms here; six L40S step "
            f"{p['six_l40s']['step_ms']:.0f} ms, wall {p['six_l40s']['run_hours']:.2f} h "
            f"({p['six_l40s_pessimistic_cfc']['run_hours']:.2f} h at CfC x{CFC_L40S_PESSIMISTIC:.0f})"
        )

    result = dict(
        machine=dict(gpu=gpu, torch=torch.__version__, cuda=torch.version.cuda),
        config=dict(
            batch=args.batch, window=args.window, d_model=args.d_model, features=args.features, horizons=HORIZONS
        ),
        rows=rows,
        speedup=speedup,
        target_speedup=TARGET_SPEEDUP,
        fastest=best,
        target_step_ms=TARGET_STEP_MS,
        peak_gib=peak,
        memory_limit_gib=MEMORY_LIMIT_GIB,
        dominant_kernels=fast["kernels"],
        dominant_eval_kernels=fast["eval_kernels"],
        ceilings=ceilings,
        l40s_datasheet=L40S,
        l40s_time_factor=scale,
        study=STUDY,
        projection=dict(
            this_gpu_fastest=here, this_gpu_fp32=here_fp32, six_l40s=l40s, six_l40s_pessimistic_cfc=l40s_pessimistic
        ),
        projection_by_precision={
            k: {n: v for n, v in p.items() if n not in ("fast", "portable")} for k, p in by_precision.items()
        },
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Forward + backward of the full PerceptionModel, per module (VSN, Mamba2, LN_b, pools, CfC, heads):
median time, memory saved for backward, and peak memory. Random inputs, no data pipeline; needs
torch and numpy only.

    PYTHONPATH=. python3 benchmarks/model_step.py --device cuda   # production: B=64, K=6000, D=128
    PYTHONPATH=. python3 benchmarks/model_step.py --device cpu    # B=16, K=512, D=128
    PYTHONPATH=. python3 benchmarks/model_step.py --device meta   # saved-activation bytes only, any size

Each module runs on detached leaf copies of its inputs, so its forward and backward are timed alone;
the full step (model forward, masked BCE, backward) is timed separately. "saved" counts the tensors
autograd keeps for backward (torch.autograd.graph.saved_tensors_hooks), the activation memory each
module adds. `meta` runs the model on shape-only tensors: the saved bytes at production size without
a GPU."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.atomic import atomic_write_text  # noqa: E402
from perception.model import ModelConfig, PerceptionModel, masked_bce  # noqa: E402
from perception.model.config import MambaConfig, VSNConfig  # noqa: E402
from perception.train.precision import configure as configure_precision, forward_context  # noqa: E402

HORIZONS = [30, 100, 300, 1000, 6000]
TRUNK_STAGES = ("vsn", "mamba2")  # under autocast at trainer.precision=bf16
MEMORY_LIMIT_GIB = 44.0  # an L40S has 48 GiB
SIZES = {  # (B, K) per device: production on CUDA and meta, a CPU-sized window otherwise
    "cuda": (64, 6000),
    "meta": (64, 6000),
    "cpu": (16, 512),
}


def default_features() -> int:
    """F of the synthetic data; 65 (10 levels x 6 + 5 book-wide) where the data package won't import."""
    try:
        from perception.data.features import FEATURE_NAMES

        return len(FEATURE_NAMES)
    except Exception:  # the GPU machine may lack the data package's dependencies
        return 65


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda", "meta"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, help="B (default: 64 on cuda/meta, 16 on cpu)")
    p.add_argument("--window", type=int, help="K (default: 6000 on cuda/meta, 512 on cpu)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--features", type=int, default=None, help="F (default: the synthetic data's)")
    p.add_argument("--variants", nargs="+", default=["shared", "per_horizon"], choices=["shared", "per_horizon"])
    p.add_argument("--inverted-pool", action="store_true")
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute VSN and Mamba2 in backward (the full step and its peak; the per-module rows run without)",
    )
    p.add_argument("--ops", default="auto", choices=["auto", "ref", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"], help="trainer.precision")
    p.add_argument("--compile-trunk", action="store_true", help="model.compile_trunk (the first repeat compiles)")
    p.add_argument("--ssd", default="chunked", choices=["chunked", "fla", "mamba"], help="model.mamba.ssd")
    p.add_argument("--fold-embed", action="store_true", help="model.vsn.fold_embed (experiment=production's)")
    p.add_argument("--fused-grn", action="store_true", help="model.vsn.fused_grn")
    p.add_argument("--chunk", type=int, default=MambaConfig().chunk, help="model.mamba.chunk")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (default: 3 on cuda, 5 on cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--out", type=Path, default=None, help="JSON path (default: benchmarks/results/model_step_<device>.json)"
    )
    args = p.parse_args(argv)
    b, k = SIZES[args.device]
    args.batch, args.window = args.batch or b, args.window or k
    args.features = args.features or default_features()
    args.repeats = args.repeats or (3 if args.device == "cuda" else 1 if args.device == "meta" else 5)
    args.out = args.out or Path(__file__).parent / "results" / f"model_step_{args.device}.json"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    return args


def build(args, variant: str, device: torch.device):
    cfg = ModelConfig(
        attention_pool=variant,
        d_model=args.d_model,
        vsn=VSNConfig(fold_embed=args.fold_embed, fused_grn=args.fused_grn),
        mamba=MambaConfig(),
        inverted_pool=args.inverted_pool,
        ops=args.ops,
        activation_checkpointing=args.activation_checkpointing,
        compile_trunk=args.compile_trunk,
    )
    cfg.mamba.ssd, cfg.mamba.chunk = args.ssd, args.chunk
    model = PerceptionModel(cfg, args.features, HORIZONS, seed=0).to(device)
    g = torch.Generator().manual_seed(1)
    b, k, f, h = args.batch, args.window, args.features, len(HORIZONS)
    if device.type == "meta":
        x, dt, y = torch.empty(b, k, f), torch.empty(b, k), torch.empty(b, h)
    else:
        x, dt, y = (
            torch.randn(b, k, f, generator=g),
            torch.rand(b, k, generator=g) + 0.5,
            (torch.rand(b, h, generator=g) > 0.5).float(),
        )
    mask = torch.ones(b, h, dtype=torch.bool)
    return model, x.to(device), dt.to(device), y.to(device), mask.to(device)


def stages(model: PerceptionModel, dt, y, mask) -> list[tuple[str, Callable]]:
    """The model's forward as a chain of modules; each takes and returns a tuple of tensors."""

    def pools(lnb):
        ctx = model.pool(lnb)  # (B, Q, D)
        if model.inv_pool is not None:
            from perception import ops

            ctx = ops.inv_pool_merge(ctx, model.inv_pool(lnb), backend=model.backend)
        return lnb, ctx

    def cfc(lnb, ctx):
        h_seq = model.cfc(lnb, dt / model.dt_scale, ctx.mean(dim=1))  # (B, K, D)
        return h_seq[:, -1], ctx

    return [
        ("vsn", lambda x: (model.vsn(x)[0],)),
        ("mamba2", lambda h: (model.mamba(h),)),
        ("ln_b", lambda m: (model.ln_b(m),)),  # fp32 from here on: LN_b upcasts, as in the model
        ("pools", pools),
        ("cfc", cfc),
        ("heads", lambda h_last, ctx: (masked_bce(model.head(h_last, ctx), y, mask),)),
    ]


class SavedBytes:
    """Bytes of the storages autograd keeps for backward while active, each storage once (a tensor
    saved by two ops, or many slices of one tensor, count as the memory they really hold)."""

    def __init__(self):
        self.total = 0
        self.seen: set[int] = set()
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in self.seen:  # the StorageImpl's address: unique while it is alive
            self.seen.add(storage._cdata)
            self.total += storage.nbytes()
        return t

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_stage(fn, inputs, device, precision: str = "fp32"):
    """One module's forward and backward on leaf copies of its inputs -> (outputs, fwd s, bwd s, saved bytes)."""
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    sync(device)
    t0 = time.perf_counter()
    with SavedBytes() as saved, forward_context(precision, device):
        outs = fn(*leaves)
    sync(device)
    t1 = time.perf_counter()
    grads = [torch.ones_like(o) for o in outs if o.requires_grad]
    torch.autograd.backward([o for o in outs if o.requires_grad], grads)
    sync(device)
    t2 = time.perf_counter()
    return tuple(o.detach() for o in outs), t1 - t0, t2 - t1, saved.total


def repeats_run(args) -> int:
    return args.repeats + (0 if args.device == "meta" else 1)  # the first repeat warms up


def bench_variant(args, variant: str, device: torch.device, progress) -> dict:
    model, x, dt, y, mask = build(args, variant, device)
    chain = stages(model, dt, y, mask)
    per_module = {name: {"fwd_ms": [], "bwd_ms": [], "saved_mib": 0.0} for name, _ in chain}
    full_ms, fwd_ms = [], []
    reps = repeats_run(args)
    for rep in range(reps):
        inputs = (x,)
        for name, fn in chain:
            progress(f"{variant} repeat {rep + 1}/{reps}: {name}")
            trunk = name in TRUNK_STAGES  # the model runs the rest in fp32 at every precision
            inputs, f_s, b_s, saved = run_stage(fn, inputs, device, args.precision if trunk else "fp32")
            if rep > 0 or device.type == "meta":
                per_module[name]["fwd_ms"].append(1e3 * f_s)
                per_module[name]["bwd_ms"].append(1e3 * b_s)
            per_module[name]["saved_mib"] = saved / 2**20
        if device.type == "meta":
            continue
        progress(f"{variant} repeat {rep + 1}/{reps}: full step")
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        t0 = time.perf_counter()
        with forward_context(args.precision, device):
            logits = model(x, dt)
        sync(device)
        t1 = time.perf_counter()
        masked_bce(logits.float(), y, mask).backward()
        sync(device)
        t2 = time.perf_counter()
        if rep > 0:
            full_ms.append(1e3 * (t2 - t0))
            fwd_ms.append(1e3 * (t1 - t0))
        del logits

    result = {
        "variant": variant,
        "params": sum(p.numel() for p in model.parameters()),
        "modules": {
            name: {  # meta computes nothing: its times would mean nothing
                "fwd_ms": None if device.type == "meta" else statistics.median(m["fwd_ms"]),
                "bwd_ms": None if device.type == "meta" else statistics.median(m["bwd_ms"]),
                "saved_mib": round(m["saved_mib"], 1),
            }
            for name, m in per_module.items()
        },
        "saved_total_gib": round(sum(m["saved_mib"] for m in per_module.values()) / 1024, 3),
    }
    if full_ms:
        result["step_ms_median"] = statistics.median(full_ms)
        result["forward_ms_median"] = statistics.median(fwd_ms)
        result["samples_per_s"] = args.batch / (result["step_ms_median"] / 1e3)
    if device.type == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["fits_44_gib"] = result["peak_gib"] <= MEMORY_LIMIT_GIB
    return result


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{platform.processor() or platform.machine()} x{os.cpu_count()}, {torch.get_num_threads()} torch threads, "
        f"load average {load:.1f} at start (torch {torch.__version__})"
    )


def print_table(report: dict) -> None:
    print(
        f"\nmodel step, {report['machine']}: B={report['batch']} K={report['window']} D={report['d_model']} "
        f"F={report['features']} H={len(HORIZONS)} ops={report['ops']} "
        f"checkpointing={report['activation_checkpointing']} precision={report.get('precision', 'fp32')} "
        f"compiled={report.get('compile_trunk', False)} ssd={report.get('ssd', 'chunked')} "
        f"chunk={report.get('chunk', 128)} fold_embed={report.get('fold_embed', False)} "
        f"fused_grn={report.get('fused_grn', False)}; medians of {report['repeats']}"
    )
    for r in report["results"]:
        print(f"\n{r['variant']} ({r['params']:,} parameters)")
        print(f"  {'module':<8} {'fwd ms':>10} {'bwd ms':>10} {'saved MiB':>11}")
        for name, m in r["modules"].items():
            times = [f"{t:>10.1f}" if t is not None else f"{'-':>10}" for t in (m["fwd_ms"], m["bwd_ms"])]
            print(f"  {name:<8} {times[0]} {times[1]} {m['saved_mib']:>11.1f}")
        line = f"  saved for backward: {r['saved_total_gib']:.2f} GiB"
        if "step_ms_median" in r:
            line += (
                f"; full step {r['step_ms_median']:.1f} ms (forward {r['forward_ms_median']:.1f}), "
                f"{r['samples_per_s']:.1f} samples/s"
            )
        if "peak_gib" in r:
            line += (
                f"; peak {r['peak_gib']:.2f} GiB ({'fits' if r['fits_44_gib'] else 'EXCEEDS'} "
                f"{MEMORY_LIMIT_GIB:.0f} GiB)"
            )
        print(line)


def plot(report: dict, path: Path) -> None:
    """Per-module time and saved memory as bars, beside the JSON (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    results = [r for r in report["results"] if "error" not in r]
    if not results:
        return
    names = list(results[0]["modules"])
    timed = results[0]["modules"][names[0]]["fwd_ms"] is not None
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 6, 4), squeeze=False)
    width = 0.8 / len(results)
    for i, r in enumerate(results):
        xs = [j + i * width for j in range(len(names))]
        axes[0][0].bar(xs, [r["modules"][n]["saved_mib"] / 1024 for n in names], width, label=r["variant"])
        if timed:
            ms = [r["modules"][n]["fwd_ms"] + r["modules"][n]["bwd_ms"] for n in names]
            axes[0][1].bar(xs, ms, width, label=r["variant"])
    axes[0][0].set_ylabel("saved for backward (GiB)")
    if timed:
        axes[0][1].set_ylabel("forward + backward (ms, median)")
    for ax in axes[0]:
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
        ax.legend()
    fig.suptitle(
        f"model step on {report['device']}: B={report['batch']} K={report['window']} D={report['d_model']} "
        f"F={report['features']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    configure_precision(args.precision, device)
    try:
        from tqdm import tqdm

        bar = tqdm(
            total=len(args.variants) * repeats_run(args) * (6 if args.device == "meta" else 7),
            unit="stage",
            file=sys.stderr,
        )
    except ImportError:
        bar = None

    def progress(what: str) -> None:
        if bar is not None:
            bar.set_description(what)
            bar.update(1)
        else:
            print(what, file=sys.stderr, flush=True)

    report = {
        "benchmark": "model_step",
        "device": args.device,
        "machine": machine(device),
        "batch": args.batch,
        "window": args.window,
        "d_model": args.d_model,
        "features": args.features,
        "horizons": HORIZONS,
        "inverted_pool": args.inverted_pool,
        "activation_checkpointing": args.activation_checkpointing,
        "ops": args.ops,
        "repeats": args.repeats,
        "precision": args.precision,
        "compile_trunk": args.compile_trunk,
        "ssd": args.ssd,
        "chunk": args.chunk,
        "fold_embed": args.fold_embed,
        "fused_grn": args.fused_grn,
        "results": [],
    }
    for variant in args.variants:
        try:
            report["results"].append(bench_variant(args, variant, device, progress))
        except torch.cuda.OutOfMemoryError as exc:  # record it, keep what was measured
            report["results"].append(
                {
                    "variant": variant,
                    "error": f"CUDA out of memory: {exc}".splitlines()[0],
                    "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                }
            )
            torch.cuda.empty_cache()
    if bar is not None:
        bar.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
    print_table({**report, "results": [r for r in report["results"] if "error" not in r]})
    for r in report["results"]:
        if "error" in r:
            print(f"\n{r['variant']}: {r['error']} (peak {r['peak_gib']:.2f} GiB)")
    plot(report, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} (and a .png beside it where matplotlib is installed)")
    return 1 if any("error" in r for r in report["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())

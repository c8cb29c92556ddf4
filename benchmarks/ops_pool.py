"""Pool family (attention pool, inverted pool, merge) vs eager PyTorch, torch.compile, SDPA and the HBM
floor (fp32, TF32 off).

    PYTHONPATH=. python benchmarks/ops_pool.py [--batch 64 --window 6000 --d 128 --queries 1 5]

Prints one table and writes benchmarks/results/ops_pool.json and ops_pool.md. Times are medians of CUDA-event
timed calls (host launch and autograd time included); the floor is the op's compulsory HBM bytes at the
device-to-device copy bandwidth measured in the same run. GPU time alone comes from CUDA graphs of
back-to-back iterations: the kernels by themselves and eager's forward + autograd backward, so the targets
(a multiple of the floor, a speed-up over eager) compare like with like. The CfC family has its own
benchmark, benchmarks/ops_cfc.py.

With --profile-once it times nothing and writes nothing: one forward + backward of each pool op at the same
shapes, for a kernel profiler to attach to.

    ncu --kernel-name regex:"attention_pool|inverted_pool" --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --csv python benchmarks/ops_pool.py --profile-once > pools_ncu.csv"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cuda_timing import cuda_median_ms, graph_ms, machine_info, write_table  # noqa: E402
from perception.ops import (  # noqa: E402
    attention_pool,
    attention_pool_ref,
    extension,
    inv_pool_merge,
    inv_pool_merge_ref,
    inverted_pool,
    inverted_pool_ref,
)

MERGE_TARGET_MS = 0.010
POOL_TARGET_X_FLOOR = 1.5
INVERTED_TARGET_SPEEDUP = 3.0
TARGETS = {
    "attention_pool": f"fwd+bwd <= {POOL_TARGET_X_FLOOR}x floor",
    "inverted_pool": f">= {INVERTED_TARGET_SPEEDUP:.0f}x faster than eager fwd+bwd",
    "inv_pool_merge": f"fwd+bwd <= {MERGE_TARGET_MS:.3f} ms GPU time",
}


def time_ms(fn, reps: int, warmup: int = 3) -> float:
    return cuda_median_ms(fn, reps, warmup)


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Bytes/ms of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)  # noqa: F821 (deleted after use; the lambda runs first)
    del src, dst
    return 2 * nbytes / ms


def fwd(fn, inputs):
    def step():
        with torch.no_grad():
            fn(*inputs)

    return step


def fwd_bwd(fn, inputs, cot):
    leaves = [x.detach().requires_grad_(True) for x in inputs]

    def step():
        torch.autograd.grad(fn(*leaves), leaves, cot)

    return step


def sdpa_pool(lnb, q):
    b, _, d = lnb.shape
    kv = lnb.unsqueeze(1)  # (B, 1, K, D)
    return F.scaled_dot_product_attention(q.expand(b, 1, -1, d), kv, kv, scale=1.0).squeeze(1)


def run_pool(args, bw: float) -> list[dict]:
    b, k, d = args.batch, args.window, args.d
    lnb_bytes = b * k * d * 4
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    lnb = torch.randn(b, k, d, device="cuda", generator=gen)
    for nq in args.queries:
        q = torch.randn(nq, d, device="cuda", generator=gen) / d**0.5
        cot = torch.randn(b, nq, d, device="cuda", generator=gen)
        impls = {
            "cuda": lambda x, w: attention_pool(x, w, backend="cuda"),
            "eager": attention_pool_ref,
            "sdpa": sdpa_pool,
        }
        if not args.no_compile:
            impls["torch.compile"] = torch.compile(attention_pool_ref, dynamic=False)
        floor_f, floor_fb = lnb_bytes / bw, 3 * lnb_bytes / bw  # read LNb | read it twice, write d_LNb
        for impl, fn in impls.items():
            f = time_ms(fwd(fn, [lnb, q]), args.reps)
            fb = time_ms(fwd_bwd(fn, [lnb, q], cot), args.reps)
            rows.append(
                dict(
                    op="attention_pool",
                    impl=impl,
                    shape=f"B={b} K={k} D={d} Q={nq}",
                    fwd_ms=f,
                    fwdbwd_ms=fb,
                    floor_fwd_ms=floor_f,
                    floor_fwdbwd_ms=floor_fb,
                    note=f"{fb / floor_fb:.2f}x floor fwd+bwd (event-timed, host included)",
                )
            )
        rows += pool_graph_rows(lnb, q, cot, args.reps, f"B={b} K={k} D={d} Q={nq}", floor_f, floor_fb)
    return rows


def verdict(value: float, target: float, higher_is_better: bool = False) -> str:
    met = value >= target if higher_is_better else value <= target
    return "meets" if met else f"misses by {abs(value / target - 1) * 100:.1f}%"


def autograd_graph_ms(fn, inputs, cot, reps: int) -> float:
    """GPU time of forward + autograd backward captured whole in one CUDA graph (host time left out);
    NaN where this autograd graph cannot be captured."""
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    try:
        return graph_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, cot), reps, inner=10)
    except RuntimeError as exc:
        print(
            f"autograd capture of {getattr(fn, '__name__', fn)} failed: {str(exc).splitlines()[0][:120]}",
            file=sys.stderr,
        )
        return float("nan")


def pool_graph_rows(lnb, q, cot, reps: int, shape: str, floor_f: float, floor_fb: float) -> list[dict]:
    """GPU time from CUDA graphs: the kernels alone (forward; forward then backward), and eager's forward +
    autograd backward. The event-timed rows above also hold the host's launch and autograd time, which a
    training step overlaps with the GPU's work."""
    ops = torch.ops.perception

    def both():
        c, st, sc = ops.attention_pool(lnb, q)
        ops.attention_pool_bwd(cot, lnb, q, c, st, sc)

    f, fb = graph_ms(lambda: ops.attention_pool(lnb, q), reps, inner=10), graph_ms(both, reps, inner=10)
    eager_fb = autograd_graph_ms(attention_pool_ref, [lnb, q], cot, reps)
    x = fb / floor_fb
    return [
        dict(
            op="attention_pool",
            impl="cuda kernels, CUDA graph",
            shape=shape,
            fwd_ms=f,
            fwdbwd_ms=fb,
            floor_fwd_ms=floor_f,
            floor_fwdbwd_ms=floor_fb,
            note=f"{x:.2f}x floor fwd+bwd (target {POOL_TARGET_X_FLOOR}x: {verdict(x, POOL_TARGET_X_FLOOR)}); "
            f"fwd {f / floor_f:.2f}x its floor; GPU time",
        ),
        dict(
            op="attention_pool",
            impl="eager, CUDA graph",
            shape=shape,
            fwd_ms=None,
            fwdbwd_ms=eager_fb,
            floor_fwd_ms=floor_f,
            floor_fwdbwd_ms=floor_fb,
            note=f"{eager_fb / floor_fb:.2f}x floor fwd+bwd; GPU time",
        ),
    ]


def run_inverted(args, bw: float) -> list[dict]:
    b, k, d = args.batch, args.window, args.d
    lnb = torch.randn(b, k, d, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    cot = torch.randn(b, d, device="cuda")
    impls = {"cuda": lambda x: inverted_pool(x, backend="cuda"), "eager": inverted_pool_ref}
    if not args.no_compile:
        impls["torch.compile"] = torch.compile(inverted_pool_ref, dynamic=False)
    rows, eager_fb = [], None
    floor_fb = 3 * lnb.numel() * 4 / bw
    ops = torch.ops.perception

    def both():
        inv, attn, mean = ops.inverted_pool(lnb)
        ops.inverted_pool_bwd(cot, lnb, attn, mean, inv)

    for impl, fn in impls.items():
        f = time_ms(fwd(fn, [lnb]), args.reps)
        fb = time_ms(fwd_bwd(fn, [lnb], cot), args.reps)
        eager_fb = fb if impl == "eager" else eager_fb
        rows.append(
            dict(
                op="inverted_pool",
                impl=impl,
                shape=f"B={b} K={k} D={d}",
                fwd_ms=f,
                fwdbwd_ms=fb,
                floor_fwd_ms=lnb.numel() * 4 / bw,
                floor_fwdbwd_ms=floor_fb,
                note="",
            )
        )
    for r in rows:
        r["note"] = f"{eager_fb / r['fwdbwd_ms']:.2f}x faster than eager fwd+bwd (event-timed, host included)"
    f, fb = graph_ms(lambda: ops.inverted_pool(lnb), args.reps, inner=10), graph_ms(both, args.reps, inner=10)
    eager_graph = autograd_graph_ms(inverted_pool_ref, [lnb], cot, args.reps)
    speedup = eager_graph / fb
    rows.append(
        dict(
            op="inverted_pool",
            impl="cuda kernels, CUDA graph",
            shape=f"B={b} K={k} D={d}",
            fwd_ms=f,
            fwdbwd_ms=fb,
            floor_fwd_ms=lnb.numel() * 4 / bw,
            floor_fwdbwd_ms=floor_fb,
            note=f"{speedup:.2f}x faster than eager fwd+bwd, both GPU time (target {INVERTED_TARGET_SPEEDUP:.0f}x: "
            f"{verdict(speedup, INVERTED_TARGET_SPEEDUP, higher_is_better=True)}); "
            f"{2 * 2 * k * d * d * b / 1e9:.1f} GFLOP",
        )
    )
    rows.append(
        dict(
            op="inverted_pool",
            impl="eager, CUDA graph",
            shape=f"B={b} K={k} D={d}",
            fwd_ms=None,
            fwdbwd_ms=eager_graph,
            floor_fwd_ms=lnb.numel() * 4 / bw,
            floor_fwdbwd_ms=floor_fb,
            note="forward + autograd backward; GPU time",
        )
    )
    return rows


def run_merge(args, bw: float) -> list[dict]:
    b, d = args.batch, args.d
    rows = []
    for nq in args.queries:
        ctx, inv = torch.randn(b, nq, d, device="cuda"), torch.randn(b, d, device="cuda")
        cot = torch.randn(b, nq, d, device="cuda")
        for impl, fn in {
            "cuda": lambda c, i: inv_pool_merge(c, i, backend="cuda"),
            "eager": inv_pool_merge_ref,
        }.items():
            f = time_ms(fwd(fn, [ctx, inv]), args.reps * 5)
            fb = time_ms(fwd_bwd(fn, [ctx, inv], cot), args.reps * 5)
            rows.append(
                dict(
                    op="inv_pool_merge",
                    impl=impl,
                    shape=f"B={b} Q={nq} D={d}",
                    fwd_ms=f,
                    fwdbwd_ms=fb,
                    floor_fwd_ms=None,
                    floor_fwdbwd_ms=None,
                    note="launch-bound; event-timed incl. autograd",
                )
            )
        rows += merge_graph_rows(ctx, inv, cot, args.reps, f"B={b} Q={nq} D={d}")
    return rows


def merge_graph_rows(ctx, inv, cot, reps: int, shape: str) -> list[dict]:
    """GPU time of the merge: its two kernels (forward; backward d_inv = sum_q grad, d_ctx = grad is free)
    and the same through autograd, each from a CUDA graph; eager's two kernels likewise."""
    ops = torch.ops.perception
    kernels = {
        "fwd": lambda: ops.inv_pool_merge(ctx, inv),
        "fwd+bwd": lambda: (ops.inv_pool_merge(ctx, inv), ops.inv_pool_merge_bwd(cot)),
    }
    eager = {
        "fwd": lambda: inv_pool_merge_ref(ctx, inv),
        "fwd+bwd": lambda: (inv_pool_merge_ref(ctx, inv), cot.sum(dim=1)),
    }
    rows = []
    for impl, steps in {"cuda kernels, CUDA graph": kernels, "eager kernels, CUDA graph": eager}.items():
        f, fb = graph_ms(steps["fwd"], reps), graph_ms(steps["fwd+bwd"], reps)
        verdict = "meets" if fb <= MERGE_TARGET_MS else f"misses by {(fb - MERGE_TARGET_MS) * 1e3:.1f} us"
        rows.append(
            dict(
                op="inv_pool_merge",
                impl=impl,
                shape=shape,
                fwd_ms=f,
                fwdbwd_ms=fb,
                floor_fwd_ms=None,
                floor_fwdbwd_ms=None,
                note=f"GPU time per iteration; <= 10 us: {verdict}",
            )
        )
    leaves = [ctx.detach().requires_grad_(True), inv.detach().requires_grad_(True)]
    try:
        fb = graph_ms(lambda: torch.autograd.grad(inv_pool_merge(*leaves, backend="cuda"), leaves, cot), reps)
        note = "autograd fwd+bwd captured whole; GPU time per iteration"
    except RuntimeError as exc:  # capture of this autograd graph unsupported: say so in the table
        fb, note = None, f"autograd capture failed: {str(exc).splitlines()[0][:80]}"
    rows.append(
        dict(
            op="inv_pool_merge",
            impl="cuda autograd, CUDA graph",
            shape=shape,
            fwd_ms=None,
            fwdbwd_ms=fb,
            floor_fwd_ms=None,
            floor_fwdbwd_ms=None,
            note=note,
        )
    )
    return rows


def profile_once(args) -> int:
    """A warm-up pass first (allocator, library load), then the measured pass: attention pool at each of
    --queries, then the inverted pool, each its forward then its backward kernels, called through torch.ops
    directly."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    lnb = torch.randn(args.batch, args.window, args.d, device="cuda", generator=gen)
    queries = {nq: torch.randn(nq, args.d, device="cuda", generator=gen) / args.d**0.5 for nq in args.queries}
    cot = {nq: torch.randn(args.batch, nq, args.d, device="cuda", generator=gen) for nq in queries}
    g_inv = torch.randn(args.batch, args.d, device="cuda", generator=gen)
    for _ in range(2):  # warm-up, then the pass a profiler skips to
        one_pass(lnb, queries, cot, g_inv)
    torch.cuda.synchronize()
    return 0


def one_pass(lnb: torch.Tensor, queries: dict[int, torch.Tensor], cot: dict[int, torch.Tensor], g_inv) -> None:
    ops = torch.ops.perception
    for nq, q in queries.items():
        ctx, stats, scores = ops.attention_pool(lnb, q)
        ops.attention_pool_bwd(cot[nq], lnb, q, ctx, stats, scores)
    inv, attn, mean = ops.inverted_pool(lnb)
    ops.inverted_pool_bwd(g_inv, lnb, attn, mean, inv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows (slow to compile)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ops_pool.json"))
    parser.add_argument(
        "--profile-once", action="store_true", help="one fwd+bwd of each pool op for a kernel profiler; no timing"
    )
    args = parser.parse_args(argv)
    extension.require()
    if args.profile_once:
        return profile_once(args)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    started = time.perf_counter()
    bw = copy_bandwidth()
    machine = machine_info(copy_tb_s=bw / 1e9)
    out = Path(args.out)
    rows: list[dict] = []
    for part in (run_pool, run_inverted, run_merge):
        rows += part(args, bw)
        write_table(out, rows, machine, TARGETS, markdown=False)  # keep what is measured
    print(f"measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(write_table(out, rows, machine, TARGETS))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

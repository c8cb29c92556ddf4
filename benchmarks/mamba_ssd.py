"""One compiled Mamba2 block at production size (B=64, K=6000, D=128), forward + backward on one GPU, with the
SSD's within-chunk decay in each form (`perception.model.mamba2.within_chunk_decay`): the masked-copy segment
sums against exp of differences of the chunk's cumulative sum, at each chunk length and precision asked for.
Per row: median ms, peak memory, bytes saved for backward, the kernels that dominate, and the largest relative
error of the output and every gradient against the eager fp32 block with masked sums.

    PYTHONPATH=. python3 benchmarks/mamba_ssd.py [--precisions tf32,bf16] [--chunks 64,128]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cuda_timing import cuda_median_ms, machine_info  # noqa: E402
from benchmarks.model_step import SavedBytes  # noqa: E402
from benchmarks.train_step import kernel_times  # noqa: E402
from perception.atomic import atomic_write_text  # noqa: E402
from perception.model.config import MambaConfig  # noqa: E402
from perception.model.init import module_generator  # noqa: E402
from perception.model.mamba2 import Mamba2Block  # noqa: E402
from perception.train.precision import configure as configure_precision, forward_context  # noqa: E402


def make_block(d_model: int, chunk: int) -> Mamba2Block:
    cfg = MambaConfig(chunk=chunk)
    block = Mamba2Block(
        d_model, d_state=cfg.d_state, headdim=cfg.headdim, expand=cfg.expand, d_conv=cfg.d_conv, chunk=chunk
    )
    block.reset_parameters(module_generator(0, "mamba"))
    return block.cuda()


def compile_as(block: Mamba2Block, decay_from_cumsum: bool, shape_padding: bool) -> None:
    """The block compiled as `Mamba2Block.compile_fused` does (from the cumulative sum, no shape padding), or
    with the choice it rejected in either: the mixer reads its decay form when the first call traces it."""
    block.compile_fused()
    block.mixer._decay_from_cumsum = decay_from_cumsum
    if shape_padding:
        block.compile(dynamic=False, options={"shape_padding": True})  # replaces compile_fused's compiled call


def fwd_bwd(block: Mamba2Block, u: torch.Tensor, grad: torch.Tensor, precision: str):
    """-> (output, input grad, parameter grads) of one forward + backward."""
    block.zero_grad(set_to_none=True)
    leaf = u.detach().requires_grad_()
    with forward_context(precision, u.device):
        out = block(leaf)
    out.backward(grad)
    return out.detach().float(), leaf.grad, [p.grad for p in block.parameters()]


def top_aten_ops(fn, top: int) -> list[dict]:
    """The ATen operators (outside Inductor's kernels) with the most CUDA time over one call, by input shapes:
    what the compiled graph hands back to eager kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [
        dict(op=e.key, shapes=str(e.input_shapes)[:120], ms=e.self_device_time_total / 1e3, calls=e.count)
        for e in events[:top]
    ]


def max_rel_error(got, ref) -> float:
    pairs = [(got[0], ref[0]), (got[1], ref[1])] + list(zip(got[2], ref[2]))
    return max(((a.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-30)).item() for a, r in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--precisions", default="tf32,bf16")
    parser.add_argument("--chunks", default="64")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--forms", default="masked,cumsum", help="decay forms: masked (sums), cumsum")
    parser.add_argument("--shape-padding", default="on", help="Inductor's matmul shape padding: on, off or on,off")
    parser.add_argument("--aten", action="store_true", help="also the ATen ops with the most CUDA time, per row")
    parser.add_argument("--out", default="benchmarks/results/mamba_ssd.json")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    u = torch.randn(args.batch, args.window, args.d_model, generator=g).cuda()
    grad = torch.randn(args.batch, args.window, args.d_model, generator=g).cuda()
    rows = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        configure_precision("fp32", u.device)
        ref = fwd_bwd(make_block(args.d_model, chunk), u, grad, "fp32")  # eager, masked sums
        for precision in args.precisions.split(","):
            for from_cumsum, padding in itertools.product(
                [form == "cumsum" for form in args.forms.split(",")], [p == "on" for p in args.shape_padding.split(",")]
            ):
                torch._dynamo.reset()
                configure_precision(precision, u.device)
                block = make_block(args.d_model, chunk)
                compile_as(block, from_cumsum, padding)
                got = fwd_bwd(block, u, grad, precision)  # compiles
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                ms = cuda_median_ms(lambda: fwd_bwd(block, u, grad, precision), args.reps)  # noqa: F821 (deleted after use; the lambda runs first)
                peak = torch.cuda.max_memory_allocated() / 2**30
                with SavedBytes() as saved:
                    leaf = u.detach().requires_grad_()
                    with forward_context(precision, u.device):
                        block(leaf)
                kernels, _, gpu_ms = kernel_times(lambda: fwd_bwd(block, u, grad, precision), args.top)  # noqa: F821 (deleted after use; the lambda runs first)
                aten = top_aten_ops(lambda: fwd_bwd(block, u, grad, precision), args.top) if args.aten else []  # noqa: F821 (deleted after use; the lambda runs first)
                row = dict(
                    aten=aten,
                    chunk=chunk,
                    precision=precision,
                    decay="from cumsum" if from_cumsum else "masked sums",
                    shape_padding=padding,
                    fwd_bwd_ms=ms,
                    gpu_ms=gpu_ms,
                    peak_gib=peak,
                    saved_gib=saved.total / 2**30,
                    max_rel_error=max_rel_error(got, ref),
                    kernels=kernels,
                )
                rows.append(row)
                print(
                    f"chunk {chunk:4} {precision:5} {row['decay']:12} pad {'on ' if padding else 'off'} fwd+bwd "
                    f"{ms:7.2f} ms  (kernels {gpu_ms:6.2f})  "
                    f"peak {peak:5.2f} GiB  saved {row['saved_gib']:5.2f} GiB  max rel err {row['max_rel_error']:.2e}",
                    flush=True,
                )
                del block
                torch.cuda.empty_cache()
    print(
        f"\none Mamba2 block, B={args.batch} K={args.window} D={args.d_model}, compiled, on "
        f"{torch.cuda.get_device_name()}; medians of {args.reps}; error against eager fp32 with masked sums"
    )
    print(
        f"{'chunk':>5} {'precision':9} {'decay':12} {'pad':3} {'fwd+bwd ms':>10} {'saved GiB':>9} {'max rel err':>11}"
    )
    for r in rows:
        print(
            f"{r['chunk']:5} {r['precision']:9} {r['decay']:12} {'on ' if r['shape_padding'] else 'off'} "
            f"{r['fwd_bwd_ms']:10.2f} {r['saved_gib']:9.2f} "
            f"{r['max_rel_error']:11.2e}"
        )
    for r in rows:
        print(
            f"\n{r['chunk']} {r['precision']} {r['decay']} padding {'on' if r['shape_padding'] else 'off'}: top "
            f"kernels of {r['gpu_ms']:.2f} ms"
        )
        for k in r["kernels"]:
            print(f"  {k['ms']:7.2f} ms  {k['name']}")
        for op in r["aten"]:
            print(f"  {op['ms']:7.2f} ms  {op['calls']:3}x {op['op']} {op['shapes']}")
    out = dict(benchmark="mamba_ssd", machine=machine_info(), config=vars(args), rows=rows)
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

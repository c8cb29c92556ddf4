"""The compiled trunk's pieces in each of their forms, forward + backward at production size on one GPU.

One subcommand per piece, each with its own flags and its own results file:

- conv: Mamba2's causal depthwise convolution alone, ATen's depthwise conv1d against shifted multiply-adds
  (benchmarks/results/mamba_conv.json).
- ssd: one compiled Mamba2 block with the SSD's within-chunk decay in each form, per chunk length, precision
  and Inductor shape padding (benchmarks/results/mamba_ssd.json).
- fusion: the trunk's fused forms against the ones they replaced, a Mamba2 block's conv and the VSN's grouped
  linears (benchmarks/results/trunk_fusion.json).

    PYTHONPATH=. python3 benchmarks/trunk_forms.py conv [--precision bf16] [--out benchmarks/results/mamba_conv.json]
    PYTHONPATH=. python3 benchmarks/trunk_forms.py ssd [--precisions tf32,bf16] [--chunks 64,128]
    PYTHONPATH=. python3 benchmarks/trunk_forms.py fusion [--precisions tf32,bf16] [--out
    benchmarks/results/trunk_fusion.json]
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cuda_timing import cuda_median_ms, machine_info  # noqa: E402
from benchmarks.model_step import SavedBytes  # noqa: E402
from benchmarks.train_step import kernel_times  # noqa: E402
from perception.atomic import atomic_write_text  # noqa: E402
from perception.model.config import MambaConfig  # noqa: E402
from perception.model.init import module_generator  # noqa: E402
from perception.model.mamba2 import Mamba2Block, conv_silu_split  # noqa: E402
from perception.model.vsn import VSN, grouped_linear, grouped_linear_block_diag  # noqa: E402
from perception.train.precision import configure as configure_precision, forward_context  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pieces = parser.add_subparsers(dest="piece", required=True, metavar="{" + ",".join(PIECES) + "}")
    for name, (add_flags, timed) in PIECES.items():
        doc = inspect.cleandoc(timed.__doc__ or "")
        add_flags(
            pieces.add_parser(
                name,
                help=doc.splitlines()[0],
                description=doc,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    args = parser.parse_args(argv)
    timed = PIECES[args.piece][1]
    del args.piece  # the results' config records the piece's own flags alone
    timed(args)


def conv_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--channels", type=int, default=384, help="conv_dim = d_inner + 2 d_state")
    parser.add_argument("--d-conv", type=int, default=4)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/mamba_conv.json")


def time_conv(args: argparse.Namespace) -> None:
    """Mamba2's causal depthwise convolution alone, ATen's depthwise conv1d against shifted multiply-adds.

    At production size, forward + backward on one GPU: the block's nn.Conv1d over (B, C, K) (ATen's depthwise
    kernels, outside what Inductor fuses) against the same convolution written as d_conv shifted multiply-adds
    over (B, K, C), compiled, which Inductor can fuse with the SiLU and the split around it. Both compute
    y[b, t, c] = bias[c] + sum_j w[c, j] x[b, t-d+1+j, c]."""
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, args.window, args.channels, generator=g).to("cuda", dtype)
    w = (torch.randn(args.channels, 1, args.d_conv, generator=g) / 2).cuda().requires_grad_()
    b = torch.randn(args.channels, generator=g).cuda().requires_grad_()
    grad_out = torch.randn(args.batch, args.window, args.channels, generator=g).to("cuda", dtype)
    rows, results = [], {}
    for name, fn in (
        ("conv1d eager", conv1d_path),
        ("conv1d compiled", torch.compile(conv1d_path, dynamic=False)),
        ("shifted compiled", torch.compile(shifted_path, dynamic=False)),
    ):
        leaf = x.clone().requires_grad_()

        def step():
            w.grad = b.grad = leaf.grad = None
            fn(leaf, w.to(dtype), b.to(dtype)).backward(grad_out)

        ms = cuda_median_ms(step, args.reps, warmup=2)
        results[name] = (leaf.grad.float(), w.grad.clone(), b.grad.clone())
        rows.append(dict(path=name, fwd_bwd_ms=ms))
    ref = results["conv1d eager"]
    for row in rows:
        got = results[row["path"]]
        row["max_rel_error"] = max(((a - r).abs().max() / r.abs().max()).item() for a, r in zip(got, ref))
    print(
        f"causal depthwise conv + SiLU, B={args.batch} K={args.window} C={args.channels} d={args.d_conv}, "
        f"{args.precision}, on {torch.cuda.get_device_name()}; medians of {args.reps}"
    )
    print(f"{'path':18} {'fwd+bwd ms':>11} {'max rel err':>12}")
    for row in rows:
        print(f"{row['path']:18} {row['fwd_bwd_ms']:11.2f} {row['max_rel_error']:12.2e}")
    out = dict(machine=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__), config=vars(args), rows=rows)
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


def conv1d_path(xbc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """xbc: (B, K, C), weight: (C, 1, d), bias: (C,) -> (B, K, C), as Mamba2Mixer does it today."""
    k, d = xbc.shape[1], weight.shape[-1]
    y = F.conv1d(xbc.transpose(1, 2), weight, bias, padding=d - 1, groups=xbc.shape[-1])
    return F.silu(y[..., :k].transpose(1, 2))


def shifted_path(xbc: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The same convolution as d shifted multiply-adds in (B, K, C) layout."""
    k, d = xbc.shape[1], weight.shape[-1]
    padded = F.pad(xbc, (0, 0, d - 1, 0))  # (B, K + d - 1, C), zeros before t = 0
    y = bias + sum(padded[:, j : j + k] * weight[:, 0, j] for j in range(d))
    return F.silu(y)


def ssd_flags(parser: argparse.ArgumentParser) -> None:
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


def time_ssd(args: argparse.Namespace) -> None:
    """One compiled Mamba2 block with the SSD's within-chunk decay in each form.

    At production size (B=64, K=6000, D=128), forward + backward on one GPU, with the SSD's within-chunk decay
    in each form (`perception.model.mamba2.within_chunk_decay`): the masked-copy segment sums against exp of
    differences of the chunk's cumulative sum, at each chunk length and precision asked for. Per row: median
    ms, peak memory, bytes saved for backward, the kernels that dominate, and the largest relative error of
    the output and every gradient against the eager fp32 block with masked sums."""
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


def fusion_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--features", type=int, default=65)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--precisions", default="tf32,bf16")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--modules", default="vsn,mamba2", help="of vsn, mamba2")
    parser.add_argument(
        "--vsn-forms",
        default="after,pointwise",
        help="VSN forms beside 'before': after (the model's), pointwise, fused_grn (model.vsn.fused_grn), folded "
        "(model.vsn.fold_embed), fused_grn_folded (both)",
    )
    parser.add_argument("--out", default="benchmarks/results/trunk_fusion.json")


def time_fusion(args: argparse.Namespace) -> None:
    """The trunk's fused forms against the ones they replaced: a Mamba2 block's conv, the VSN's linears.

    Two rewrites of the compiled trunk for Inductor to fuse, before and after, at production size on one GPU:
    one Mamba2 block compiled with ATen's depthwise conv1d (before) or the shifted multiply-adds that the
    model compiles (after, `causal_conv_shifted`), and the VSN in its four compiled regions with the variable
    GRNs' linears as eager's batched GEMMs (before) or in another form: one dense block-diagonal GEMM (what
    the model compiles, `grouped_linear_block_diag`; "after", recorded as "block_diag" before the model took
    it) or pointwise multiply-adds (`grouped_linear_pointwise` below, measured slower). Forward + backward
    GPU time (medians), peak memory, and the largest relative error of outputs and gradients against eager
    fp32."""
    g = torch.Generator().manual_seed(1)
    b, k, d = args.batch, args.window, args.d_model
    x = torch.randn(b, k, args.features, generator=g).cuda()
    h = torch.randn(b, k, d, generator=g).cuda()
    grad = (torch.randn(b, k, d, generator=g) / (b * k) ** 0.5).cuda()
    modules = {
        "vsn": (lambda form: vsn_module(args.features, d, form), x, ["before", *args.vsn_forms.split(",")]),
        "mamba2 block": (lambda form: mamba_module(d, args.chunk, form), h, ["before", "after"]),
    }
    modules = {name: m for name, m in modules.items() if name.split()[0] in args.modules.split(",")}
    gpu = torch.cuda.get_device_name()
    print(
        f"compiled trunk forms, B={b} K={k} F={args.features} D={d} chunk {args.chunk}, fwd+bwd, on {gpu} "
        f"(torch {torch.__version__}); medians of {args.reps}",
        flush=True,
    )
    rows = []
    for name, (make, inp, forms) in modules.items():
        _, _, ref = run(make("eager"), inp, grad, "fp32", 1)
        for precision in [p for p in args.precisions.split(",") if p]:
            for form in forms:
                ms, peak, got = run(make(form), inp, grad, precision, args.reps)
                row = dict(
                    module=name,
                    precision=precision,
                    form=form,
                    fwd_bwd_ms=ms,
                    peak_gib=peak,
                    max_rel_error_vs_eager_fp32=max_rel(got, ref),
                )
                rows.append(row)
                print(
                    f"  {name:13} {precision:5} {form:7} {ms:8.2f} ms  peak {peak:6.2f} GiB  "
                    f"max rel err {row['max_rel_error_vs_eager_fp32']:.2e}",
                    flush=True,
                )
                torch.cuda.empty_cache()
    print(f"\n{'module':13} {'precision':9} {'form':11} {'ms':>8} {'saved':>7}")
    for r in rows:
        before = next(
            b for b in rows if (b["module"], b["precision"], b["form"]) == (r["module"], r["precision"], "before")
        )
        if r is not before:
            print(
                f"{r['module']:13} {r['precision']:9} {r['form']:11} {r['fwd_bwd_ms']:8.2f} "
                f"{before['fwd_bwd_ms'] - r['fwd_bwd_ms']:7.2f}"
            )
    out = dict(machine=dict(gpu=gpu, torch=torch.__version__), config=vars(args), rows=rows)
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


def grouped_linear_pointwise(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GroupedGRN's per-variable linear as i broadcast multiply-adds: a (..., F, i), w (F, o, i), b (F, o)."""
    out = b + a[..., 0:1] * w[..., 0]  # (..., F, o)
    for i in range(1, a.shape[-1]):
        out = out + a[..., i : i + 1] * w[..., i]
    return out


# GroupedGRN reads its linear at trace time: each form is set after compile_regions, before the first call
VSN_FORMS = {"before": grouped_linear, "after": grouped_linear_block_diag, "pointwise": grouped_linear_pointwise}


def vsn_module(features: int, d_model: int, form: str) -> torch.nn.Module:
    """`fused_grn`: the variables' GRNs and their weighting in grn_select's Triton kernels (model.vsn.fused_grn);
    `folded`: the linears that read the embedding folded into it (model.vsn.fold_embed)."""
    vsn = VSN(features, 8, d_model, fused_grn=form.startswith("fused_grn"), fold_embed=form.endswith("folded"))
    vsn.reset_parameters(torch.Generator().manual_seed(0))
    if form != "eager":
        vsn.compile_regions()
    if form in VSN_FORMS:
        vsn.var_grn._linear = VSN_FORMS[form]
    return vsn.cuda()


def mamba_module(d_model: int, chunk: int, form: str) -> torch.nn.Module:
    block = Mamba2Block(d_model, d_state=64, headdim=32, expand=2, d_conv=4, chunk=chunk)
    block.reset_parameters(torch.Generator().manual_seed(0))
    if form == "before":
        block.compile(dynamic=False)
        block.mixer._conv_silu_split = conv_silu_split
    elif form == "after":
        block.compile_fused()
    return block.cuda()


def run(module: torch.nn.Module, inp: torch.Tensor, grad: torch.Tensor, precision: str, reps: int):
    """Median fwd+bwd ms, peak GiB over the timed steps, and the output and gradients of one step."""
    torch._dynamo.reset()
    configure_precision(precision, inp.device)
    leaf = inp.clone().requires_grad_()

    def step():
        module.zero_grad(set_to_none=True)
        leaf.grad = None
        with forward_context(precision, inp.device):
            out = module(leaf)
        out = out[0] if isinstance(out, tuple) else out
        out.float().backward(grad)
        return out

    out = step()  # compiles
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ms = cuda_median_ms(step, reps)
    peak = torch.cuda.max_memory_allocated() / 2**30
    tensors = {"out": out.detach().float(), "input grad": leaf.grad.float()}
    tensors.update({f"grad {n}": p.grad.float() for n, p in module.named_parameters()})
    configure_precision("fp32", inp.device)
    return ms, peak, tensors


def max_rel(got: dict, ref: dict) -> float:
    return max(((got[k] - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for k, r in ref.items())


# piece -> (its flags, its measurement)
PIECES = {
    "conv": (conv_flags, time_conv),
    "ssd": (ssd_flags, time_ssd),
    "fusion": (fusion_flags, time_fusion),
}


if __name__ == "__main__":
    main()

"""Two rewrites of the compiled trunk for Inductor to fuse, before and after, at production size on one GPU:
one Mamba2 block compiled with ATen's depthwise conv1d (before) or the shifted multiply-adds that the model
compiles (after, `causal_conv_shifted`), and the VSN in its four compiled regions with the variable GRNs'
linears as eager's batched GEMMs (before) or in another form: one dense block-diagonal GEMM (what the model
compiles, `grouped_linear_block_diag`; "after", recorded as "block_diag" before the model took it) or
pointwise multiply-adds (`grouped_linear_pointwise` below, measured slower).
Forward + backward GPU time (medians), peak memory, and the largest relative error of outputs and
gradients against eager fp32.

    PYTHONPATH=. python3 benchmarks/trunk_fusion.py [--precisions tf32,bf16] [--out
    benchmarks/results/trunk_fusion.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cuda_timing import cuda_median_ms  # noqa: E402
from perception.atomic import atomic_write_text  # noqa: E402
from perception.model.mamba2 import Mamba2Block, causal_conv  # noqa: E402
from perception.model.vsn import VSN, grouped_linear, grouped_linear_block_diag  # noqa: E402
from perception.train.precision import configure as configure_precision, forward_context  # noqa: E402


def grouped_linear_pointwise(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GroupedGRN's per-variable linear as i broadcast multiply-adds: a (..., F, i), w (F, o, i), b (F, o)."""
    out = b + a[..., 0:1] * w[..., 0]  # (..., F, o)
    for i in range(1, a.shape[-1]):
        out = out + a[..., i : i + 1] * w[..., i]
    return out


# GroupedGRN reads its linear at trace time: each form is set after compile_regions, before the first call
VSN_FORMS = {"before": grouped_linear, "after": grouped_linear_block_diag, "pointwise": grouped_linear_pointwise}


def vsn_module(features: int, d_model: int, form: str) -> torch.nn.Module:
    vsn = VSN(features, 8, d_model)
    vsn.reset_parameters(torch.Generator().manual_seed(0))
    if form != "eager":
        vsn.compile_regions()
        vsn.var_grn._linear = VSN_FORMS[form]
    return vsn.cuda()


def mamba_module(d_model: int, chunk: int, form: str) -> torch.nn.Module:
    block = Mamba2Block(d_model, d_state=64, headdim=32, expand=2, d_conv=4, chunk=chunk)
    block.reset_parameters(torch.Generator().manual_seed(0))
    if form == "before":
        block.compile(dynamic=False)
        block.mixer._conv = causal_conv
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--features", type=int, default=65)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--precisions", default="tf32,bf16")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--modules", default="vsn,mamba2", help="of vsn, mamba2")
    parser.add_argument(
        "--vsn-forms", default="after,pointwise", help="VSN forms beside 'before': after (the model's), pointwise"
    )
    parser.add_argument("--out", default="benchmarks/results/trunk_fusion.json")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()

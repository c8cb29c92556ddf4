"""Mamba2's causal depthwise convolution at production size, forward + backward on one GPU: the
block's nn.Conv1d over (B, C, K) (ATen's depthwise kernels, outside what Inductor fuses) against the
same convolution written as d_conv shifted multiply-adds over (B, K, C), compiled, which Inductor can
fuse with the SiLU and the split around it. Both compute y[b, t, c] = bias[c] + sum_j w[c, j] x[b, t-d+1+j, c].

    PYTHONPATH=. python3 benchmarks/mamba_conv.py [--precision bf16] [--out benchmarks/results/mamba_conv.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cuda_timing import cuda_median_ms  # noqa: E402
from perception.atomic import atomic_write_text  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--channels", type=int, default=384, help="conv_dim = d_inner + 2 d_state")
    parser.add_argument("--d-conv", type=int, default=4)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/mamba_conv.json")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()

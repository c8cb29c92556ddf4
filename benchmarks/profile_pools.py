"""One forward+backward of each pool op at production size, for a kernel profiler to attach to.

    ncu --kernel-name regex:"attention_pool|inverted_pool" --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --csv python benchmarks/profile_pools.py > pools_ncu.csv

A warm-up pass first (allocator, library load), then the measured pass: attention pool at Q = 1 and 5, then
the inverted pool, each its forward then its backward kernels, called through torch.ops directly."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.ops import extension  # noqa: E402


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
    args = parser.parse_args(argv)
    extension.require()
    gen = torch.Generator(device="cuda").manual_seed(0)
    lnb = torch.randn(args.batch, args.window, args.d, device="cuda", generator=gen)
    queries = {nq: torch.randn(nq, args.d, device="cuda", generator=gen) / args.d**0.5 for nq in (1, 5)}
    cot = {nq: torch.randn(args.batch, nq, args.d, device="cuda", generator=gen) for nq in queries}
    g_inv = torch.randn(args.batch, args.d, device="cuda", generator=gen)
    for _ in range(2):  # warm-up, then the pass a profiler skips to
        one_pass(lnb, queries, cot, g_inv)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

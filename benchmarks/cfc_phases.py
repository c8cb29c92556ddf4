"""What bounds a step of the CfC scan's cluster kernels? Times a model of each kernel's step
(benchmarks/cfc_phases.cu) with every phase, then with one phase (or group) left out: what a phase costs
is the difference. The product kernel is timed beside each model, to show the model's full form takes its time.

    PYTHONPATH=. python3 benchmarks/cfc_phases.py [--which fwd,bwd] [--batch 64 --window 6000] [--out FILE]

Needs an sm_90 GPU, nvcc and the built extension (python -m perception.ops.build); the model is JIT-built
here with torch.utils.cpp_extension (about a minute). Prints a table; writes JSON and markdown
(benchmarks/results/cfc_phases.json|md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cuda_timing import cuda_median_ms, machine_info, write_table  # noqa: E402
from benchmarks.ops_cfc import make_inputs  # noqa: E402

D = 128  # the only width the model is built for
# cfc_phases.cu's kVariants, in order: what each leaves out of the full step
VARIANTS = (
    "nothing (the full step)",
    "the cluster barrier (a block barrier instead)",
    "the cluster barrier and the store into the peer",
    "W_rec·h (partial sums)",
    "W_out·z (one row of 128 per thread)",
    "the activations (z's tanh, the cell's two tanh and sigmoid)",
    "h_t's store to global memory",
    "the block barriers after the partials and after the gates",
    "all arithmetic and memory but the barriers and the exchange",
)
# cfc_phases.cu's kBwdVariants, in order
BWD_VARIANTS = (
    "nothing (the full step)",
    "the two cluster barriers (block barriers instead)",
    "the cluster barriers and the stores into the peer",
    "W_outᵀ·dg (128 products a thread)",
    "W_recᵀ·d_pre (32 products a thread)",
    "the gate gradients' activations (two tanh, one sigmoid)",
    "d_gates' and d_pre's stores to global memory",
    "the two block barriers",
    "all arithmetic and memory but the barriers and the exchange",
)


def build():
    from torch.utils.cpp_extension import load

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    return load(
        name="cfc_phases",
        sources=[str(ROOT / "benchmarks" / "cfc_phases.cu")],
        extra_include_paths=[str(ROOT / "perception" / "ops" / "csrc")],
        extra_cuda_cflags=["-O3", "-std=c++17"],
        verbose=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--which", default="fwd,bwd", help="the kernels whose step to model: fwd, bwd or both")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cfc_phases.json")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("cfc_phases.py needs an sm_90 GPU (thread-block clusters)")
    from perception.ops import extension

    extension.require()
    os.environ["PERCEPTION_CFC_PATH"] = "cluster"
    model = build()
    inputs = [t.detach() for t in make_inputs(args.batch, args.window, D)]
    x_proj, ts, h0, w_rec, w_out, b_out = inputs
    shape = f"B={args.batch} K={args.window} D={D}"
    rows = []

    def table(op: str, product: str, product_ms: float, variants: tuple[str, ...], run_variant) -> None:
        rows.append(dict(op=op, impl=f"product kernel ({product})", shape=shape, fwd_ms=product_ms, note=""))
        full_ms = None
        for i, left_out in enumerate(variants):
            ms = cuda_median_ms(lambda i=i: run_variant(i), args.reps)
            full_ms = ms if i == 0 else full_ms
            note = f"{ms / args.window * 1e6:.0f} ns a step" + (
                "" if i == 0 else f"; leaving it out saves {full_ms - ms:+.3f} ms"
            )
            rows.append(dict(op=f"{op} model", impl=f"without {left_out}", shape=shape, fwd_ms=ms, note=note))
            print(f"  {op}: without {left_out:62} {ms:8.3f} ms  {note}", flush=True)
        print(f"{op}: product kernel {product_ms:.3f} ms, the model's full step {full_ms:.3f} ms")

    which = set(args.which.split(","))
    if "fwd" in which:

        def fwd():
            with torch.no_grad():
                torch.ops.perception.cfc_scan(*inputs)

        table(
            "step",
            "cluster forward",
            cuda_median_ms(fwd, args.reps),
            VARIANTS,
            lambda i: model.phases(x_proj, w_rec, w_out, i),
        )
    if "bwd" in which:
        from perception.ops.cfc import recompute

        with torch.no_grad():  # the backward kernel's inputs, as its autograd forms them
            h_seq = torch.ops.perception.cfc_scan(*inputs)
            _, z, gates = recompute(x_proj, h0, h_seq, w_rec, w_out, b_out)
            z, gates = z.contiguous(), gates.contiguous()
            cot = torch.randn(h_seq.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1))

        def bwd():
            torch.ops.perception.cfc_scan_bwd(cot, gates, z, ts, w_rec, w_out)

        table(
            "backward step",
            "cluster backward",
            cuda_median_ms(bwd, args.reps),
            BWD_VARIANTS,
            lambda i: model.bwd(cot, gates, z, ts, w_rec, w_out, i),
        )
    targets = {"step models": "the full model within 10 % of its product kernel; the rest are the phases' costs"}
    print(write_table(args.out, rows, machine_info(), targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())

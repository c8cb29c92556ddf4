"""Does one cluster exchange per CfC step beat two? The candidate forward (benchmarks/cfc_one_exchange.cu:
each block computes all of z, only h crosses the cluster) against the kept sm_90 cluster kernel
(`PERCEPTION_CFC_PATH=cluster`): h_seq must equal the kept kernel's bit for bit (same arithmetic, same
order) at several shapes, and match the fp64 reference; then the median forward time of both at
production size (B=64, K=6000, D=128).

    PYTHONPATH=. python3 benchmarks/cfc_one_exchange.py [--batch 64 --window 6000] [--out FILE]

Needs an sm_90 GPU, nvcc and the built extension (python -m perception.ops.build); the candidate is
JIT-built here with torch.utils.cpp_extension (about a minute). Writes JSON and a markdown table
(benchmarks/results/cfc_one_exchange.json|md). Exits 1 when the candidate's output differs from the kept
kernel's by more than 1e-6 (relative)."""

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
from perception.ops.reference import cfc_scan_ref  # noqa: E402

D = 128  # the only width the candidate is built for
SHAPES = [(1, 1), (3, 2), (3, 17), (3, 256), (64, 256)]  # (B, K) checked for equality besides production's


def build_candidate():
    from torch.utils.cpp_extension import load

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    return load(name="cfc_one_exchange", sources=[str(ROOT / "benchmarks" / "cfc_one_exchange.cu")],
                extra_include_paths=[str(ROOT / "perception" / "ops" / "csrc")],
                extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo"], verbose=False)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cfc_one_exchange.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("cfc_one_exchange.py needs an sm_90 GPU (thread-block clusters)")
    from perception.ops import extension

    extension.require()
    os.environ["PERCEPTION_CFC_PATH"] = "cluster"
    kept = torch.ops.perception.cfc_scan
    candidate = build_candidate().cfc_scan_one_exchange

    rows, same_everywhere = [], True
    for b, k in SHAPES + [(args.batch, args.window)]:
        inputs = [t.detach() for t in make_inputs(b, k, D)]
        with torch.no_grad():
            want, got = kept(*inputs), candidate(*inputs)
        torch.cuda.synchronize()
        bitwise = torch.equal(want, got)
        close = rel(got, want) < 1e-6
        same_everywhere &= close
        row = dict(op="cfc_scan fwd", impl="one exchange vs kept cluster", shape=f"B={b} K={k} D={D}",
                   bitwise_equal=bitwise, rel_to_kept=rel(got, want))
        if k <= 256:
            ref = cfc_scan_ref(*[t.double() for t in inputs])
            row["rel_to_fp64_ref"], row["kept_rel_to_fp64_ref"] = rel(got, ref), rel(want, ref)
        if (b, k) == (args.batch, args.window):
            row["kept_fwd_ms"] = cuda_median_ms(lambda: kept(*inputs), args.reps)
            row["fwd_ms"] = cuda_median_ms(lambda: candidate(*inputs), args.reps)
        row["note"] = ("bit for bit equal" if bitwise else f"differs: rel {row['rel_to_kept']:.2e}") + (
            f"; kept kernel {row['kept_fwd_ms']:.3f} ms" if "kept_fwd_ms" in row else "")
        rows.append(row)
        print(f"  {row['shape']:24} {row['note']}", flush=True)

    prod = rows[-1]
    print(f"\nforward at {prod['shape']}: kept {prod['kept_fwd_ms']:.3f} ms, one exchange {prod['fwd_ms']:.3f} ms "
          f"({prod['kept_fwd_ms'] - prod['fwd_ms']:+.3f} ms per forward; a training step runs one forward, an "
          "eval batch one)")
    targets = {"cfc_scan fwd": "faster than the kept cluster kernel, h_seq bit for bit equal"}
    print(write_table(Path(args.out), rows, machine_info(), targets))
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())

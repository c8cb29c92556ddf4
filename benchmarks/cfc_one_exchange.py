"""Does one cluster exchange per CfC step beat two? The candidate kernels (benchmarks/cfc_one_exchange.cu:
forward, each block computes all of z and only h crosses the cluster; backward, only d_pre crosses) against
the kept sm_90 cluster kernels (`PERCEPTION_CFC_PATH=cluster`): their outputs must equal the kept kernels'
bit for bit (same arithmetic, same order) at several shapes, and h_seq match the fp64 reference; then the
median time of each kernel pair at production size (B=64, K=6000, D=128).

    PYTHONPATH=. python3 benchmarks/cfc_one_exchange.py [--batch 64 --window 6000] [--out FILE]

Needs an sm_90 GPU, nvcc and the built extension (python -m perception.ops.build); the candidate is
JIT-built here with torch.utils.cpp_extension (about a minute). Writes JSON and a markdown table
(benchmarks/results/cfc_one_exchange.json|md). Exits 1 when a candidate's output differs from the kept
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
    from perception.ops.cfc_autograd import recompute

    kept, kept_bwd = torch.ops.perception.cfc_scan, torch.ops.perception.cfc_scan_bwd
    module = build_candidate()
    candidate, candidate_bwd = module.cfc_scan_one_exchange, module.cfc_scan_bwd_one_exchange

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
        print(f"  fwd {row['shape']:24} {row['note']}", flush=True)

        with torch.no_grad():  # the backward kernels on the forward's recomputed activations
            x_proj, ts, h0, w_rec, w_out, b_out = inputs
            _, z, gates = recompute(x_proj, h0, want, w_rec, w_out, b_out)
            cot = torch.randn(b, k, D, device="cuda", generator=torch.Generator("cuda").manual_seed(b + k))
            args_bwd = (cot, gates.contiguous(), z.contiguous(), ts, w_rec, w_out)
            want_b, got_b = kept_bwd(*args_bwd), candidate_bwd(*args_bwd)
        torch.cuda.synchronize()
        names = ("d_pre", "d_gates", "d_h0")
        bitwise_b = all(torch.equal(w, g) for w, g in zip(want_b, got_b))
        rels = {n: rel(g, w) for n, w, g in zip(names, want_b, got_b)}
        same_everywhere &= all(r < 1e-6 for r in rels.values())
        row = dict(op="cfc_scan_bwd", impl="one exchange vs kept cluster", shape=f"B={b} K={k} D={D}",
                   bitwise_equal=bitwise_b, rel_to_kept=rels)
        if (b, k) == (args.batch, args.window):
            row["kept_fwdbwd_ms"] = cuda_median_ms(lambda: kept_bwd(*args_bwd), args.reps)
            row["fwdbwd_ms"] = cuda_median_ms(lambda: candidate_bwd(*args_bwd), args.reps)
        row["note"] = ("bit for bit equal" if bitwise_b else "differs: " + ", ".join(f"{n} rel {r:.2e}" for n, r in rels.items())) + (
            f"; kept kernel {row['kept_fwdbwd_ms']:.3f} ms (backward kernel alone)" if "kept_fwdbwd_ms" in row else "")
        rows.append(row)
        print(f"  bwd {row['shape']:24} {row['note']}", flush=True)

    fwd, bwd = rows[-2], rows[-1]
    print(f"\nat {fwd['shape']}: forward kernel kept {fwd['kept_fwd_ms']:.3f} ms, one exchange {fwd['fwd_ms']:.3f} ms; "
          f"backward kernel kept {bwd['kept_fwdbwd_ms']:.3f} ms, one exchange {bwd['fwdbwd_ms']:.3f} ms "
          f"(a training step runs one of each, an eval batch one forward)")
    targets = {"cfc_scan fwd / cfc_scan_bwd": "faster than the kept cluster kernels, outputs bit for bit equal"}
    print(write_table(Path(args.out), rows, machine_info(), targets))
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())

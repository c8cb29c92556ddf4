"""The grn family's Triton kernels compiled without a GPU, for the L40S (sm_89) and the H100/H200 (sm_90): per
kernel and launch shape, the registers and spills ptxas reports, the shared memory, and the barriers,
warp shuffles and shared-memory loads in the PTX (static counts: what each block of rows costs beyond its
arithmetic). It tells a launch shape that spills from one that does not before any GPU time is spent;
speed is benchmarks/ops_grn.py's, on a GPU. Needs triton (the version the GPU machine's torch ships, for
numbers that hold there):

    python benchmarks/grn_compile.py [--rows 32,64,128] [--d 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perception.ops import grn_kernels  # noqa: E402
from perception.ops.grn import LAUNCH  # noqa: E402

POINTERS = {
    "fwd": "x_ptr v_ptr ew_ptr eb_ptr w1t_ptr b1_ptr w2t_ptr b2_ptr lnw_ptr lnb_ptr out_ptr",
    "bwd": "grad_ptr x_ptr v_ptr ew_ptr eb_ptr w1_ptr b1_ptr w2_ptr b2_ptr lnw_ptr lnb_ptr dx_ptr dv_ptr partial_ptr",
}
KERNELS = {"fwd": grn_kernels.grn_select_fwd_kernel, "bwd": grn_kernels.grn_select_bwd_kernel}


def ptxas() -> str:
    """The newest ptxas Triton ships (its PTX version may be newer than the plain ptxas understands)."""
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return str(next(p for p in (bin_dir / "ptxas-blackwell", bin_dir / "ptxas") if p.exists()))


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers a thread, spill bytes) as ptxas reports them for the PTX's own target (sm_90a on Hopper)."""
    target = re.search(r"^\.target (\S+)", ptx, re.M).group(1)  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run(
            [ptxas(), f"-arch={target}", "-v", str(path), "-o", os.devnull], capture_output=True, text=True, check=True
        ).stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))  # type: ignore[union-attr]
    return registers, sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", report))


def compile_one(kernel: str, arch: int, d: int, rows: int) -> dict:
    signature = {name: "*fp32" for name in POINTERS[kernel].split()}
    signature.update(N="i32", F="i32", rows_per_program="i32", D="constexpr", BLOCK_N="constexpr")
    # the pointers 16-byte aligned, as the JIT specialises them for torch's allocations: without it no vector loads
    aligned = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values()) if kind.startswith("*")}
    source = ASTSource(fn=KERNELS[kernel], signature=signature, constexprs={"D": d, "BLOCK_N": rows}, attrs=aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": rows // 32})
    ptx = compiled.asm["ptx"]
    registers, spills = ptxas_usage(ptx)
    return dict(
        kernel=kernel,
        arch=f"sm_{arch}",
        d=d,
        rows=rows,
        warps=rows // 32,
        registers=registers,
        spill_bytes=spills,
        shared_bytes=compiled.metadata.shared,
        barriers=ptx.count("bar.sync"),
        shuffles=ptx.count("shfl.sync"),
        shared_loads=ptx.count("ld.shared"),
        global_loads=len(re.findall(r"ld\.global", ptx)),
        vector_global_loads=len(re.findall(r"ld\.global\.v\d", ptx)),
        global_stores=len(re.findall(r"st\.global", ptx)),
        vector_global_stores=len(re.findall(r"st\.global\.v\d", ptx)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="32,64,128", help="rows per block (one per lane: warps = rows / 32)")
    parser.add_argument("--d", default="8", help="d_var values")
    parser.add_argument("--archs", default="89,90")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grn_compile.json"))
    args = parser.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    rows = [
        compile_one(kernel, arch, d, n)
        for arch in ints(args.archs)
        for d in ints(args.d)
        for kernel in KERNELS
        for n in ints(args.rows)
    ]
    print(f"grn kernels compiled with Triton {triton.__version__} (no GPU); static PTX counts per kernel")
    print(
        "| kernel | arch | d | rows | warps | registers | spill bytes | shared bytes | barriers | shuffles | "
        "global loads (vector) | global stores (vector) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['kernel']} | {r['arch']} | {r['d']} | {r['rows']} | {r['warps']} | {r['registers']} | "
            f"{r['spill_bytes']} | {r['shared_bytes']} | {r['barriers']} | {r['shuffles']} | "
            f"{r['global_loads']} ({r['vector_global_loads']}) | {r['global_stores']} ({r['vector_global_stores']}) |"
        )
    result = dict(
        rows=rows,
        launch=LAUNCH,
        versions=dict(triton=triton.__version__, python=platform.python_version()),
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""mamba_ssm's SSD kernels (model.mamba.ssd=mamba) as production launches them, compiled without a GPU for the
L40S (sm_89) and the H100/H200 (sm_90): per kernel its pinned configuration (`ssd_mamba.py`'s PINNED_CONFIGS),
the shared memory a block needs against sm_89's 99 KiB, and the registers and spills ptxas reports. It tells a
configuration that would not launch on the study's GPUs before any GPU time is spent.

The library's forward and backward run on CPU tensors of production size with every Triton launch recorded
instead of made (the arguments, specialised as Triton's JIT specialises them); each recorded kernel is then
compiled for both targets. Needs triton (the version the GPU machine's torch ships) and the mamba-ssm wheel:

    PYTHONPATH=. python benchmarks/mamba_compile.py [--out benchmarks/results/mamba_compile.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import types
from pathlib import Path

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.grn_compile import ptxas_usage  # noqa: E402
from benchmarks.mamba_configs import add_shape_arguments  # noqa: E402
from perception.atomic import atomic_write_text  # noqa: E402
from perception.model import ssd_mamba  # noqa: E402

SM89_SHARED_LIMIT = 99 * 1024  # bytes a block may use on sm_89
SM_COUNT = 142  # the L40S's; the library reads it to split the dcb kernel's heads (8 per program here either way)


def record_launches(args: argparse.Namespace) -> dict[str, dict]:
    """Kernel name -> the JIT function, its bound arguments and the configuration of its first launch."""
    launches: dict[str, dict] = {}

    def record(self: Autotuner, *call_args, **kwargs):
        (config,) = self.configs  # pinned: one configuration each
        self.best_config = config  # as a launch sets it: the library reads it afterwards
        name = self.fn.__name__
        if name not in launches:
            bound = dict(zip(self.fn.arg_names, call_args)) | kwargs | config.all_kwargs()
            launches[name] = dict(fn=self.fn, bound=bound, warps=config.num_warps, stages=config.num_stages)

    # what the library asks of the CUDA device, which CPU tensors have not
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(multi_processor_count=SM_COUNT)  # type: ignore
    torch.cuda.device = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment,misc]
    ssd_mamba.PIN_CONFIGS = True
    ssd = ssd_mamba._ssd_combined()
    Autotuner.run = record  # type: ignore[method-assign]
    b, k, h, p, n = args.batch, args.window, args.heads, args.headdim, args.d_state
    x = torch.zeros(b, k, h, p, dtype=torch.bfloat16)
    dt = torch.full((b, k, h), 0.05)
    A = -torch.ones(h)
    B, C = (torch.zeros(b, k, 1, n, dtype=torch.bfloat16) for _ in range(2))
    D = torch.ones(h)
    y = ssd._mamba_chunk_scan_combined_fwd(x, dt, A, B, C, args.chunk, D=D)[0]
    ssd._mamba_chunk_scan_combined_bwd(torch.zeros_like(y), x, dt, A, B, C, y, args.chunk, D=D)
    return launches


def source(launch: dict) -> ASTSource:
    """The launch's kernel source as Triton's JIT would specialise it: ints of 1 and None become constants,
    pointers and ints divisible by 16 say so."""
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(launch["fn"].params):
        value = launch["bound"].get(param.name, param.default)
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
            continue
        kind, key = native_specialize_impl(
            CUDABackend, value, False, not param.do_not_specialize, not param.do_not_specialize_on_alignment
        )
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = value
        elif key:
            attrs[(i,)] = CUDABackend.parse_attr(key)
    return ASTSource(fn=launch["fn"], signature=signature, constexprs=constexprs, attrs=attrs)


def compile_for(launch: dict, arch: int) -> dict:
    options = dict(num_warps=launch["warps"], num_stages=launch["stages"])
    compiled = triton.compile(source(launch), target=GPUTarget("cuda", arch, 32), options=options)
    registers, spills = ptxas_usage(compiled.asm["ptx"])
    return dict(shared_bytes=compiled.metadata.shared, registers=registers, spill_bytes=spills)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(parser)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mamba_compile.json"))
    args = parser.parse_args()
    rows = []
    for name, launch in sorted(record_launches(args).items()):
        config = {k: v for k, v in launch["bound"].items() if k.startswith("BLOCK_SIZE")}
        row = dict(kernel=name, config=config, warps=launch["warps"], stages=launch["stages"])
        for arch in (89, 90):
            row.update({f"sm{arch}_{key}": value for key, value in compile_for(launch, arch).items()})
        rows.append(row)
    print(f"mamba_ssm's SSD kernels, pinned configurations, compiled with Triton {triton.__version__} (no GPU)")
    header = f"{'warps':>5} {'stages':>6} {'sm_89 shared':>12} {'regs':>5} {'spills':>6} {'sm_90 shared':>12}"
    print(f"  {'kernel':40} {header}")
    for r in rows:
        print(
            f"  {r['kernel']:40} {r['warps']:5} {r['stages']:6} {r['sm89_shared_bytes'] / 1024:8.1f} KiB "
            f"{r['sm89_registers']:5} {r['sm89_spill_bytes']:6} {r['sm90_shared_bytes'] / 1024:8.1f} KiB"
        )
    over = [r["kernel"] for r in rows if r["sm89_shared_bytes"] > SM89_SHARED_LIMIT]
    print(f"over sm_89's 99 KiB of shared memory a block: {over or 'none'}")
    out = dict(
        benchmark="mamba_compile",
        machine=dict(host=platform.node(), triton=triton.__version__, torch=torch.__version__),
        config=vars(args),
        sm89_shared_limit_bytes=SM89_SHARED_LIMIT,
        over_limit=over,
        rows=rows,
    )
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    if over:
        raise SystemExit(f"{over} need more shared memory than an sm_89 block has")


if __name__ == "__main__":
    main()

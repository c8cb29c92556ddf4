"""mamba_ssm's SSD kernels (model.mamba.ssd=mamba) at production size with the configurations they run in
and the ones Triton's autotuner picks: one block's chunk scan, forward and forward + backward, and the CUDA time
of every kernel, each mode in a fresh process.

"cheapest" is the library's deterministic mode: every autotuned kernel at its one cheapest configuration
(smallest tiles), so the bits do not depend on a per-process autotuning race. "autotuned" imports the kernels
with every configuration and switches the deterministic reductions on afterwards: the same arithmetic with the
configurations the autotuner chose, which it lists per kernel. "pinned" is production's (`ssd_mamba.py`'s
PINNED_CONFIGS, the autotuner's choices on an H100, fixed); whether they fit the L40S is mamba_compile.py's.

    PYTHONPATH=. python3 benchmarks/mamba_configs.py [--out benchmarks/results/mamba_configs.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cuda_timing import cuda_median_ms, machine_info  # noqa: E402
from perception.atomic import atomic_write_text  # noqa: E402
from perception.model.ssd_mamba import KERNEL_MODULES, mamba_package  # noqa: E402

MODES = ("cheapest", "autotuned", "pinned")


def load(mode: str):
    """ssd_combined with the cheapest configurations, all of them (`autotuned`) or production's (`pinned`),
    deterministic reductions on in each."""
    if mode == "pinned":
        from perception.model import ssd_mamba

        ssd_mamba.PIN_CONFIGS = True
        ssd = ssd_mamba._ssd_combined()
        return ssd, [importlib.import_module(f"mamba_ssm.ops.triton.{name}") for name in KERNEL_MODULES]
    mamba_package()
    from mamba_ssm.utils import determinism

    determinism.set_deterministic_mode(mode == "cheapest")
    modules = [importlib.import_module(f"mamba_ssm.ops.triton.{name}") for name in KERNEL_MODULES]
    determinism.set_deterministic_mode(True)
    return modules[KERNEL_MODULES.index("ssd_combined")], modules


def chosen_configs(modules) -> list[dict]:
    """Every autotuned kernel that ran: how many configurations it had and the one it ran."""
    from triton.runtime.autotuner import Autotuner

    rows = []
    for module in modules:
        for name, kernel in sorted(vars(module).items()):
            if not isinstance(kernel, Autotuner) or not any(cache for cache, *_ in kernel.fn.device_caches.values()):
                continue  # not compiled: it did not run
            config = next(iter(kernel.cache.values())) if len(kernel.configs) > 1 else kernel.configs[0]
            rows.append(
                dict(
                    kernel=name,
                    configs=len(kernel.configs),
                    kwargs=dict(config.kwargs),
                    num_warps=config.num_warps,
                    num_stages=config.num_stages,
                )
            )
    return rows


def run_mode(args: argparse.Namespace) -> dict:
    ssd, modules = load(args.mode)
    b, k, h, p, n = args.batch, args.window, args.heads, args.headdim, args.d_state
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(b, k, h, p, device="cuda", generator=g).to(torch.bfloat16)
    dt = torch.nn.functional.softplus(torch.randn(b, k, h, device="cuda", generator=g) - 3)
    A = -torch.rand(h, device="cuda", generator=g) * 15 - 1
    B, C = (torch.randn(b, k, 1, n, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    D = torch.ones(h, device="cuda")
    dout = torch.randn(b, k, h, p, device="cuda", generator=g).to(torch.bfloat16)

    def fwd():
        return ssd._mamba_chunk_scan_combined_fwd(x, dt, A, B, C, args.chunk, D=D)[0]

    def fwd_bwd():
        out = fwd()
        ssd._mamba_chunk_scan_combined_bwd(dout, x, dt, A, B, C, out, args.chunk, D=D)

    fwd_bwd()  # autotuning, where there is any
    fwd_ms, both_ms = cuda_median_ms(fwd, args.reps), cuda_median_ms(fwd_bwd, args.reps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fwd_bwd()
        torch.cuda.synchronize()
    kernels = sorted(
        ({"name": e.key[:60], "ms": e.device_time_total / 1e3} for e in prof.key_averages() if e.device_time_total),
        key=lambda r: -r["ms"],
    )
    return dict(mode=args.mode, fwd_ms=fwd_ms, fwd_bwd_ms=both_ms, kernels=kernels, configs=chosen_configs(modules))


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """One Mamba2 block's chunk scan at production size (mamba_compile.py's too)."""
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--heads", type=int, default=8, help="d_inner / headdim at production size")
    parser.add_argument("--headdim", type=int, default=32)
    parser.add_argument("--d-state", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(parser)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--mode", choices=MODES, help="one mode in this process (the parent runs each)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mamba_configs.json"))
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    results = []
    for mode in MODES:  # each in a fresh process: the configurations are fixed when the kernels are imported
        child = [sys.executable, __file__, *sys.argv[1:], "--mode", mode]
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"mamba_configs.py --mode {mode} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    shape = f"B={args.batch} K={args.window} h={args.heads} p={args.headdim} n={args.d_state} chunk={args.chunk}"
    print(f"mamba_ssm chunk scan, one block, {shape}, bf16 x/B/C, on {torch.cuda.get_device_name()}")
    for r in results:
        print(f"  {r['mode']:10} fwd {r['fwd_ms']:7.3f} ms  fwd+bwd {r['fwd_bwd_ms']:7.3f} ms")
    by_kernel = {mode: {k["name"]: k["ms"] for k in r["kernels"]} for mode, r in zip(MODES, results)}
    print(f"\n  {'kernel':60} " + " ".join(f"{mode:>9}" for mode in MODES))
    for name in by_kernel["cheapest"]:
        print(f"  {name:60} " + " ".join(f"{by_kernel[mode].get(name, float('nan')):9.3f}" for mode in MODES))
    pinned = {c["kernel"]: c for c in results[2]["configs"]}
    print("\n  configurations the autotuner chose (of how many), and whether production's pins the same:")
    for c in results[1]["configs"]:
        same = {k: c[k] for k in ("kwargs", "num_warps", "num_stages")} == {
            k: pinned.get(c["kernel"], {}).get(k) for k in ("kwargs", "num_warps", "num_stages")
        }
        print(
            f"  {c['kernel']:44} ({c['configs']:2}) {c['kwargs']} warps {c['num_warps']} stages {c['num_stages']}"
            f"  {'pinned' if same else 'NOT pinned'}"
        )
    out = dict(benchmark="mamba_configs", machine=machine_info(), config=vars(args), shape=shape, results=results)
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

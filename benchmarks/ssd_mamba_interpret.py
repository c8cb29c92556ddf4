"""model.mamba.ssd=mamba checked without a GPU: mamba_ssm's Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1, numpy on CPU tensors) behind this project's custom ops, against the recurrence and
the chunked form in fp64. It checks the backend's contract (argument layout, the one B/C group, D, the
order of the backward's outputs, the ops' fakes); the GPU's own codegen and speed are the CUDA tests' and
train_step.py's. Needs triton and the mamba-ssm wheel (perception/model/ssd_mamba.py says how):

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/ssd_mamba_interpret.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
import types
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1: the kernels run in Triton's interpreter here")

import torch  # noqa: E402

# the library enters its tensors' CUDA device and reads its SM count; on CPU tensors neither exists
torch.cuda.device = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment,misc]
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(multi_processor_count=132)  # type: ignore

from perception.model import ssd_mamba  # noqa: E402
from perception.model.mamba2 import ssd_scan, ssd_scan_sequential  # noqa: E402


def inputs(k: int, seed: int, b: int = 2, h: int = 4, p: int = 16, n: int = 16) -> list[torch.Tensor]:
    """fp64 x, dt, A, B, C, D of `ssd_scan`'s contract, decays as a trained Mamba2 block has them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, k, h, p, generator=g, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(b, k, h, generator=g, dtype=torch.float64) - 2)
    A = -torch.rand(h, generator=g, dtype=torch.float64) * 8 - 0.5
    B, C = (torch.randn(b, k, n, generator=g, dtype=torch.float64) for _ in range(2))
    D = torch.randn(h, generator=g, dtype=torch.float64)
    return [x, dt, A, B, C, D]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).abs().max() / b.abs().max()).item()


def check(k: int, chunk: int, seed: int) -> dict:
    """The wrapper end to end (ssd_scan_mamba's layout, the autograd of the two ops) in fp32 against fp64."""
    x, dt, A, B, C, D = inputs(k, seed)
    want = ssd_scan_sequential(x, dt, A, B, C, D)
    leaves64 = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D)]
    grad = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    ssd_scan(*leaves64, chunk=chunk).backward(grad)
    leaves32 = [t.float().requires_grad_() for t in (x, dt, A, B, C, D)]
    xf, dtf, Af, Bf, Cf, Df = leaves32
    t0 = time.perf_counter()
    # ssd_scan_mamba's own preparation; it refuses CPU tensors, which only the interpreter can run
    y = ssd_mamba.ssd_mamba_fwd(xf, dtf, Af, Bf.unsqueeze(2), Cf.unsqueeze(2), Df, chunk)
    y.backward(grad.float())
    row = {"k": k, "chunk": chunk, "seed": seed, "y": relative(y.detach(), want)}
    for name, a, b in zip(("x", "dt", "A", "B", "C", "D"), leaves32, leaves64):
        row["d" + name] = relative(a.grad, b.grad)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/ssd_mamba_interpret.json")
    args = parser.parse_args()
    for op in (ssd_mamba.ssd_mamba_fwd, ssd_mamba.ssd_mamba_bwd):  # the same functions, for CPU tensors
        op.register_kernel("cpu")(op._init_fn)
    rows = [check(k, chunk, seed) for seed, (k, chunk) in enumerate([(200, 64), (130, 64), (256, 64), (300, 32)])]
    x, dt, A, B, C, D = (t.float() for t in inputs(130, 9))
    args_fwd = [x, dt, A, B.unsqueeze(2), C.unsqueeze(2), D]
    torch.library.opcheck(
        ssd_mamba.ssd_mamba_fwd,
        [*[t.requires_grad_() for t in args_fwd], 64],
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    worst = max(max(v for key, v in r.items() if key in ("y", "dx", "ddt", "dA", "dB", "dC", "dD")) for r in rows)
    print("| K | chunk | y | dx | ddt | dA | dB | dC | dD | s |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        errs = " | ".join(f"{r[key]:.1e}" for key in ("y", "dx", "ddt", "dA", "dB", "dC", "dD"))
        print(f"| {r['k']} | {r['chunk']} | {errs} | {r['seconds']} |")
    print(f"largest relative error {worst:.2e} (fp32 kernels in the interpreter against fp64); opcheck passed")
    import triton

    result = {
        "rows": rows,
        "largest_relative_error": worst,
        "opcheck": "passed (schema, fake tensors, aot dispatch)",
        "machine": {"host": platform.node(), "cpu": platform.processor(), "cores": os.cpu_count()},
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "mamba": ssd_mamba.MAMBA_REQUIREMENT},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""model.mamba.ssd=mamba checked without a GPU: mamba_ssm's Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1, numpy on CPU tensors) behind this project's custom ops, against the recurrence and
the chunked form in fp64. It checks the backend's contract (argument layout, the one B/C group, D, the
order of the backward's outputs, the ops' fakes); the GPU's own codegen and speed are the CUDA tests' and
train_step.py's. Needs triton and the mamba-ssm wheel (perception/model/ssd_mamba.py says how):

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/ssd_mamba_interpret.py [--pin-configs] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.interpret import OPCHECKS, on_cpu, relative, write_result  # noqa: E402  (first: the interpreter's guard)

import torch  # noqa: E402

# the library also reads its SM count, which CPU tensors have not
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
    parser.add_argument("--pin-configs", action="store_true", help="the kernels at ssd_mamba.PINNED_CONFIGS")
    args = parser.parse_args()
    ssd_mamba.PIN_CONFIGS = args.pin_configs
    on_cpu(ssd_mamba.ssd_mamba_fwd, ssd_mamba.ssd_mamba_bwd)
    rows = [check(k, chunk, seed) for seed, (k, chunk) in enumerate([(200, 64), (130, 64), (256, 64), (300, 32)])]
    x, dt, A, B, C, D = (t.float() for t in inputs(130, 9))
    args_fwd = [x, dt, A, B.unsqueeze(2), C.unsqueeze(2), D]
    torch.library.opcheck(ssd_mamba.ssd_mamba_fwd, [*[t.requires_grad_() for t in args_fwd], 64], test_utils=OPCHECKS)
    keys = ["y", "dx", "ddt", "dA", "dB", "dC", "dD"]
    print("| K | chunk | " + " | ".join(keys) + " | s |\n|" + "---|" * (len(keys) + 3))
    for r in rows:
        print(f"| {r['k']} | {r['chunk']} | " + " | ".join(f"{r[k]:.1e}" for k in keys) + f" | {r['seconds']} |")
    write_result(args.out, rows, keys, mamba=ssd_mamba.MAMBA_REQUIREMENT)


if __name__ == "__main__":
    main()

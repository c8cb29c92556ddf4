"""model.vsn.fused_grn checked without a GPU: the grn family's Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1, numpy on CPU tensors) behind the project's custom ops, fp32 against the fp64 reference,
output and every gradient, at widths 2, 4 and 8 and row counts that end mid-block. It checks the kernels'
arithmetic and the ops' layout; the GPU's codegen and speed are the CUDA tests' and trunk_forms.py's. Needs
triton (a CUDA build of torch ships it; `pip install triton` beside a CPU build):

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/grn_interpret.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.interpret import OPCHECKS, on_cpu, relative, write_result  # noqa: E402  (first: the interpreter's guard)

import torch  # noqa: E402

from perception.ops import grn  # noqa: E402

NAMES = ("x", "v", *grn.WEIGHT_NAMES)


def inputs(n: int, f: int, d: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return [r(n, f), torch.softmax(r(n, f), -1), r(f, d), r(f, d), r(f, d, d) / 3, r(f, d) / 3, r(f, 2 * d, d) / 3,
            r(f, 2 * d) / 3, 1 + r(f, d) / 3, r(f, d) / 3]  # fmt: skip


def check(n: int, f: int, d: int, seed: int) -> dict:
    leaves64 = [t.requires_grad_() for t in inputs(n, f, d, seed)]
    out64 = grn.grn_select_ref(*leaves64)
    grad = torch.randn(out64.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    out64.backward(grad)
    leaves32 = [t.detach().float().requires_grad_() for t in leaves64]
    t0 = time.perf_counter()
    out32 = grn.grn_select_fwd(*leaves32)
    out32.backward(grad.float())
    row = {"n": n, "f": f, "d": d, "seed": seed, "out": relative(out32.detach(), out64.detach())}
    row.update({"d" + name: relative(a.grad, b.grad) for name, a, b in zip(NAMES, leaves32, leaves64)})
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/grn_interpret.json")
    args = parser.parse_args()
    on_cpu(grn.grn_select_fwd, grn.grn_select_bwd)
    shapes = [(300, 5, 8), (4099, 3, 8), (1000, 7, 4), (65, 2, 2), (1201, 65, 8)]
    rows = [check(n, f, d, seed) for seed, (n, f, d) in enumerate(shapes)]
    for out_dtype in (None, torch.bfloat16):
        torch.library.opcheck(
            grn.grn_select_fwd,
            [t.float().requires_grad_() for t in inputs(200, 4, 8, 9)],
            {"out_dtype": out_dtype},
            test_utils=OPCHECKS,
        )
    keys = ["out", *("d" + name for name in NAMES)]
    print("| N | F | d | " + " | ".join(keys) + " | s |\n|" + "---|" * (len(keys) + 4))
    for r in rows:
        print(f"| {r['n']} | {r['f']} | {r['d']} | " + " | ".join(f"{r[k]:.1e}" for k in keys) + f" | {r['seconds']} |")
    write_result(args.out, rows, keys)


if __name__ == "__main__":
    main()

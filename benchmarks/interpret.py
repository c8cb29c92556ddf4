"""What the interpreter checks of the Triton ops share (benchmarks/*_interpret.py): CUDA custom ops made to run
on CPU tensors in Triton's interpreter, fp32 against fp64, opcheck of the forward op, and the result file.
Importing it refuses to go on without TRITON_INTERPRET=1 and stubs torch.cuda's device context (the ops enter
their tensors' device, which CPU tensors have not)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1: the kernels run in Triton's interpreter here")

import torch  # noqa: E402

torch.cuda.device = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment,misc]

OPCHECKS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def on_cpu(*ops) -> None:
    """The custom ops' own functions registered for CPU tensors too (they are registered for CUDA only)."""
    for op in ops:
        op.register_kernel("cpu")(op._init_fn)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the reference's largest magnitude."""
    return ((a.double() - b).abs().max() / b.abs().max()).item()


def write_result(out: str, rows: list[dict], keys: list[str], **versions: str) -> None:
    """Prints the largest error over `keys` and writes the rows, it and the machine to `out` (JSON)."""
    import triton

    worst = max(r[k] for r in rows for k in keys)
    print(f"largest relative error {worst:.2e} (fp32 kernels in the interpreter against fp64); opcheck passed")
    result = {
        "rows": rows,
        "largest_relative_error": worst,
        "opcheck": "passed (schema, fake tensors, aot dispatch)",
        "machine": {"host": platform.node(), "cpu": platform.processor(), "cores": os.cpu_count()},
        "versions": {"torch": torch.__version__, "triton": triton.__version__, **versions},
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")

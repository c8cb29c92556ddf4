"""grn family (`grn_select`: the VSN's variable embeddings and GRNs times their selection weights) at production size
(B·K = 64 · 6000 rows, F = 65, d_var = 8), forward and forward + backward: the Triton kernels at each launch
configuration of a small sweep (rows per block forward and backward, row ranges per variable) beside the forms the model
uses without them, the compiled block-diagonal GRN then the weighting at fp32 and under bf16 autocast, and
eager. Medians of CUDA-event timings; the floor is the kernels' bytes at this GPU's copy rate.

    PYTHONPATH=. python3 benchmarks/ops_grn.py [--fwd-rows 64,128] [--bwd-rows 32,64] [--programs 64,512] [--out FILE]

Prints one table and writes benchmarks/results/ops_grn.json and ops_grn.md (the op tables' format)."""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cuda_timing import cuda_median_ms, machine_info, write_table  # noqa: E402
from perception.model.compiled import inductor_options  # noqa: E402
from perception.model.vsn import VSN, embed  # noqa: E402
from perception.ops import grn  # noqa: E402

TARGETS = {"grn_select": "fwd+bwd below the compiled block-diagonal form's at bf16 (what the model runs today)"}


def make_inputs(rows: int, f: int, d: int) -> tuple[torch.Tensor, torch.Tensor, VSN, torch.Tensor]:
    """x (rows, F) and v (rows, F) in fp32, as the VSN hands them over; a VSN at its init, whose embeddings and
    variable GRNs are the op's weights, with perturbed LayerNorm weights; a gradient for the output."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, f, generator=g)
    v = torch.softmax(torch.randn(rows, f, generator=g), -1)
    module = VSN(f, d, 16)
    module.reset_parameters(g)
    with torch.no_grad():
        module.var_grn.ln_w += torch.randn(f, d, generator=g) / 3
    grad = torch.randn(rows, f, d, generator=g) / rows**0.5
    return x.cuda(), v.cuda(), module.cuda(), grad.cuda()


def weights(module: VSN) -> list[torch.Tensor]:
    g = module.var_grn
    return [module.embed_w, module.embed_b, g.fc1_w, g.fc1_b, g.fc2_w, g.fc2_b, g.ln_w, g.ln_b]


def step_of(form, x: torch.Tensor, v: torch.Tensor, module: torch.nn.Module, grad: torch.Tensor, backward: bool):
    """One call of `form(x, v) -> out`, and with `backward` its gradients into x, v and `module`'s weights."""
    leaves = [x.clone().requires_grad_(backward), v.clone().requires_grad_(backward)]

    def step():
        module.zero_grad(set_to_none=True)
        out = form(*leaves)
        if backward:
            out.backward(grad)
        return out

    return step


def copy_tb_s() -> float:
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_median_ms(lambda: dst.copy_(src), 10)
    return 2 * src.numel() * 4 / ms / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64 * 6000)
    parser.add_argument("--features", type=int, default=65)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--fwd-rows", default="64,128", help="rows per forward block, one per lane")
    parser.add_argument("--bwd-rows", default="32,64", help="rows per backward block, one per lane")
    parser.add_argument("--programs", default="64,512", help="row ranges per variable")
    parser.add_argument("--precisions", default="bf16,tf32", help="of the compiled block-diagonal rows")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ops_grn.json"))
    args = parser.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731

    x, v, module, grad = make_inputs(args.rows, args.features, args.d)
    shape = f"N={args.rows} F={args.features} d={args.d}"
    tb_s = copy_tb_s()
    elem, scalars = grad.numel() * 4, v.numel() * 4  # fp32 bytes of the output and its gradient; of x, v, dx, dv
    floor_fwd_ms = (elem + 2 * scalars) / tb_s / 1e9  # read x and v, write out
    floor_ms = floor_fwd_ms + (elem + 4 * scalars) / tb_s / 1e9  # bwd: read grad, x, v; write dx, dv
    rows = []

    def measure(impl: str, form, note: str = "", weights_of: torch.nn.Module = module) -> dict:
        fwd = cuda_median_ms(step_of(form, x, v, weights_of, grad, False), args.reps)
        both = cuda_median_ms(step_of(form, x, v, weights_of, grad, True), args.reps)
        row = dict(op="grn_select", impl=impl, shape=shape, fwd_ms=fwd, fwdbwd_ms=both, floor_fwdbwd_ms=floor_ms)
        row["note"] = f"{both / floor_ms:.1f}x floor" + (f"; {note}" if note else "")
        rows.append(row)
        print(f"  {impl:44} fwd {fwd:8.3f} ms  fwd+bwd {both:8.3f} ms  ({row['note']})", flush=True)
        return row

    print(f"grn_select, {shape}, on {torch.cuda.get_device_name()}; floor fwd+bwd {floor_ms:.3f} ms", flush=True)
    want = grn.grn_select_ref(x.double(), v.double(), *(w.double() for w in weights(module)))
    default = dict(grn.LAUNCH)
    for fwd_rows, bwd_rows, programs in itertools.product(
        ints(args.fwd_rows), ints(args.bwd_rows), ints(args.programs)
    ):
        grn.LAUNCH.update(fwd_rows=fwd_rows, bwd_rows=bwd_rows, programs_per_variable=programs)
        got = grn.grn_select(x, v, *weights(module), backend="cuda")
        err = ((got.double() - want).abs().max() / want.abs().max()).item()
        measure(
            f"triton, rows {fwd_rows} fwd / {bwd_rows} bwd, {programs} ranges",
            lambda a, b: grn.grn_select(a, b, *weights(module), backend="cuda"),
            f"output's max rel err {err:.1e}",
        )
    grn.LAUNCH.update(default)

    compiled = VSN(args.features, args.d, 16).cuda()
    compiled.load_state_dict(module.state_dict())
    compiled.var_grn.compile_fused()  # the block-diagonal form the compiled VSN runs
    compiled_embed = torch.compile(embed, dynamic=False, options=inductor_options())
    torch.backends.cuda.matmul.allow_tf32 = True

    def unfused(a, b):
        return b.unsqueeze(-1) * compiled.var_grn(compiled_embed(a, compiled.embed_w, compiled.embed_b))

    for precision in [p for p in args.precisions.split(",") if p]:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32

        def form(a, b, dtype=dtype):
            with torch.autocast("cuda", dtype=dtype, enabled=dtype == torch.bfloat16):
                return unfused(a, b).float()

        measure(f"compiled block-diagonal GRN, then weighting, {precision}", form, weights_of=compiled)
    torch.backends.cuda.matmul.allow_tf32 = False
    measure("eager reference, fp32", lambda a, b: grn.grn_select_ref(a, b, *weights(module)))

    machine = machine_info(copy_tb_s=tb_s, inductor=inductor_options())
    print(write_table(Path(args.out), rows, machine, TARGETS))
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.md')}")


if __name__ == "__main__":
    main()

"""model.compile_trunk on CUDA: each compiled trunk module (the VSN, one Mamba2 block) against its eager
twin at production widths and K, fp32 without TF32: the training output, the input gradient, the
evaluation output and every parameter gradient, as max relative error. Two ways to compile: "model" is what
PerceptionModel does (the VSN in regions, VSN.compile_regions), "whole_vsn" compiles the VSN as one
module, as a record of the fault the regions avoid.

    PYTHONPATH=. python3 benchmarks/compile_check.py [--batch 4] [--out benchmarks/results/compile_check.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.atomic import atomic_write_text  # noqa: E402
from perception.model import ModelConfig, PerceptionModel  # noqa: E402
from perception.model.config import MambaConfig  # noqa: E402

TOLERANCE = 1e-3  # max relative error; fp32 reassociation stays near 1e-6
WAYS = ("model", "whole_vsn")


def module_errors(eager: torch.nn.Module, compiled: torch.nn.Module, inp: torch.Tensor) -> dict[str, float]:
    outs = {}
    for label, module in (("eager", eager), ("compiled", compiled)):
        module.zero_grad(set_to_none=True)
        leaf = inp.clone().requires_grad_()
        out = module(leaf)
        out = out[0] if isinstance(out, tuple) else out
        out.square().mean().backward()
        with torch.no_grad():
            ev = module(inp)
            ev = ev[0] if isinstance(ev, tuple) else ev
        tensors = {"train out": out.detach(), "input grad": leaf.grad, "eval out": ev}
        tensors.update({f"grad {n}": p.grad for n, p in sorted(module.named_parameters())})
        outs[label] = tensors
    return {
        what: ((outs["compiled"][what] - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        for what, b in outs["eager"].items()
    }


def check(
    way: str, batch: int, window: int, features: int, chunk: int, modules: list[str]
) -> dict[str, dict[str, float]]:
    torch._dynamo.reset()
    cfg = dict(d_model=128, ops="ref", mamba=MambaConfig(chunk=chunk))
    eager = PerceptionModel(ModelConfig(**cfg), n_features=features, horizons=[30, 6000], seed=0).cuda()
    twin = PerceptionModel(
        ModelConfig(**cfg, compile_trunk=way == "model"), n_features=features, horizons=[30, 6000], seed=0
    ).cuda()
    if way == "whole_vsn":
        for module in (twin.vsn, *twin.mamba.layers):
            module.compile(dynamic=False)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(batch, window, features, generator=g).cuda()
    h = torch.randn(batch, window, 128, generator=g).cuda()
    found = {}
    if "vsn" in modules:
        found["vsn"] = module_errors(eager.vsn, twin.vsn, x)
    if "mamba0" in modules:
        found["mamba0"] = module_errors(eager.mamba.layers[0], twin.mamba.layers[0], h)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--features", type=int, default=65)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--modules", default="vsn,mamba0")
    parser.add_argument("--ways", default=",".join(WAYS), help="ways to compile, of " + ",".join(WAYS))
    parser.add_argument("--out", default="benchmarks/results/compile_check.json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu = torch.cuda.get_device_name()
    print(
        f"compiled vs eager trunk modules, B={args.batch} K={args.window} F={args.features} chunk {args.chunk}, "
        f"fp32, on {gpu} (torch {torch.__version__})",
        flush=True,
    )
    ways = args.ways.split(",")
    results = {}
    for way in ways:
        results[way] = check(way, args.batch, args.window, args.features, args.chunk, args.modules.split(","))
    print(f"\n{'module':8} {'tensor':34} " + " ".join(f"{n:>12}" for n in ways))
    for module in results[ways[0]]:
        for what in results[ways[0]][module]:
            print(f"{module:8} {what:34} " + " ".join(f"{results[n][module][what]:12.2e}" for n in ways))
    verdict = {n: max(e for m in r.values() for e in m.values()) < TOLERANCE for n, r in results.items()}
    for n, ok in verdict.items():
        print(f"{n}: {'matches eager' if ok else 'WRONG'} (max relative error < {TOLERANCE:g})")
    out = dict(
        machine=dict(gpu=gpu, torch=torch.__version__),
        config=vars(args),
        tolerance=TOLERANCE,
        errors=results,
        matches_eager=verdict,
    )
    atomic_write_text(Path(args.out), json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

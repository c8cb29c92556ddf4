"""Bitwise reproducibility across processes: fresh processes train the model the same few steps from the
same seed and batch at each setting (precision, compiled trunk); the setting reproduces when every
process ends with the same parameter hash.

    PYTHONPATH=. python3 benchmarks/determinism.py [--settings tf32+compiled bf16+compiled] [--processes 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.atomic import atomic_write_text  # noqa: E402


def train_and_hash(setting: str, ops: str, batch: int, window: int, features: int, steps: int) -> str:
    """One process's work: `steps` of train_step.py's training step on its one fixed batch (shared pool,
    chunk 64); sha256 over every parameter's bytes."""
    from benchmarks.train_step import build

    precision, _, compiled = setting.partition("+")
    shape = argparse.Namespace(batch=batch, window=window, features=features, d_model=128)
    model, train_step, _ = build(shape, ops, "shared", precision, compiled == "compiled", chunk=64)
    for _ in range(steps):
        train_step()
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["tf32+compiled", "bf16+compiled"])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--features", type=int, default=65)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ops", default="auto", choices=["auto", "ref", "cuda"])
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process: one setting
    parser.add_argument("--out", default="benchmarks/results/determinism.json")
    args = parser.parse_args()
    if args.one:
        print(train_and_hash(args.one, args.ops, args.batch, args.window, args.features, args.steps))
        return
    common = ["--ops", args.ops, "--batch", str(args.batch), "--window", str(args.window), "--features", str(args.features),
              "--steps", str(args.steps)]
    children = {(s, i): subprocess.Popen([sys.executable, __file__, "--one", s, *common], stdout=subprocess.PIPE,
                                         text=True)
                for s in args.settings for i in range(args.processes)}  # all at once: they share the GPU
    hashes: dict[str, list[str]] = {s: [] for s in args.settings}
    for (setting, _), child in children.items():
        out, _ = child.communicate()
        if child.returncode:
            raise SystemExit(f"{setting}: a training process failed (exit {child.returncode})")
        hashes[setting].append(out.strip().splitlines()[-1])
    gpu = torch.cuda.get_device_name()
    print(f"{args.steps} training steps, B={args.batch} K={args.window} F={args.features}, "
          f"{args.processes} fresh processes per setting, on {gpu}")
    for setting, found in hashes.items():
        same = len(set(found)) == 1
        print(f"  {setting:16} {'bitwise identical' if same else 'DIFFERENT'}  ({', '.join(h[:12] for h in found)})")
    result = dict(machine=dict(gpu=gpu, torch=torch.__version__), config={k: v for k, v in vars(args).items() if k != "one"},
                  hashes=hashes, reproducible={s: len(set(h)) == 1 for s, h in hashes.items()})
    atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

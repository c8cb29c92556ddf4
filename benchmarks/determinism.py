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

HORIZONS = [30, 100, 300, 1000, 6000]


def train_and_hash(setting: str, ops: str, batch: int, window: int, features: int, steps: int) -> str:
    """One process's work: `steps` AdamW steps on one fixed batch; sha256 over every parameter's bytes."""
    from perception.model import ModelConfig, PerceptionModel, masked_bce
    from perception.model.config import MambaConfig
    from perception.train.precision import configure, forward_context

    precision, _, compiled = setting.partition("+")
    device = torch.device("cuda")
    cfg = ModelConfig(d_model=128, ops=ops, compile_trunk=compiled == "compiled", mamba=MambaConfig(chunk=64))
    model = PerceptionModel(cfg, n_features=features, horizons=HORIZONS, seed=0).to(device)
    model.set_dt_scale(1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, window, features, generator=g).to(device)
    dt = torch.exp(0.5 * torch.randn(batch, window, generator=g)).to(device)
    y = (torch.rand(batch, len(HORIZONS), generator=g) > 0.5).float().to(device)
    mask = torch.ones(batch, len(HORIZONS), dtype=torch.bool, device=device)
    configure(precision, device)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with forward_context(precision, device):
            logits = model(x, dt)
        masked_bce(logits.float(), y, mask).backward()
        opt.step()
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

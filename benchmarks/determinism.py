"""Bitwise reproducibility across processes: fresh processes train the model the same few steps from the
same seed and batch at each setting (precision, compiled trunk); the setting reproduces when every
process ends with the same parameter hash. Each process compiles from scratch with its own Inductor
cache (a shared one would hand every process the first one's autotuning choices). Where the
hashes differ, the gradients after the first step say which tensors differ first.

    PYTHONPATH=. python3 benchmarks/determinism.py [--settings tf32+compiled bf16+compiled] [--processes 10]
        [--cfc-path auto|portable] [--autotune]   # --autotune: Inductor's autotuning back on, as before

A setting may name the SSD backend last, e.g. bf16+compiled+mamba (model.mamba.ssd; chunked otherwise), and
`fusedgrn` for model.vsn.fused_grn, e.g. bf16+compiled+fusedgrn, `folded` for model.vsn.fold_embed, and
`chunkN` for model.mamba.chunk (64 otherwise), e.g. bf16+compiled+mamba+folded+fusedgrn+chunk128.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.atomic import atomic_write_text  # noqa: E402
from perception.studies.precision_quality import PRECISIONS, SWITCHES, switches_of  # noqa: E402


def parse_setting(setting: str) -> dict:
    """'bf16+compiled+mamba+folded+fusedgrn+chunk128' -> train_step.build's keywords, by the precision study's
    grammar (`switches_of`); an unknown part is an error naming it (a misspelt switch would otherwise train
    another form under the setting's name)."""
    named, unknown = switches_of(setting)
    precision = setting.split("+")[0]
    if precision not in PRECISIONS or unknown:
        raise SystemExit(
            f"--settings {setting}: expected a precision ({', '.join(PRECISIONS)}) then any of "
            f"{', '.join(SWITCHES)}, chunkN, joined by '+'; got precision {precision!r}, unknown parts {unknown}"
        )
    return dict(
        precision=precision,
        compiled=named.get("model.compile_trunk", False),
        ssd=named.get("model.mamba.ssd", "chunked"),
        chunk=named.get("model.mamba.chunk", 64),
        fused_grn=named.get("model.vsn.fused_grn", False),
        fold_embed=named.get("model.vsn.fold_embed", False),
    )


def train_and_hash(
    setting: str, ops: str, batch: int, window: int, features: int, steps: int, autotune: bool, grads_to: Path | None
) -> str:
    """One process's work: `steps` of train_step.py's training step on its one fixed batch (shared pool,
    chunk 64 unless the setting names one); sha256 over every parameter's bytes. `grads_to`: the gradients
    after the first step, saved."""
    from benchmarks.train_step import build
    from perception.model import compiled as compile_options

    if autotune:
        compile_options.INDUCTOR_OPTIONS["deterministic"] = False
    form = parse_setting(setting)
    shape = argparse.Namespace(batch=batch, window=window, features=features, d_model=128)
    model, train_step, _ = build(shape, ops, "shared", **form)
    for step in range(steps):
        train_step()
        if step == 0 and grads_to is not None:
            torch.save({n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}, grads_to)
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def gradient_differences(files: list[Path]) -> list[dict]:
    """Every tensor whose first-step gradient in a later process differs from the first process's: the
    process, the tensor, how many elements differ and the largest difference relative to the tensor's max."""
    first = torch.load(files[0])
    found = []
    for i, path in enumerate(files[1:], start=1):
        other = torch.load(path)
        for name, g in first.items():
            differ = g != other[name]
            if differ.any():
                scale = g.abs().max().item() or 1.0
                found.append(
                    dict(
                        process=i,
                        tensor=name,
                        elements=int(differ.sum()),
                        of=g.numel(),
                        max_rel=(g - other[name]).abs().max().item() / scale,
                    )
                )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["tf32+compiled", "bf16+compiled"])
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--features", type=int, default=65)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ops", default="auto", choices=["auto", "ref", "cuda"])
    parser.add_argument(
        "--cfc-path",
        default="auto",
        choices=["auto", "portable"],
        help="PERCEPTION_CFC_PATH of the processes: portable is the L40S's CfC scan",
    )
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="Inductor's autotuning on, as before the trunk's deterministic compile: shows what differs",
    )
    parser.add_argument("--parallel", type=int, default=0, help="processes at once (0: all)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process: one setting
    parser.add_argument("--grads-to", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/determinism.json")
    args = parser.parse_args()
    if args.one:
        grads = Path(args.grads_to) if args.grads_to else None
        print(
            train_and_hash(args.one, args.ops, args.batch, args.window, args.features, args.steps, args.autotune, grads)
        )
        return
    for setting in args.settings:  # refused before any process starts
        parse_setting(setting)
    common = [
        "--ops",
        args.ops,
        "--batch",
        str(args.batch),
        "--window",
        str(args.window),
        "--features",
        str(args.features),
        "--steps",
        str(args.steps),
    ] + (["--autotune"] if args.autotune else [])

    def run_one(setting: str, i: int, work: Path) -> str:
        # its own Inductor cache (graphs, autotuning choices); Triton's binaries, pure functions of a kernel's
        # source and configuration, are shared to save compile time
        env = dict(
            os.environ,
            PERCEPTION_CFC_PATH=args.cfc_path,
            TORCHINDUCTOR_CACHE_DIR=str(work / f"{setting}-{i}"),
            TRITON_CACHE_DIR=str(work / "triton"),
            TORCHINDUCTOR_COMPILE_THREADS="1",
        )
        done = subprocess.run(
            [sys.executable, __file__, "--one", setting, "--grads-to", str(work / f"{setting}-{i}.pt"), *common],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        if done.returncode:
            raise SystemExit(f"{setting}: training process {i} failed (exit {done.returncode})")
        print(f"  {setting} process {i}: {done.stdout.strip().splitlines()[-1][:12]}", flush=True)
        return done.stdout.strip().splitlines()[-1]

    jobs = [(s, i) for s in args.settings for i in range(args.processes)]
    with (
        tempfile.TemporaryDirectory(prefix="determinism-") as tmp,
        ThreadPoolExecutor(max_workers=args.parallel or len(jobs)) as pool,
    ):  # side by side on the one GPU
        work = Path(tmp)
        found = list(pool.map(lambda job: run_one(*job, work), jobs))
        hashes: dict[str, list[str]] = {s: [h for (js, _), h in zip(jobs, found) if js == s] for s in args.settings}
        differences = {
            s: gradient_differences([work / f"{s}-{i}.pt" for i in range(args.processes)])
            for s in args.settings
            if len(set(hashes[s])) > 1
        }
    gpu = torch.cuda.get_device_name()
    print(
        f"{args.steps} training steps, B={args.batch} K={args.window} F={args.features}, CfC path {args.cfc_path}, "
        f"Inductor autotuning {'on' if args.autotune else 'off'}, {args.processes} fresh processes per setting, on "
        f"{gpu}"
    )
    for setting, found in hashes.items():
        same = len(set(found)) == 1
        print(
            f"  {setting:16} {'bitwise identical' if same else 'DIFFERENT'}: {len(set(found))} distinct hash(es) in "
            f"{len(found)} ({', '.join(h[:12] for h in found)})"
        )
        for d in differences.get(setting, [])[:20]:
            print(
                f"    first-step gradient, process {d['process']}: {d['tensor']} differs in {d['elements']} of "
                f"{d['of']} "
                f"(max {d['max_rel']:.1e} of the tensor's max)"
            )
    result = dict(
        machine=dict(gpu=gpu, torch=torch.__version__),
        config={k: v for k, v in vars(args).items() if k not in ("one", "grads_to")},
        hashes=hashes,
        reproducible={s: len(set(h)) == 1 for s, h in hashes.items()},
        first_step_gradient_differences=differences,
    )
    atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

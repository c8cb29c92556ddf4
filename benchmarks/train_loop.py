"""The step as a run sees it: the trainer's own epoch (`perception.train.epoch.train_epoch`) and validation
pass (`perception.train.evaluate.evaluate`) over windows the loader gathers from a synthetic book, at
production size (B=64, K=6000, D=128, F as the features give, H=5), against the bare step
`benchmarks/train_step.py` times (random tensors already on the GPU). Two ways of feeding the step:

- ahead: the trainer's way on a GPU: pinned batch buffers, the next batch gathered and copied by a
  thread while the step runs (`perception.data.prefetched`);
- inline: each batch gathered and copied in the loop, from pageable memory, before its step.

    PYTHONPATH=. python3 benchmarks/train_loop.py [--settings bf16+compiled tf32+compiled] [--steps 12]

Prints a table and writes benchmarks/results/train_loop.json. Needs a CUDA GPU and the built extension
(`--device cpu` with a small `--window` and `--batch` runs the same code with the reference ops, as a check).
Each row's step is the median over `--repeats` epochs of `--steps` batches, after a warm-up epoch."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cuda_timing import cuda_median_ms, machine_info  # noqa: E402
from perception.data import Normalizer, WindowLoader, load_dataset, prefetched, purged_split  # noqa: E402
from perception.data.config import DataConfig  # noqa: E402
from perception.model import ModelConfig, PerceptionModel, masked_bce  # noqa: E402
from perception.train.diagnostics import GradNorms  # noqa: E402
from perception.train.epoch import train_epoch  # noqa: E402
from perception.train.evaluate import evaluate  # noqa: E402
from perception.train.precision import configure as configure_precision, forward_context  # noqa: E402

HORIZONS = [30, 100, 300, 1000, 6000]


def parse_setting(text: str) -> tuple[str, bool]:
    precision, _, rest = text.partition("+")
    if precision not in ("fp32", "tf32", "bf16") or rest not in ("", "compiled"):
        raise SystemExit(f"--settings {text}: expected PRECISION or PRECISION+compiled, PRECISION in fp32, tf32, bf16")
    return precision, rest == "compiled"


def dataset(args):
    cfg = DataConfig(n_snapshots=args.snapshots, window=args.window, window_stride=50, horizons=HORIZONS)
    ds = load_dataset(cfg, home=Path(tempfile.mkdtemp(prefix="train_loop_")), progress=False)
    split = purged_split(ds, cfg)
    return ds, split, Normalizer.fit(ds, split.train_ends, args.window)


def measure(args, data, precision: str, compiled: bool, feeds: tuple[bool, ...]) -> list[dict]:
    """One row per feed (ahead or not), one model: each row trains on from where the last stopped."""
    ds, split, norm = data
    device = torch.device(args.device)
    torch._dynamo.reset()
    configure_precision(precision, device)
    ops = "cuda" if device.type == "cuda" else "ref"
    model = PerceptionModel(
        ModelConfig(attention_pool="per_horizon", d_model=args.d_model, ops=ops, compile_trunk=compiled),
        n_features=ds.features.shape[1],
        horizons=HORIZONS,
        seed=0,
    ).to(device)
    model.set_dt_scale(1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    val_ends = split.val_ends[: args.eval_batches * args.batch]
    rows = []
    for ahead in feeds:
        train = WindowLoader(ds, split.train_ends, args.window, args.batch, normalizer=norm, seed=0, pin_memory=ahead)
        val = WindowLoader(ds, val_ends, args.window, args.batch, normalizer=norm, shuffle=False, pin_memory=ahead)

        def epoch(e: int, steps: int) -> float:
            with prefetched(islice(train.batches(e), steps), device, ahead=ahead) as batches:
                totals = train_epoch(
                    model,  # noqa: F821 (deleted after use; the lambda runs first)
                    batches,
                    opt,  # noqa: F821 (deleted after use; the lambda runs first)
                    sched,
                    masked_bce,
                    precision=precision,
                    device=device,
                    grad_clip=1.0,
                    epoch=e,
                    grad_norms=GradNorms(model),  # noqa: F821 (deleted after use; the lambda runs first)
                )  # as the trainer logs
            return totals.seconds / totals.steps

        def validation() -> float:
            t0 = time.perf_counter()
            evaluate(model, val, masked_bce, HORIZONS, args.window, device, precision)  # noqa: F821 (deleted after use; the lambda runs first)
            return (time.perf_counter() - t0) / len(val)

        epoch(0, 3)  # compilation, autotuning, the allocator, the pinned buffers
        validation()
        step_s = [epoch(1 + r, args.steps) for r in range(args.repeats)]
        eval_s = [validation() for _ in range(args.repeats)]
        rows.append(
            dict(
                precision=precision,
                compiled=compiled,
                feed="ahead" if ahead else "inline",
                step_ms=1e3 * statistics.median(step_s),
                eval_ms=1e3 * statistics.median(eval_s),
                step_ms_all=[1e3 * v for v in step_s],
                eval_ms_all=[1e3 * v for v in eval_s],
            )
        )
    bare_step_ms, bare_eval_ms = bare(model, opt, ds.features.shape[1], precision, args)
    for row in rows:
        row.update(bare_step_ms=bare_step_ms, bare_eval_ms=bare_eval_ms)
        print(
            f"  {precision:5} {'compiled' if compiled else 'eager':8} {row['feed']:6}  step {row['step_ms']:7.1f} ms "
            f"(bare {bare_step_ms:6.1f})  eval {row['eval_ms']:7.1f} ms per batch (bare {bare_eval_ms:6.1f})",
            flush=True,
        )
    configure_precision("fp32", device)
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def bare(model, opt, n_features: int, precision: str, args) -> tuple[float, float]:
    """The same model's step and eval forward on random tensors already on the GPU (train_step.py's way)."""
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.window, n_features, generator=g).to(device)
    dt = torch.exp(0.5 * torch.randn(args.batch, args.window, generator=g)).to(device)
    y = (torch.rand(args.batch, len(HORIZONS), generator=g) > 0.5).float().to(device)
    mask = torch.ones(args.batch, len(HORIZONS), dtype=torch.bool, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        with forward_context(precision, device):
            logits = model(x, dt)
        masked_bce(logits.float(), y, mask).backward()
        opt.step()

    def forward():
        with torch.no_grad(), forward_context(precision, device):
            model(x, dt, return_attention=True)

    timed = cuda_median_ms if device.type == "cuda" else wall_median_ms
    step_ms = timed(step, 5)
    model.eval()
    eval_ms = timed(forward, 5)
    model.train()
    return step_ms, eval_ms


def wall_median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["bf16+compiled", "tf32+compiled"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--window", type=int, default=6000)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--snapshots", type=int, default=120_000, help="synthetic book length (enough windows)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--feeds", default="inline,ahead", help="which feeds to time on a GPU (inline, ahead)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_loop.json"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_loop.py needs a CUDA GPU (or --device cpu for a check at small size)")
    settings = [parse_setting(s) for s in args.settings]
    if not set(args.feeds.split(",")) <= {"inline", "ahead"}:
        raise SystemExit(f"--feeds {args.feeds}: expected a comma-separated list of inline, ahead")
    t0 = time.perf_counter()
    data = dataset(args)
    print(
        f"synthetic book: {len(data[0].dt)} snapshots, F={data[0].features.shape[1]}, "
        f"{len(data[1].train_ends)} training windows ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    feeds = tuple(f == "ahead" for f in args.feeds.split(",") if f) if args.device == "cuda" else (False,)
    rows = [row for p, c in settings for row in measure(args, data, p, c, feeds)]
    print("\n| setting | feed | step ms | bare step ms | step overhead | eval ms/batch | bare eval ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        setting = r["precision"] + (" compiled" if r["compiled"] else "")
        print(
            f"| {setting} | {r['feed']} | {r['step_ms']:.1f} | {r['bare_step_ms']:.1f} | "
            f"{r['step_ms'] - r['bare_step_ms']:+.1f} | {r['eval_ms']:.1f} | {r['bare_eval_ms']:.1f} |"
        )
    machine = (
        machine_info()
        if args.device == "cuda"
        else dict(cpu=platform.processor() or platform.machine(), torch=torch.__version__)
    )
    result = dict(machine=machine, config=vars(args), features=int(data[0].features.shape[1]), rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""CUDA-event timing shared by the GPU benchmarks: the median of `reps` timed calls after warm-up, and the
GPU time of a step replayed from a CUDA graph (host launch and autograd time left out). Also the one table
format of the op benchmarks (benchmarks/ops_<family>.py): rows as JSON beside a markdown table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from perception.atomic import atomic_write_text


def cuda_median_ms(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):  # allocator, cuBLAS handles, lazy module state
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graphed(fn, warm_up_with=None, warmups: int = 3):
    """`fn` captured once as a CUDA graph after `warm_up_with` (default `fn`) ran `warmups` times on a side
    stream, as torch.cuda.graph asks; returns the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            (warm_up_with or fn)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graph_ms(step, reps: int, inner: int = 20) -> float:
    """GPU time of one `step`: `inner` steps captured in one CUDA graph, replayed, divided by `inner`."""

    def steps():
        for _ in range(inner):
            step()

    return cuda_median_ms(graphed(steps, warm_up_with=step), reps) / inner


def machine_info(**extra) -> dict:
    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda, **extra)


def markdown_table(rows: list[dict], machine: dict, targets: dict[str, str]) -> str:
    """Rows: op, impl, shape, fwd_ms, fwdbwd_ms, floor_fwdbwd_ms (optional), note."""
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    copy = f"device copy {machine['copy_tb_s']:.2f} TB/s; " if "copy_tb_s" in machine else ""
    lines = [
        f"GPU: {machine['gpu']} (torch {machine['torch']}, CUDA {machine['cuda']}); "
        f"{copy}fp32, TF32 off; medians of CUDA-event timings "
        "(per call, host launch and autograd time included; 'CUDA graph' rows: GPU time of graph replays)",
        "",
        "| op | impl | shape | fwd ms | fwd+bwd ms | floor fwd+bwd ms | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['impl']} | {r['shape']} | {fmt(r.get('fwd_ms'))} | {fmt(r.get('fwdbwd_ms'))} "
            f"| {fmt(r.get('floor_fwdbwd_ms'))} | {r.get('note', '')} |"
        )
    lines += ["", "Targets: " + "; ".join(f"{k}: {v}" for k, v in targets.items())]
    return "\n".join(lines)


def write_table(out: Path, rows: list[dict], machine: dict, targets: dict[str, str], markdown: bool = True) -> str:
    """Writes the rows to `out` (JSON) and, unless markdown=False, the table beside it (.md); returns the table."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(dict(machine=machine, rows=rows), indent=2) + "\n")
    text = markdown_table(rows, machine, targets)
    if markdown:
        atomic_write_text(out.with_suffix(".md"), text + "\n")
    return text

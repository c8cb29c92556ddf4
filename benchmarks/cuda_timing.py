"""CUDA-event timing shared by the GPU benchmarks: the median of `reps` timed calls after warm-up, and the
GPU time of a step replayed from a CUDA graph (host launch and autograd time left out)."""

from __future__ import annotations

import statistics

import torch


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


def graph_ms(step, reps: int, inner: int = 20) -> float:
    """GPU time of one `step`: `inner` steps captured in one CUDA graph, replayed, divided by `inner`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            step()
    return cuda_median_ms(graph.replay, reps) / inner

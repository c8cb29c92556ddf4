"""CUDA-event timing shared by the GPU benchmarks: the median of `reps` timed calls after warm-up."""

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

"""Which training runs where: sequential on CPU, one run per visible GPU in parallel otherwise.

Pure functions, so the assignment is tested without GPUs; local.py only executes the plan."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, TypeVar

T = TypeVar("T")


def visible_gpus(env: Mapping[str, str], device_count: int) -> list[str]:
    """The GPU ids a child process may be pinned to, honouring an existing CUDA_VISIBLE_DEVICES
    (ids, UUIDs or MIG names; "" or "-1" hide every GPU). `device_count` is what torch sees."""
    if device_count <= 0:
        return []
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(device_count)]
    ids = []
    for item in listed.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break  # CUDA stops at the first invalid entry
        ids.append(item)
    return ids[:device_count]


def plan_waves(runs: Sequence[T], gpus: Sequence[str]) -> list[list[tuple[T, Optional[str]]]]:
    """Runs grouped into waves that run concurrently, each run with its own device (None: CPU).

    On CPU every wave holds one run (sequential: the runs share two cores). With n GPUs a wave
    holds up to n runs, in the given order, so both variants of a fold train side by side."""
    if not gpus:
        return [[(run, None)] for run in runs]
    n = len(gpus)
    return [list(zip(runs[i : i + n], gpus)) for i in range(0, len(runs), n)]


CPU_LANE = "cpu"  # a CPU worker's lane: trainings side by side, one core each (the scales' num_threads=1)


def child_env(base: Mapping[str, str], device: Optional[str]) -> dict[str, str]:
    """The environment of one training process: pinned to its GPU, or kept off GPUs on a CPU lane."""
    env = dict(base)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = "" if device == CPU_LANE else device
    return env


def detect_gpus(env: Mapping[str, str]) -> list[str]:
    """`visible_gpus` with torch's device count; an install without CUDA sees none."""
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver is a CPU machine for the sweep's purposes
        count = 0
    return visible_gpus(env, count)

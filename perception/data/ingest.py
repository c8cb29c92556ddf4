"""DBN files -> features and labels in bounded memory, the files read by `data.workers` processes.

Each file is streamed into its own spill of book states (file_clock.py) by a worker; stitch.py puts
them on one clock; features are then computed in row blocks and written straight to their file, so
the peak memory is the chunk budget (shared by the workers) plus the per-snapshot arrays (time, Δt,
segment, labels), not the input. The result does not depend on the number of workers: each file's part is computed alone
and the parts are joined in time order.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm.auto import tqdm

from perception.data.book import smallest_price_step
from perception.data.config import DataConfig
from perception.data.features import FEATURE_NAMES, compute_features, labels_from_mid2, mid2
from perception.data.file_clock import FileJob, FilePart, extract_file
from perception.data.stitch import Clock, stitch
from perception.errors import DataError

FEATURE_BLOCK = 65_536  # snapshot rows per feature block
TICK_ROWS = 200_000  # rows the tick is inferred from (smallest_price_step's default)


def available_cores() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def workers_for(cfg: DataConfig, n_files: int) -> int:
    return max(1, min(cfg.workers or available_cores(), n_files))


def extract_all(cfg: DataConfig, files: list[Path], spill_dir: Path, progress: bool) -> list[FilePart]:
    n_workers = workers_for(cfg, len(files))
    chunk = max(1, cfg.chunk_records // n_workers)  # the workers share one budget of records in memory
    jobs = [FileJob(i, str(p), str(spill_dir / f"{i:05d}"), cfg.instrument, cfg.snapshot_interval, chunk)
            for i, p in enumerate(files)]
    bar = tqdm(total=len(jobs), desc=f"read DBN ({n_workers} workers)", unit="file", disable=not progress)
    t0, n_records, parts = time.perf_counter(), 0, []

    def done(part: FilePart) -> None:
        nonlocal n_records
        parts.append(part)
        n_records += part.records_read
        bar.set_postfix_str(f"{n_records / max(time.perf_counter() - t0, 1e-9) / 1e6:.2f} M rec/s")
        bar.update()

    try:
        if n_workers == 1:
            for job in jobs:
                done(extract_file(job))
        else:
            _extract_parallel(jobs, n_workers, done)
    finally:
        bar.close()
    return parts


def _extract_parallel(jobs: list[FileJob], n_workers: int, done) -> None:
    # spawn: a fresh interpreter that imports only the reader (no torch, no inherited buffers)
    with ProcessPoolExecutor(n_workers, mp_context=get_context("spawn")) as pool:
        pending = {pool.submit(extract_file, job): job for job in jobs}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in finished:
                job = pending.pop(fut)
                error = fut.exception()
                if error is not None:
                    for other in pending:
                        other.cancel()
                    if isinstance(error, BrokenProcessPool):  # killed: out of memory, or a signal
                        raise DataError(
                            f"{job.path}: a file reader process died while reading it or another file "
                            "(killed, e.g. out of memory); lower data.workers or data.chunk_records"
                        ) from None
                    raise error
                done(fut.result())


@dataclass
class Built:
    features: np.ndarray  # (T, F) float32: in memory, or memory-mapped from the written file
    dt: np.ndarray
    y: np.ndarray
    mask: np.ndarray
    segment: np.ndarray
    counts: dict
    summary: dict


def clock_from_files(cfg: DataConfig, files: list[Path], spill_dir: Path, names: str,
                     progress: bool) -> Clock:
    parts = extract_all(cfg, files, spill_dir, progress)
    clock = stitch(cfg, parts, names)
    if len(clock) == 0:
        raise DataError(f"{names}: zero usable snapshots (dropped records by reason: {dict(clock.counts)})")
    return clock


def tick_of(clock: Clock) -> int:
    return smallest_price_step(clock.snapshots(0, min(TICK_ROWS, len(clock))))


def features_and_labels(clock: Clock, tick: int, horizons: list[int],
                        features_file: Optional[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features block by block (each block with the row before it, for the mid return), written to
    `features_file` as .npy when given; labels from the whole mid series."""
    T, F = len(clock), len(FEATURE_NAMES)
    m2 = np.empty(T, np.int64)
    out = None if features_file is not None else np.empty((T, F), np.float32)
    sink = open(features_file, "wb") if features_file is not None else None
    try:
        if sink is not None:
            np.lib.format.write_array_header_1_0(
                sink, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                       "fortran_order": False, "shape": (T, F)})
        for a in range(0, T, FEATURE_BLOCK):
            b = min(a + FEATURE_BLOCK, T)
            lo = max(a - 1, 0)
            snaps = clock.snapshots(lo, b)
            feats = compute_features(snaps, tick)[a - lo :]
            m2[a:b] = mid2(snaps)[a - lo :]
            if sink is not None:
                sink.write(np.ascontiguousarray(feats).tobytes())
            else:
                out[a:b] = feats
    finally:
        if sink is not None:
            sink.close()
    y, mask = labels_from_mid2(m2, clock.segment, horizons)
    if out is None:
        out = np.load(features_file, mmap_mode="r")
    return out, y, mask

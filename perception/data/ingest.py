"""DBN files -> features and labels in bounded memory, the files read by `data.workers` threads.

Each file is streamed into its own spill of book states (file_clock.py) by a reader thread; as
files come back this thread stitches them on one clock and computes the features of each block of
rows no later file can change, written straight to their file (assemble.py), so that work overlaps
the reading. Threads, not processes: the readers' work (zstd decompression, numpy copies, sorts and
comparisons over whole chunks) runs without the GIL, and a process per reader would add its own
interpreter and libraries (~35 MB resident each) to the peak. The peak memory is the chunk budget
(shared by the readers) plus the per-snapshot arrays (time, Δt, segment, labels), not the input.
The result does not depend on the number of workers: each file's part is computed alone and the
parts are joined in time order.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from tqdm.auto import tqdm

from perception.data.assemble import Assembly
from perception.data.config import DataConfig
from perception.data.file_clock import FileJob, FilePart, extract_file
from perception.data.stitch import Clock, stitch


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


def tune_malloc() -> bool:
    """glibc's malloc with a fixed mmap threshold (32 MB) and trim threshold (128 MB), for a process
    that builds: the readers' per-chunk temporaries (a few MB each) are then reused from the heap
    instead of being returned and faulted in again each time (page faults cost system CPU, and reader
    threads faulting at once contend on the process's address space; the counts: docs/performance.md
    "Reading Databento files (streamed)"). Process-wide and lasting, so the command sets it, not the library; False
    where there is no glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 128 << 20))


def workers_for(cfg: DataConfig, n_files: int) -> int:
    return max(1, min(cfg.workers or available_cores(), n_files))


def extract_all(
    cfg: DataConfig, files: list[Path], spill_dir: Path, progress: bool, done: Callable[[FilePart], None]
) -> None:
    """Every file read into its spill; `done(part)` in this process as each one finishes."""
    n_workers = workers_for(cfg, len(files))
    chunk = max(1, cfg.chunk_records // n_workers)  # the workers share one budget of records in memory
    jobs = [
        FileJob(i, str(p), str(spill_dir / f"{i:05d}"), cfg.instrument, cfg.snapshot_interval, chunk)
        for i, p in enumerate(files)
    ]
    bar = tqdm(total=len(jobs), desc=f"read DBN ({n_workers} workers)", unit="file", disable=not progress)
    t0, n_records = time.perf_counter(), 0

    def finished(part: FilePart) -> None:
        nonlocal n_records
        n_records += part.records_read
        bar.set_postfix_str(f"{n_records / max(time.perf_counter() - t0, 1e-9) / 1e6:.2f} M rec/s")
        bar.update()
        done(part)

    try:
        if n_workers == 1:
            for job in jobs:
                finished(extract_file(job))
        else:
            _extract_parallel(jobs, n_workers, finished)
    finally:
        bar.close()


def _extract_parallel(jobs: list[FileJob], n_workers: int, done: Callable[[FilePart], None]) -> None:
    stop = threading.Event()  # set on the first error: the other readers end at their next chunk
    with ThreadPoolExecutor(n_workers, thread_name_prefix="dbn-reader") as pool:
        pending = {pool.submit(extract_file, job, stop) for job in jobs}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    done(fut.result())  # a reader's error is raised here
        except BaseException:
            stop.set()
            for fut in pending:
                fut.cancel()
            raise


def build(
    cfg: DataConfig, files: list[Path], spill_dir: Path, names: str, progress: bool, features_file: Optional[Path]
) -> tuple[Clock, np.ndarray, np.ndarray, np.ndarray]:
    """The clock, features (written to `features_file` as .npy when given), labels y and mask."""
    assembly = Assembly(cfg, features_file, names)
    try:
        extract_all(cfg, files, spill_dir, progress, assembly.add)
    except BaseException:
        assembly.out.discard()
        raise
    return assembly.finish()


def clock_from_files(cfg: DataConfig, files: list[Path], spill_dir: Path, names: str, progress: bool) -> Clock:
    parts: list[FilePart] = []
    extract_all(cfg, files, spill_dir, progress, parts.append)
    return stitch(cfg, parts, names)

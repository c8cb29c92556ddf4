"""Data pipeline speed: synthetic books, DBN decode, window gather; dense multi-file DBN builds.

    python benchmarks/data_pipeline.py [--repeats 3]
    python benchmarks/data_pipeline.py --files --dense-dir /tmp/perception-dense [--sets 1,4,16]
    python benchmarks/data_pipeline.py --equality 4   # streamed == whole-array on 4 dense files

The first prints a table and writes benchmarks/results/data_pipeline.json. Targets (issue "Speed"):
synthetic >= 1M snapshots in < 10 s on one core, 2M (production) in < 30 s; batch gather for
B=64, K=6000 with the default features < 50 ms on 2 cores.

`--files` writes dense daily `.dbn.zst` files once into --dense-dir (1.6 M records each, 40 per
1 s interval, like real ES books; reused when present), runs `perception-data build data=dbn` on
sets of 1, 4 and 16 of them with data.workers=1 and all cores (the two back to back in each repeat,
the load average noted per run: on a shared machine they see the same load), and measures wall and
CPU time, records/s end to end and the peak RSS of the whole process tree (sampled from /proc every
20 ms), plus the whole-array in-memory build on the smallest sets for comparison, and the CPU seconds
of each stage of one build of the largest set. CPU-s / wall-s of each run shows how many cores it
got: on a shared machine a second core is often not free, and then no speedup can show.
It writes benchmarks/results/data_pipeline_files.json.
Targets (issue 28): peak RSS at 16 files within 1.25x that at 1 file; >= 1 M records/s per core;
2 workers >= 1.6x as fast as 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from perception.data import Normalizer, WindowLoader, load_dataset
from perception.data import synthetic
from perception.data.book import snapshots_from_records
from perception.data.config import DataConfig
from perception.data.dbn_io import F_LAST, N_LEVELS, empty_records, read_mbp10, write_mbp10
from perception.data.features import compute_features

RESULTS = Path(__file__).parent / "results" / "data_pipeline.json"
PROD = dict(window=6000, window_stride=50, horizons=[30, 100, 300, 1000, 6000])


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_synthetic(n: int, repeats: int) -> dict:
    """Books -> snapshots -> features + labels on one thread (no cache write)."""
    cfg = DataConfig(n_snapshots=n, cache=False, **PROD)
    secs = _median_time(lambda: load_dataset(cfg, progress=False), repeats)
    return {"snapshots": n, "seconds": secs, "snapshots_per_s": n / secs}


def bench_dbn(n_records: int, repeats: int, compress: bool, tmp: Path) -> dict:
    """Read a synthetic MBP-10 file of n_records records and put it on the 1 s clock."""
    snaps = synthetic.generate(n_records * 3 // 4, 0, PROD["horizons"], PROD["window"])
    rec = synthetic.to_records(snaps, superseded_every=3)[:n_records]  # 4 records per 3 intervals
    path = tmp / ("bench.dbn.zst" if compress else "bench.dbn")
    write_mbp10(path, rec, compress=compress)
    decode = _median_time(lambda: read_mbp10(path), repeats)
    records = read_mbp10(path).records
    clock = _median_time(lambda: snapshots_from_records(records, 1.0, 60.0, Counter()), repeats)
    out = snapshots_from_records(records, 1.0, 60.0, Counter())
    feats = _median_time(lambda: compute_features(out, synthetic.TICK), repeats)
    return {
        "records": len(rec),
        "file_mb": path.stat().st_size / 1e6,
        "decode_s": decode,
        "records_per_s": len(rec) / decode,
        "snapshot_clock_s": clock,
        "features_s": feats,
        "snapshots": len(out),
        "end_to_end_records_per_s": len(rec) / (decode + clock + feats),
    }


def bench_gather(n: int, batch: int, repeats: int, home: Path) -> dict:
    """One training batch [B, K, F] gathered and z-scored from the memory-mapped cache."""
    cfg = DataConfig(n_snapshots=n, **PROD)
    ds = load_dataset(cfg, home=home, progress=False)
    ends = np.arange(PROD["window"] - 1, len(ds) - PROD["horizons"][-1], PROD["window_stride"])
    norm = Normalizer.fit(ds, ends, PROD["window"])
    loader = WindowLoader(ds, ends, PROD["window"], batch, normalizer=norm, seed=0)
    order = loader.order(0)
    chunks = [order[i * batch : (i + 1) * batch] for i in range(repeats + 2)]
    for c in chunks[:2]:  # page cache and allocator warm-up
        loader.gather(c)
    times = []
    for c in chunks[2:]:
        t0 = time.perf_counter()
        loader.gather(c)
        times.append(time.perf_counter() - t0)
    x_mb = batch * PROD["window"] * ds.features.shape[1] * 4 / 1e6
    return {
        "B": batch,
        "K": PROD["window"],
        "F": ds.features.shape[1],
        "batch_mb": x_mb,
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "memory_mapped": isinstance(ds.features, np.memmap),
        "torch_threads": torch.get_num_threads(),
    }


# ------------------------------------------------------------------ dense multi-file builds

FILES_RESULTS = Path(__file__).parent / "results" / "data_pipeline_files.json"
PER_INTERVAL = 40  # records per 1 s interval: a dense book
DAY0_NS = 1_704_153_600 * 1_000_000_000  # 2024-01-02 00:00 UTC
DAY_NS = 86_400 * 1_000_000_000


def dense_records(n_records: int, day: int, seed: int) -> np.ndarray:
    """n_records MBP-10 records, PER_INTERVAL per second from 00:00 UTC of day `day`: each interval's
    records are complete books at sorted times (a tenth mid-event, without F_LAST), sizes moving
    between them, the last one the interval's synthetic snapshot."""
    n_int = n_records // PER_INTERVAL
    n = n_int * PER_INTERVAL
    snaps = synthetic.generate(n_int, seed, PROD["horizons"], PROD["window"])
    rng = np.random.default_rng([seed, 28])
    src = np.repeat(np.arange(n_int), PER_INTERVAL)
    jitter = np.sort(rng.integers(0, 1_000_000_000, size=(n_int, PER_INTERVAL)), axis=1).ravel()
    is_last = np.zeros(n, bool)
    is_last[PER_INTERVAL - 1 :: PER_INTERVAL] = True
    rec = empty_records(n)
    rec["instrument_id"] = 1
    rec["ts_recv"] = DAY0_NS + day * DAY_NS + (snaps.ts - snaps.ts[0])[src] + jitter
    rec["ts_event"] = rec["ts_recv"] - 20_000
    rec["action"] = rng.choice(np.array([b"A", b"C", b"M", b"T"]), size=n)
    rec["side"] = np.where(rng.random(n) < 0.5, b"B", b"A")
    rec["flags"] = np.where(is_last | (rng.random(n) < 0.9), F_LAST, 0)
    rec["sequence"] = np.arange(n, dtype=np.uint32)
    wiggle = np.where(is_last, 0, rng.integers(0, 4, size=n)).astype(np.uint32)
    for i in range(N_LEVELS):
        rec[f"bid_px_{i:02d}"] = snaps.bid_px[src, i]
        rec[f"ask_px_{i:02d}"] = snaps.ask_px[src, i]
        rec[f"bid_sz_{i:02d}"] = snaps.bid_sz[src, i] + wiggle
        rec[f"ask_sz_{i:02d}"] = snaps.ask_sz[src, i] + wiggle * (i % 2)
        rec[f"bid_ct_{i:02d}"] = snaps.bid_ct[src, i]
        rec[f"ask_ct_{i:02d}"] = snaps.ask_ct[src, i]
    rec["price"] = rec["bid_px_00"]
    rec["size"] = 1
    return rec


def dense_files(folder: Path, n_files: int, n_records: int) -> list[Path]:
    """The dense daily files, written once (atomically) and reused by later runs."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"dense-{n_records}-{day:02d}.mbp-10.dbn.zst" for day in range(n_files)]
    for day, path in enumerate(paths):
        if not path.exists():
            t0 = time.perf_counter()
            write_mbp10(path, dense_records(n_records, day, seed=day), dataset="GLBX.MDP3", compress=True)
            print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s", flush=True)
    return paths


def _tree_rss_kb(pid: int) -> int:
    """Resident kB of pid and all its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue  # exited meanwhile
    return total


def _run_measured(argv: list[str], env: dict) -> dict:
    """Run a command; wall time, peak RSS of its process tree (sampled) and of its largest process."""
    import subprocess
    import threading

    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{err[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the finished tree's CPU time
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "sys_cpu_s": after.ru_stime - before.ru_stime,
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "peak_tree_rss_mb": peak[0] / 1024,
        "stdout": out,
    }


_IN_MEMORY = """
import sys
from perception.data.config import DataConfig, DataSource
from perception.data.dataset import build_in_memory
ds = build_in_memory(DataConfig(source=DataSource.dbn, paths=sys.argv[1:], window=6000, window_stride=50,
                                horizons=[30, 100, 300, 1000, 6000], cache=False))
print(len(ds))
"""


_STAGES = """
import json, os, sys, threading, time
t0, c0 = time.perf_counter(), time.process_time()
from perception.train import data_cli
from perception.data import assemble, dataset, ingest
imports = time.process_time() - c0
cpu = {}
lock = threading.Lock()

def timed(owner, name, stage):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        start = time.thread_time()  # the CPU of the thread that runs it (a reader thread or this one)
        try:
            return inner(*args, **kwargs)
        finally:
            with lock:
                cpu[stage] = cpu.get(stage, 0.0) + time.thread_time() - start
    setattr(owner, name, wrapper)

timed(data_cli, "compose_data_config", "compose")
timed(ingest, "extract_file", "read files (reader threads)")
timed(assemble.Assembly, "add", "stitch + features as files arrive")
timed(assemble.Assembly, "finish", "stitch + features after the last file, labels")
timed(dataset, "_read_cache", "cache read back")
data_cli.build(sys.argv[1:], progress=False)
total = time.process_time() - c0
cpu["imports"] = imports
cpu["other (cache write, ...)"] = total - sum(cpu.values())
print(json.dumps({"cpu_s": cpu, "process_cpu_s": total, "wall_s": time.perf_counter() - t0}))
"""


def stage_cpu(paths: list[str], workers: int, env: dict) -> dict:
    """CPU seconds by stage of one build (in-process timers; the interpreter's start not included)."""
    import subprocess
    import sys

    argv = [sys.executable, "-c", _STAGES, "data=dbn", f"data.paths=[{','.join(paths)}]", f"data.workers={workers}"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_files(folder: Path, sets: list[int], n_records: int, repeats: int, in_memory_max: int) -> dict:
    import shutil
    import sys

    from perception.data.ingest import available_cores

    files = dense_files(folder, max(sets), n_records)
    cores = available_cores()
    rows = []
    for n_files in sets:
        paths = [str(p) for p in files[:n_files]]
        n_rec = n_files * (n_records // PER_INTERVAL) * PER_INTERVAL
        raw_mb = n_rec * 368 / 1e6
        runs: dict[int, list[dict]] = {w: [] for w in sorted({1, cores})}
        for _ in range(repeats):
            for workers in runs:  # back to back, so that both see the same load
                home = Path(tempfile.mkdtemp(prefix="perception-bench-home-"))
                try:
                    env = {**os.environ, "PERCEPTION_HOME": str(home)}
                    argv = [
                        "perception-data",
                        "build",
                        "data=dbn",
                        f"data.paths=[{','.join(paths)}]",
                        f"data.workers={workers}",
                        "--no-progress",
                    ]
                    load = os.getloadavg()[0]
                    runs[workers].append({**_run_measured(argv, env), "load_avg_1min": load})
                finally:
                    shutil.rmtree(home, ignore_errors=True)
        for workers, rs in runs.items():
            wall = statistics.median(r["wall_s"] for r in rs)
            cpu = statistics.median(r["cpu_s"] for r in rs)
            rows.append(
                {
                    "path": "streaming",
                    "files": n_files,
                    "workers": workers,
                    "records": n_rec,
                    "raw_record_mb": raw_mb,
                    "wall_s_median": wall,
                    "wall_s": [r["wall_s"] for r in rs],
                    "records_per_s": n_rec / wall,
                    "records_per_s_per_core": n_rec / wall / workers,
                    "cpu_s_median": cpu,
                    "cpu_s": [r["cpu_s"] for r in rs],
                    "records_per_cpu_s": n_rec / cpu,
                    "peak_tree_rss_mb": max(r["peak_tree_rss_mb"] for r in rs),
                    "peak_tree_rss_mb_runs": [r["peak_tree_rss_mb"] for r in rs],
                    "load_avg_1min": [r["load_avg_1min"] for r in rs],
                    "sys_cpu_s": [r["sys_cpu_s"] for r in rs],
                    "minor_faults": [r["minor_faults"] for r in rs],
                    # cores the build got: above 1 only where a second core was free for it
                    "cores_used": [r["cpu_s"] / r["wall_s"] for r in rs],
                    "build_summary": rs[-1]["stdout"].strip().splitlines(),
                }
            )
            print(_row_text(rows[-1]), flush=True)
        if n_files <= in_memory_max:
            r = _run_measured([sys.executable, "-c", _IN_MEMORY, *paths], dict(os.environ))
            rows.append(
                {
                    "path": "in-memory (before)",
                    "files": n_files,
                    "workers": 1,
                    "records": n_rec,
                    "raw_record_mb": raw_mb,
                    "wall_s_median": r["wall_s"],
                    "wall_s": [r["wall_s"]],
                    "records_per_s": n_rec / r["wall_s"],
                    "records_per_s_per_core": n_rec / r["wall_s"],
                    "cpu_s_median": r["cpu_s"],
                    "records_per_cpu_s": n_rec / r["cpu_s"],
                    "peak_tree_rss_mb": r["peak_tree_rss_mb"],
                }
            )
            print(_row_text(rows[-1]), flush=True)
    stages = {}
    home = Path(tempfile.mkdtemp(prefix="perception-bench-home-"))
    try:
        for workers in sorted({1, cores}):
            stages[f"workers_{workers}"] = stage_cpu(
                [str(p) for p in files[: max(sets)]],
                workers,
                {**os.environ, "PERCEPTION_HOME": str(home / str(workers))},
            )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {
        "n_records_per_file": n_records,
        "records_per_interval": PER_INTERVAL,
        "repeats": repeats,
        "cores": cores,
        "rows": rows,
        "stage_cpu_s_largest_set": stages,
        "targets": _targets(rows, cores),
    }


def _targets(rows: list[dict], cores: int) -> dict:
    stream = [r for r in rows if r["path"] == "streaming"]
    by = {(r["files"], r["workers"]): r for r in stream}
    sets = sorted({r["files"] for r in stream})
    few, many = sets[0], sets[-1]
    out = {}
    for w in sorted({r["workers"] for r in stream}):
        ratio = by[(many, w)]["peak_tree_rss_mb"] / by[(few, w)]["peak_tree_rss_mb"]
        out[f"rss_{many}_over_{few}_files_workers{w}"] = {"value": ratio, "target": "<= 1.25", "met": ratio <= 1.25}
        if w > 1 and len(sets) > 2:  # one file is read by one reader whatever data.workers says
            mid = sets[-2]
            ratio = by[(many, w)]["peak_tree_rss_mb"] / by[(mid, w)]["peak_tree_rss_mb"]
            out[f"rss_{many}_over_{mid}_files_workers{w}"] = {
                "value": ratio,
                "target": "<= 1.25 (growth with files)",
                "met": ratio <= 1.25,
            }
    per_core = min(r["records_per_s_per_core"] for r in stream if r["files"] == many)
    out["records_per_s_per_core_min"] = {"value": per_core, "target": ">= 1e6 (wall)", "met": per_core >= 1e6}
    per_cpu = min(r["records_per_cpu_s"] for r in stream if r["files"] == many)
    out["records_per_cpu_s_min"] = {
        "value": per_cpu,
        "target": ">= 1e6 (CPU time, start-up included)",
        "met": per_cpu >= 1e6,
    }
    if cores > 1:
        speedup = by[(many, 1)]["wall_s_median"] / by[(many, cores)]["wall_s_median"]
        out[f"speedup_{cores}_workers_{many}_files"] = {"value": speedup, "target": ">= 1.6", "met": speedup >= 1.6}
        used = statistics.median(by[(many, cores)]["cores_used"])
        out[f"cores_used_{cores}_workers_{many}_files"] = {
            "value": used,
            "target": f"CPU-s / wall-s: up to ~{cores} on an idle machine (the speedup cannot "
            "exceed what the machine gave)",
            "met": used > 1.5,
        }
    return out


def _row_text(r: dict) -> str:
    return (
        f"{r['path']:20s} {r['files']:>5d} {r['workers']:>7d} {r['records'] / 1e6:>9.1f} "
        f"{r['wall_s_median']:>8.1f} {r['records_per_s'] / 1e6:>9.2f} {r['records_per_s_per_core'] / 1e6:>9.2f} "
        f"{r['cpu_s_median']:>7.1f} {r['records_per_cpu_s'] / 1e6:>9.2f} {r['peak_tree_rss_mb']:>9.0f}"
    )


EQUALITY_RESULTS = Path(__file__).parent / "results" / "data_pipeline_files_equality.json"


def check_equality(folder: Path, n_files: int, n_records: int) -> dict:
    """The streamed build (1 worker and all cores) against the whole-array build, byte for byte."""
    from perception.data.config import DataSource
    from perception.data.dataset import _build, build_in_memory

    paths = [str(p) for p in dense_files(folder, n_files, n_records)]
    cfg = DataConfig(source=DataSource.dbn, paths=paths, cache=False, **PROD)
    oracle = build_in_memory(cfg)
    out = {"files": n_files, "records": n_files * n_records, "snapshots": len(oracle)}
    for workers in sorted({1, os.cpu_count() or 1}):
        ds = _build(DataConfig(**{**cfg.__dict__, "workers": workers}), "", progress=False)
        same = {
            name: np.asarray(getattr(ds, name)).tobytes() == np.asarray(getattr(oracle, name)).tobytes()
            for name in ("features", "dt", "y", "mask", "segment")
        }
        same["drop_counts"] = ds.drop_counts == oracle.drop_counts
        out[f"workers_{workers}_bit_identical"] = same
        print(
            f"{n_files} files, data.workers={workers}: "
            + ", ".join(f"{k} {'==' if v else '!='}" for k, v in same.items()),
            flush=True,
        )
    return out


def main_files(args) -> None:
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    print(
        f"{'path':20s} {'files':>5s} {'workers':>7s} {'M rec':>9s} {'wall s':>8s} {'M rec/s':>9s} "
        f"{'/core':>9s} {'cpu s':>7s} {'M/cpu-s':>9s} {'peak MB':>9s}",
        flush=True,
    )
    res = {"machine": machine, "load_avg_1min_at_start": os.getloadavg()[0]}
    res.update(
        bench_files(
            Path(args.dense_dir), [int(s) for s in args.sets.split(",")], args.records, args.repeats, args.in_memory_max
        )
    )
    res["load_avg_1min_at_end"] = os.getloadavg()[0]
    print(
        f"\nmachine: {machine}  (medians of {args.repeats}; peak RSS is the max over repeats of the "
        f"whole process tree; 1-min load average {res['load_avg_1min_at_start']:.1f} -> "
        f"{res['load_avg_1min_at_end']:.1f})"
    )
    for name, t in res["targets"].items():
        print(f"  {name}: {t['value']:.3g} (target {t['target']}: {'met' if t['met'] else 'NOT met'})")
    print(f"\nCPU seconds by stage, {max(r['files'] for r in res['rows'])} files (one build each):")
    for workers, st in res["stage_cpu_s_largest_set"].items():
        parts = ", ".join(f"{k} {v:.2f}" for k, v in st["cpu_s"].items())
        print(f"  {workers}: {st['process_cpu_s']:.2f} CPU-s in {st['wall_s']:.2f} s wall: {parts}")
    FILES_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    FILES_RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nwrote {FILES_RESULTS}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gather-repeats", type=int, default=15)
    ap.add_argument("--files", action="store_true", help="dense multi-file DBN builds only")
    ap.add_argument("--dense-dir", default=os.path.join(tempfile.gettempdir(), "perception-dense"))
    ap.add_argument("--sets", default="1,4,16", help="numbers of files per build")
    ap.add_argument("--records", type=int, default=1_600_000, help="records per dense file")
    ap.add_argument("--in-memory-max", type=int, default=1, help="largest set also built whole in memory")
    ap.add_argument(
        "--equality",
        type=int,
        default=0,
        metavar="N",
        help="compare the streamed and whole-array builds of N dense files, byte for byte",
    )
    args = ap.parse_args()
    if args.equality:
        res = {
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            **check_equality(Path(args.dense_dir), args.equality, args.records),
        }
        EQUALITY_RESULTS.write_text(json.dumps(res, indent=1) + "\n")
        return print(f"wrote {EQUALITY_RESULTS}")
    if args.files:
        return main_files(args)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    res: dict = {
        "machine": machine,
        "numpy": np.__version__,
        "torch": torch.__version__,
        "load_avg_1min_at_start": os.getloadavg()[0],
    }  # a shared machine inflates times
    with tempfile.TemporaryDirectory(prefix="perception-bench-") as tmp:
        tmp = Path(tmp)
        torch.set_num_threads(1)
        res["synthetic_1M_1core"] = bench_synthetic(1_000_000, args.repeats)
        res["synthetic_2M_1core"] = bench_synthetic(2_000_000, args.repeats)
        res["dbn_1M_records"] = bench_dbn(1_000_000, args.repeats, compress=False, tmp=tmp)
        res["dbn_zst_1M_records"] = bench_dbn(1_000_000, args.repeats, compress=True, tmp=tmp)
        torch.set_num_threads(min(2, os.cpu_count() or 1))
        res["gather_B64_K6000"] = bench_gather(400_000, 64, args.gather_repeats, tmp / "home")

    res["load_avg_1min_at_end"] = os.getloadavg()[0]
    s1, s2 = res["synthetic_1M_1core"], res["synthetic_2M_1core"]
    d, z, g = res["dbn_1M_records"], res["dbn_zst_1M_records"], res["gather_B64_K6000"]
    rows = [
        (
            "synthetic 1M snapshots, 1 core",
            f"{s1['seconds']:.2f} s",
            f"{s1['snapshots_per_s'] / 1e6:.2f} M snap/s",
            "< 10 s",
        ),
        (
            "synthetic 2M snapshots, 1 core",
            f"{s2['seconds']:.2f} s",
            f"{s2['snapshots_per_s'] / 1e6:.2f} M snap/s",
            "< 30 s",
        ),
        ("DBN decode, 1M records (.dbn)", f"{d['decode_s']:.3f} s", f"{d['records_per_s'] / 1e6:.1f} M rec/s", ""),
        (
            "  + 1 s clock + features",
            f"{d['snapshot_clock_s'] + d['features_s']:.2f} s",
            f"{d['end_to_end_records_per_s'] / 1e6:.2f} M rec/s",
            "",
        ),
        ("DBN decode, 1M records (.dbn.zst)", f"{z['decode_s']:.3f} s", f"{z['records_per_s'] / 1e6:.1f} M rec/s", ""),
        ("gather B=64 K=6000 F=65, 2 threads", f"{g['median_ms']:.1f} ms", f"{g['batch_mb']:.0f} MB/batch", "< 50 ms"),
    ]
    print(
        f"\nmachine: {machine}  (medians; 1-min load average {res['load_avg_1min_at_start']:.1f} "
        f"-> {res['load_avg_1min_at_end']:.1f})"
    )
    print(f"{'measurement':38s} {'time':>10s} {'rate':>16s} {'target':>8s}")
    for r in rows:
        print(f"{r[0]:38s} {r[1]:>10s} {r[2]:>16s} {r[3]:>8s}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()

"""Data pipeline speed: synthetic books, DBN decode, window gather.

    python benchmarks/data_pipeline.py [--repeats 3]

Prints a table and writes benchmarks/results/data_pipeline.json. Targets (issue "Speed"):
synthetic >= 1M snapshots in < 10 s on one core, 2M (production) in < 30 s; batch gather for
B=64, K=6000 with the default features < 50 ms on 2 cores.
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
from perception.data.dbn_io import read_mbp10, write_mbp10
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
    return {"records": len(rec), "file_mb": path.stat().st_size / 1e6, "decode_s": decode,
            "records_per_s": len(rec) / decode, "snapshot_clock_s": clock, "features_s": feats,
            "snapshots": len(out), "end_to_end_records_per_s": len(rec) / (decode + clock + feats)}


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
    return {"B": batch, "K": PROD["window"], "F": ds.features.shape[1], "batch_mb": x_mb,
            "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
            "memory_mapped": isinstance(ds.features, np.memmap), "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gather-repeats", type=int, default=15)
    args = ap.parse_args()
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    res: dict = {"machine": machine, "numpy": np.__version__, "torch": torch.__version__,
                 "load_avg_1min_at_start": os.getloadavg()[0]}  # a shared machine inflates times
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
        ("synthetic 1M snapshots, 1 core", f"{s1['seconds']:.2f} s", f"{s1['snapshots_per_s'] / 1e6:.2f} M snap/s", "< 10 s"),
        ("synthetic 2M snapshots, 1 core", f"{s2['seconds']:.2f} s", f"{s2['snapshots_per_s'] / 1e6:.2f} M snap/s", "< 30 s"),
        ("DBN decode, 1M records (.dbn)", f"{d['decode_s']:.3f} s", f"{d['records_per_s'] / 1e6:.1f} M rec/s", ""),
        ("  + 1 s clock + features", f"{d['snapshot_clock_s'] + d['features_s']:.2f} s", f"{d['end_to_end_records_per_s'] / 1e6:.2f} M rec/s", ""),
        ("DBN decode, 1M records (.dbn.zst)", f"{z['decode_s']:.3f} s", f"{z['records_per_s'] / 1e6:.1f} M rec/s", ""),
        ("gather B=64 K=6000 F=65, 2 threads", f"{g['median_ms']:.1f} ms", f"{g['batch_mb']:.0f} MB/batch", "< 50 ms"),
    ]
    print(f"\nmachine: {machine}  (medians; 1-min load average {res['load_avg_1min_at_start']:.1f} "
          f"-> {res['load_avg_1min_at_end']:.1f})")
    print(f"{'measurement':38s} {'time':>10s} {'rate':>16s} {'target':>8s}")
    for r in rows:
        print(f"{r[0]:38s} {r[1]:>10s} {r[2]:>16s} {r[3]:>8s}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()

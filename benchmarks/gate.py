"""Gate speed (DESIGN §7): 6 runs x 30,000 validation windows decided in under 60 s on 2 cores.

Builds a production-shaped sweep (K = 6000, stride 50, horizons 30 ... 6000, 2,000 resamples) in a
local MLflow store under /tmp, then times `run_gate` end to end (read runs, download predictions,
bootstrap every fold x horizon, DeLong, report, gate run). Prints a table; writes
benchmarks/results/gate.json.

    python benchmarks/gate.py [--windows 30000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # perception.testing logs runs exactly as the trainings do

from perception.gate.run import run_gate  # noqa: E402
from perception.testing.sweep_store import SweepSpec, build_sweep, new_store  # noqa: E402

HORIZONS = [30, 100, 300, 1000, 6000]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=30_000, help="validation windows per run")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        uri, client = new_store(Path(tmp) / "store")
        spec = SweepSpec(
            mu_a=[0.3] * 5,
            mu_b=[0.3, 0.3, 0.32, 0.33, 0.35],
            horizons=HORIZONS,
            n_windows=args.windows,
            window=6000,
            stride=50,
            epochs=3,
        )
        t0 = time.perf_counter()
        build_sweep(client, "bench", spec)
        build_s = time.perf_counter() - t0
        times, outcome = [], None
        for r in range(args.repeats):
            t0 = time.perf_counter()
            outcome = run_gate(
                "bench", tracking_uri=uri, config_name="default", out_dir=Path(tmp) / f"out{r}", progress=True
            )
            times.append(time.perf_counter() - t0)

    s = outcome.summary
    result = {
        "what": "run_gate end to end: 6 runs, production params (K 6000, stride 50, horizons 30..6000)",
        "windows_per_run": args.windows,
        "n_bootstrap": s["config"]["n_bootstrap"],
        "block_len_windows": s["block_len_windows"],
        "bootstraps": 3 * len(HORIZONS),
        "seconds": times,
        "median_s": statistics.median(times),
        "target_s": 60.0,
        "decision": outcome.decision,
        "W": s["W"],
        "p": s["p"],
        "store_build_s": build_s,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
    }
    print()
    print("| windows/run | resamples | block (windows) | runs of run_gate (s) | median (s) | target (s) |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.windows} | {result['n_bootstrap']} | {result['block_len_windows']} | "
        f"{', '.join(f'{t:.1f}' for t in times)} | {result['median_s']:.1f} | 60 |"
    )
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, load average at end {os.getloadavg()[0]:.1f}")
    out = REPO / "benchmarks" / "results" / "gate.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""What the feature cache's key costs per input file (perception/data/digests.py): the first sight of a
file reads it whole for its sha256; every later one (a training pod, a re-run) is a stat and a memo
lookup. Medians over repeats, on a file of random bytes.

    PYTHONPATH=. python3 benchmarks/input_digests.py [--mb 256] [--repeats 5] [--out
    benchmarks/results/input_digests.json]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perception.atomic import atomic_write_text  # noqa: E402
from perception.data.digests import DigestMemo  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="the input file's size in MB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/input_digests.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="input-digests-") as tmp:
        data = Path(tmp) / "input.dbn"
        with open(data, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        memo_file = Path(tmp) / "memo.json"

        def first_sight():  # a fresh memo: the file is read whole
            memo_file.unlink(missing_ok=True)
            memo = DigestMemo(memo_file)
            memo.digest(data)
            memo.save()

        cold = timed(first_sight, args.repeats)
        hit = timed(lambda: DigestMemo(memo_file).digest(data), max(args.repeats, 50))

    size = args.mb * (1 << 20)
    rows = {
        "first sight (sha256 of every byte)": statistics.median(cold),
        "memo hit (stat + lookup)": statistics.median(hit),
    }
    print(f"{'case':<38} {'median s':>10} {'MB/s':>10}")
    for name, s in rows.items():
        print(f"{name:<38} {s:>10.4f} {size / 1e6 / s:>10.0f}")
    result = {
        "machine": {
            "host": platform.node(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_1min": os.getloadavg()[0],
        },
        "file_mb": args.mb,
        "repeats": args.repeats,
        "first_sight_s": cold,
        "memo_hit_s": hit,
        "median_first_sight_s": rows["first sight (sha256 of every byte)"],
        "median_memo_hit_s": rows["memo hit (stat + lookup)"],
        "first_sight_mb_per_s": size / 1e6 / rows["first sight (sha256 of every byte)"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

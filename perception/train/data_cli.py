"""`perception-data build [overrides]`: fill the feature cache with the training config's data.

It lives beside `perception-train` because it composes the same Hydra config (so
`experiment=ci data.n_snapshots=...` work) through `perception.train.compose`, and prints the data_hash,
cache path, T, F, the dropped records by reason and, for DBN files, the records read, the instruments
used with their dates and record counts, and the peak memory.
Exit codes: 0 ok, 1 unusable data, 2 usage or config error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from perception.errors import ConfigError, DataError
from perception.exits import exit_code

PROG = "perception-data"


def build(overrides: Sequence[str], progress: bool = True) -> dict:
    from perception.data.dataset import load_dataset
    from perception.data.file_clock import peak_rss_mb
    from perception.data.ingest import tune_malloc
    from perception.train.compose import composed

    tune_malloc()  # this process only builds
    cfg = composed(overrides).data  # the `data` part of the config `perception-train` would run with
    if not cfg.cache:
        raise ConfigError("data.cache=false: `perception-data build` fills the cache; drop the override")
    ds = load_dataset(cfg, progress=progress, map_features=True)
    return {
        "data_hash": ds.data_hash,
        "cache": str(ds.cache_path),
        "T": len(ds),
        "F": len(ds.feature_names),
        "drop_counts": ds.drop_counts,
        "summary": ds.summary,
        "peak_rss_mb": peak_rss_mb(),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build (or reuse) the feature cache")
    p_build.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=ci")
    p_build.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)  # exits 2 on a usage error
    try:
        info = build(args.overrides, progress=not args.no_progress)
    except (ConfigError, DataError) as e:
        return exit_code(e, PROG, labels={DataError: "data error"})
    print(f"data_hash: {info['data_hash']}")
    print(f"cache:     {info['cache']}")
    print(f"T:         {info['T']}")
    print(f"F:         {info['F']}")
    drops = info["drop_counts"]
    print("dropped:   " + (", ".join(f"{k}={v}" for k, v in drops.items()) if drops else "none"))
    summary = info["summary"]
    if summary:
        print(
            f"records:   {summary['records_read']} read from {summary['files']} files, "
            f"{summary['snapshots']} snapshots in {summary['segments']} segments "
            f"({summary['rolls']} instrument changes)"
        )
        for row in summary["instruments"]:
            names = ",".join(row["symbols"]) or "-"
            print(
                f"  instrument {row['instrument_id']} ({names}): {row['records']} records, "
                f"{row['first']} .. {row['last']}, {row['files']} files"
            )
        for path in summary.get("files_read_whole", []):
            print(f"  {path}: records out of order by more than a chunk; read whole")
    print(f"peak RSS:  {info['peak_rss_mb']:.0f} MB (the file readers are threads of this process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

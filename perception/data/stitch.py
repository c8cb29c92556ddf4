"""Per-file states (file_clock.py) -> one clock over all files: order, checks, segments, rows.

Files are put in time order by their first record; two files whose record times overlap are refused
(merging them would need both in memory at once, and an overlap usually means the same day twice).
Each clock interval keeps its last state across file boundaries, and a new segment starts after a
gap longer than `max_gap`, at a book clear, or where the instrument changes (a contract roll: prices
jump between contracts, so no window or label may cross it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

import numpy as np

from perception.data.book import NS, Snapshots
from perception.data.config import DataConfig
from perception.data.file_clock import FilePart, read_spill
from perception.errors import DataError


@dataclass
class Clock:
    """The kept states of all files on one clock; their book rows stay in the spill files."""
    parts: list[FilePart]  # in time order
    rows: list[np.ndarray]  # per part: indices of its spilled states that are kept
    ts: np.ndarray  # (T,) int64 interval start
    dt: np.ndarray  # (T,) float32
    segment: np.ndarray  # (T,) int32
    counts: Counter
    summary: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ts)

    def snapshots(self, start: int = 0, stop: Optional[int] = None) -> Snapshots:
        """Rows [start, stop) as Snapshots, read from the spill files."""
        stop = len(self) if stop is None else stop
        books, offset = [], 0
        for part, rows in zip(self.parts, self.rows):
            lo, hi = max(start - offset, 0), min(stop - offset, len(rows))
            if lo < hi:
                spill = read_spill(part.job.spill, "book")
                books.append(np.array(spill[rows[lo:hi]]))
                del spill  # unmapped: its pages leave this process's resident set
            offset += len(rows)
            if offset >= stop:
                break
        from perception.data.file_clock import BOOK_DTYPE

        book = np.concatenate(books) if books else np.zeros(0, BOOK_DTYPE)
        return Snapshots(ts=self.ts[start:stop], bid_px=book["bid_px"], ask_px=book["ask_px"],
                         bid_sz=book["bid_sz"], ask_sz=book["ask_sz"], bid_ct=book["bid_ct"],
                         ask_ct=book["ask_ct"], dt=self.dt[start:stop], segment=self.segment[start:stop])


def stitch(cfg: DataConfig, parts: list[FilePart], names: str) -> Clock:
    parts = _in_time_order(parts)
    counts: Counter = Counter()
    for p in parts:
        counts.update(p.counts)
    _check_instruments(cfg, parts, names)
    ts_all = np.concatenate([read_spill(p.job.spill, "ts", mmap=False) for p in parts])
    inst_all = np.concatenate([read_spill(p.job.spill, "inst", mmap=False) for p in parts])
    clear_ts = np.concatenate([p.clear_ts for p in parts])
    interval_ns = int(round(cfg.snapshot_interval * NS))

    tick = ts_all // interval_ns
    keep = np.r_[tick[1:] != tick[:-1], True] if len(tick) else np.zeros(0, bool)
    tick, state_ts, inst = tick[keep], ts_all[keep], inst_all[keep]
    steps = np.diff(tick)
    n_clears = np.searchsorted(clear_ts, state_ts, side="right")
    roll = inst[1:] != inst[:-1]
    new_seg = np.r_[True, (steps * cfg.snapshot_interval > cfg.max_gap) | (np.diff(n_clears) > 0) | roll]
    dt = np.r_[cfg.snapshot_interval, steps * cfg.snapshot_interval].astype(np.float32)
    dt[new_seg] = cfg.snapshot_interval
    bounds = np.cumsum([0] + [p.n_states for p in parts])
    rows = [np.flatnonzero(keep[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    clock = Clock(parts, rows, tick * interval_ns, dt, (np.cumsum(new_seg) - 1).astype(np.int32), counts)
    clock.summary = _summary(parts, clock, int(np.count_nonzero(roll)))
    return clock


def _in_time_order(parts: list[FilePart]) -> list[FilePart]:
    parts = sorted(parts, key=lambda p: p.job.index)  # data.paths order: the same message whichever reader ends first
    first = parts[0]
    for p in parts[1:]:
        if p.dataset != first.dataset:
            raise DataError(
                f"{p.job.path}: dataset {p.dataset!r} differs from {first.dataset!r} of "
                f"{first.job.path}; data.paths must name files of one dataset"
            )
    parts = sorted(parts, key=lambda p: (p.first_ts, p.job.index))
    for a, b in zip(parts, parts[1:]):
        if b.first_ts < a.last_ts:
            raise DataError(
                f"{b.job.path} overlaps {a.job.path}: its records start at {_iso(b.first_ts)}, before "
                f"the other file's end at {_iso(a.last_ts)}; remove the duplicate day or split the files "
                "so their record times do not overlap"
            )
    return parts


def _check_instruments(cfg: DataConfig, parts: list[FilePart], names: str) -> None:
    ids = sorted(set().union(*(p.ids_seen for p in parts)))
    symbols = sorted({s for p in parts for syms in p.symbols.values() for s in syms})
    if cfg.instrument is None and len(ids) > 1:
        raise DataError(
            f"{names}: {len(ids)} instruments present ({ids[:10]}; symbols {symbols[:10]}); "
            "choose one with data.instrument=<id or symbol>"
        )
    if cfg.instrument is not None and not any(p.used for p in parts):
        raise DataError(
            f"{names}: data.instrument={str(cfg.instrument)!r} is not in the files (instrument ids "
            f"{ids[:10]}, symbols {symbols[:10]})"
        )


def _summary(parts: list[FilePart], clock: Clock, rolls: int) -> dict:
    used: dict[int, dict] = {}
    for p in parts:
        for inst, u in p.used.items():
            row = used.setdefault(inst, {"instrument_id": inst, "symbols": [], "records": 0,
                                         "first": u.first_ts, "last": u.last_ts, "files": 0})
            row["records"] += u.records
            row["first"], row["last"] = min(row["first"], u.first_ts), max(row["last"], u.last_ts)
            row["files"] += 1
            row["symbols"] = sorted(set(row["symbols"]) | set(p.symbols.get(inst, [])))
    instruments = sorted(used.values(), key=lambda r: r["first"])
    for row in instruments:
        row["first"], row["last"] = _iso(row["first"]), _iso(row["last"])
    return {"files": len(parts), "records_read": int(sum(p.records_read for p in parts)),
            "snapshots": len(clock), "segments": int(clock.segment[-1]) + 1 if len(clock) else 0,
            "rolls": rolls, "instruments": instruments,
            "files_read_whole": [p.job.path for p in parts if p.read_whole],
            "reader_peak_rss_mb": round(max(p.reader_peak_rss_mb for p in parts), 1)}


def _iso(ts_ns: int) -> str:
    return datetime.fromtimestamp(ts_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

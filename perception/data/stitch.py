"""Per-file states (file_clock.py) -> one clock over all files: order, checks, segments, rows.

Files are put in time order by their first record; two files whose record times overlap are refused
(merging them would need both in memory at once, and an overlap usually means the same day twice).
Each clock interval keeps its last state across file boundaries, and a new segment starts after a
gap longer than `max_gap`, at a book clear, or where the instrument changes (a contract roll: prices
jump between contracts, so no window or label may cross it).

`Stitcher` takes the files one at a time, in time order, and settles each state as soon as no later
file can change it: a state waits only for the next state's interval (is it the last of its own?)
and, at its file's last record time, for the next file's book clears at that same time. So rows are
final while later files are still being read (assemble.py computes their features meanwhile); it
holds one file's states at a time besides the rows' Δt, segment and spill row.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

import numpy as np
from numpy.typing import DTypeLike

from perception.data.book import NS, Snapshots
from perception.data.config import DataConfig
from perception.data.file_clock import SPILL_DTYPES, FilePart, copy_records, read_spill, take
from perception.errors import DataError


class Pieces:
    """A 1-D array kept as the pieces appended to it: ranges of rows are read across pieces, and
    the whole is joined once, at the end (no spare capacity, no copy while it grows)."""

    def __init__(self, dtype: DTypeLike) -> None:
        self.dtype = np.dtype(dtype)
        self._pieces: list[np.ndarray] = []
        self._starts = [0]

    def __len__(self) -> int:
        return self._starts[-1]

    def extend(self, values: np.ndarray) -> None:
        if len(values):
            self._pieces.append(np.asarray(values, self.dtype))
            self._starts.append(len(self) + len(values))

    def rows(self, start: int, stop: int) -> np.ndarray:
        out, i = [], max(bisect_right(self._starts, start) - 1, 0)
        while start < stop and i < len(self._pieces):
            lo, hi = start - self._starts[i], min(stop - self._starts[i], len(self._pieces[i]))
            out.append(self._pieces[i][lo:hi])
            start, i = self._starts[i] + hi, i + 1
        return out[0] if len(out) == 1 else np.concatenate(out) if out else np.zeros(0, self.dtype)

    def array(self) -> np.ndarray:
        """The whole, joined (and kept as one piece)."""
        whole = self.rows(0, len(self))
        self._pieces, self._starts = ([whole], [0, len(whole)]) if len(whole) else ([], [0])
        return whole


@dataclass
class _Run:
    """Consecutive kept rows of one file: rows [start, start + len(spill_rows)) of the clock."""

    start: int
    part: FilePart
    spill_rows: np.ndarray  # (n,) int32, increasing


@dataclass
class Clock:
    """The kept states of all files on one clock; their times and book rows stay in the spills."""

    parts: list[FilePart]  # in time order
    runs: list[_Run]
    interval_ns: int
    dt: np.ndarray  # (T,) float32
    segment: np.ndarray  # (T,) int32
    counts: Counter
    summary: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.dt)

    @property
    def ts(self) -> np.ndarray:
        """(T,) int64 interval starts, read from the spills."""
        return read_ts(self.runs, 0, len(self), self.interval_ns)

    def books(self, start: int, stop: int) -> np.ndarray:
        """(stop - start,) BOOK_DTYPE rows, read from the spill files."""
        return read_rows(self.runs, start, stop, "book")

    def snapshots(self, start: int = 0, stop: Optional[int] = None) -> Snapshots:
        """Rows [start, stop) as Snapshots, read from the spill files."""
        stop = len(self) if stop is None else stop
        return _snapshots(
            self.books(start, stop),
            read_ts(self.runs, start, stop, self.interval_ns),
            self.dt[start:stop],
            self.segment[start:stop],
        )


def _snapshots(book: np.ndarray, ts: np.ndarray, dt: np.ndarray, segment: np.ndarray) -> Snapshots:
    return Snapshots(
        ts=ts,
        bid_px=book["bid_px"],
        ask_px=book["ask_px"],
        bid_sz=book["bid_sz"],
        ask_sz=book["ask_sz"],
        bid_ct=book["bid_ct"],
        ask_ct=book["ask_ct"],
        dt=dt,
        segment=segment,
    )


def read_ts(runs: list[_Run], start: int, stop: int, interval_ns: int) -> np.ndarray:
    """(stop - start,) int64 interval starts of clock rows [start, stop)."""
    return read_rows(runs, start, stop, "ts") // interval_ns * interval_ns


def read_rows(runs: list[_Run], start: int, stop: int, name: str) -> np.ndarray:
    """Clock rows [start, stop) of one spill ("book" or "ts"): each file's span of rows read with
    one positioned read (np.fromfile), not memory-mapped, so no page of a spill stays resident."""
    dtype = SPILL_DTYPES[name]
    out = np.empty(max(stop - start, 0), dtype)
    for run in runs[_first_run(runs, start) :]:
        if run.start >= stop:
            break
        lo, hi = max(start - run.start, 0), min(stop - run.start, len(run.spill_rows))
        if lo >= hi:
            continue
        rows = run.spill_rows[lo:hi]
        first, span = int(rows[0]), int(rows[-1] - rows[0]) + 1
        block = np.fromfile(f"{run.part.job.spill}.{name}.bin", dtype, count=span, offset=first * dtype.itemsize)
        dest = out[run.start + lo - start : run.start + hi - start]
        copy_records(dest, block if span == len(rows) else take(block, rows - first))
    return out


def _first_run(runs: list[_Run], row: int) -> int:
    lo, hi = 0, len(runs)
    while hi - lo > 1:  # the last run starting at or before `row`
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if runs[mid].start <= row else (lo, mid)
    return lo


_STATE_FIELDS = ("tick", "ts", "inst", "part", "row")


@dataclass
class _States:
    """Spilled states in time order, not yet settled."""

    tick: np.ndarray  # (n,) int64 clock interval
    ts: np.ndarray  # (n,) int64 state time
    inst: np.ndarray  # (n,) uint32
    part: np.ndarray  # (n,) int32 position in Stitcher.parts
    row: np.ndarray  # (n,) int32 spill row

    def __len__(self) -> int:
        return len(self.tick)

    def cut(self, k: int) -> tuple["_States", "_States"]:
        cols = [getattr(self, n) for n in _STATE_FIELDS]
        return _States(*(c[:k] for c in cols)), _States(*(c[k:] for c in cols))

    @staticmethod
    def join(a: "_States", b: "_States") -> "_States":
        return _States(*(np.concatenate([getattr(a, n), getattr(b, n)]) for n in _STATE_FIELDS))


class Stitcher:
    """Files in time order -> clock rows, each settled as soon as no later file can change it."""

    def __init__(self, cfg: DataConfig):
        self.interval, self.max_gap = cfg.snapshot_interval, cfg.max_gap
        self.interval_ns = int(round(cfg.snapshot_interval * NS))
        self.parts: list[FilePart] = []
        self.runs: list[_Run] = []
        self._clears: list[np.ndarray] = []
        self._clear_ts = np.zeros(0, np.int64)
        self._pending = _States(*(np.zeros(0, d) for d in (np.int64, np.int64, np.uint32, np.int32, np.int32)))
        self._last: Optional[tuple[int, int, int, int]] = None  # tick, clears, inst, segment of the last row
        self.dt, self.segment = Pieces(np.float32), Pieces(np.int32)
        self.rolls = 0

    def __len__(self) -> int:
        """Rows settled so far."""
        return len(self.dt)

    def books(self, start: int, stop: int) -> np.ndarray:
        return read_rows(self.runs, start, stop, "book")

    def snapshots(self, start: int, stop: int) -> Snapshots:
        """Settled rows [start, stop), as Clock.snapshots."""
        return _snapshots(
            self.books(start, stop),
            read_ts(self.runs, start, stop, self.interval_ns),
            self.dt.rows(start, stop),
            self.segment.rows(start, stop),
        )

    def add(self, part: FilePart) -> None:
        """The next file in time order (its first record not before the last file's last)."""
        index = len(self.parts)
        self.parts.append(part)
        if len(part.clear_ts):
            self._clears.append(part.clear_ts)
            self._clear_ts = np.concatenate(self._clears)
        ts = read_spill(part.job.spill, "ts")
        new = _States(
            ts // self.interval_ns,
            ts,
            read_spill(part.job.spill, "inst"),
            np.full(len(ts), index, np.int32),
            np.arange(len(ts), dtype=np.int32),
        )
        states = _States.join(self._pending, new)
        # a later file's clear at this file's last record time would count before a state at that time
        n = min(len(states) - 1, int(np.searchsorted(states.ts, _times(part)[1], side="left")))
        if n > 0:
            ready, self._pending = states.cut(n)
            self._settle(ready, next_tick=int(self._pending.tick[0]))
        else:
            self._pending = states

    def finish(self) -> None:
        """No file follows: the states still waiting are settled."""
        if len(self._pending):
            self._settle(self._pending, next_tick=None)
            self._pending = self._pending.cut(0)[0]

    def clock(self, counts: Counter) -> Clock:
        """The clock of every row (after `finish`)."""
        return Clock(self.parts, self.runs, self.interval_ns, self.dt.array(), self.segment.array(), counts)

    def _settle(self, s: _States, next_tick: Optional[int]) -> None:
        """Rows of states whose successor's interval is `next_tick` (None: no successor)."""
        after = np.r_[s.tick[1:], s.tick[-1] + 1 if next_tick is None else next_tick]
        keep = after != s.tick  # each interval keeps its last state
        tick, ts, inst, part, row = s.tick[keep], s.ts[keep], s.inst[keep], s.part[keep], s.row[keep]
        if not len(tick):
            return
        n_clears = np.searchsorted(self._clear_ts, ts, side="right")
        if self._last is None:  # the clock's first row: a segment start
            steps = np.diff(tick)
            roll = inst[1:] != inst[:-1]
            new_seg = np.r_[True, (steps * self.interval > self.max_gap) | (np.diff(n_clears) > 0) | roll]
            dt = np.r_[self.interval, steps * self.interval].astype(np.float32)
            base = -1
        else:  # each row against the one before it, the first against the last row settled
            last_tick, last_clears, last_inst, base = self._last
            steps = np.diff(np.r_[last_tick, tick])
            roll = np.r_[last_inst, inst[:-1]] != inst
            new_seg = (steps * self.interval > self.max_gap) | (np.diff(np.r_[last_clears, n_clears]) > 0) | roll
            dt = (steps * self.interval).astype(np.float32)
        dt[new_seg] = self.interval
        segment = (base + np.cumsum(new_seg)).astype(np.int32)
        self.rolls += int(np.count_nonzero(roll))
        self._last = (int(tick[-1]), int(n_clears[-1]), int(inst[-1]), int(segment[-1]))
        for p in np.unique(part):
            mine = part == p
            self.runs.append(_Run(len(self) + int(np.argmax(mine)), self.parts[p], row[mine]))
        self.dt.extend(dt)
        self.segment.extend(segment)


def stitch(cfg: DataConfig, parts: list[FilePart], names: str) -> Clock:
    """All files at once: checked, put in time order and stitched."""
    parts = in_time_order(parts)
    check_instruments(cfg, parts, names)
    stitcher = Stitcher(cfg)
    for p in parts:
        stitcher.add(p)
    stitcher.finish()
    return finished(stitcher, names)


def finished(stitcher: Stitcher, names: str) -> Clock:
    """The clock of a stitcher fed every file, with its counts and summary."""
    counts: Counter = Counter()
    for p in stitcher.parts:
        counts.update(p.counts)
    clock = stitcher.clock(counts)
    if len(clock) == 0:
        raise DataError(f"{names}: zero usable snapshots (dropped records by reason: {dict(counts)})")
    clock.summary = _summary(stitcher.parts, clock, stitcher.rolls)
    return clock


def follows(a: FilePart, b: FilePart) -> bool:
    """b may come right after a on the clock (what in_time_order checks)."""
    return b.dataset == a.dataset and _times(b)[0] >= _times(a)[1]


def _times(part: FilePart) -> tuple[int, int]:
    """(first, last) record time of a file read: both set, since a file without records is refused."""
    assert part.first_ts is not None and part.last_ts is not None
    return part.first_ts, part.last_ts


def in_time_order(parts: list[FilePart]) -> list[FilePart]:
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
        (b_first, _), (_, a_last) = _times(b), _times(a)
        if b_first < a_last:
            raise DataError(
                f"{b.job.path} overlaps {a.job.path}: its records start at {_iso(b_first)}, before "
                f"the other file's end at {_iso(a_last)}; remove the duplicate day or split the files "
                "so their record times do not overlap"
            )
    return parts


def check_instruments(cfg: DataConfig, parts: list[FilePart], names: str) -> None:
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
            row = used.setdefault(
                inst,
                {
                    "instrument_id": inst,
                    "symbols": [],
                    "records": 0,
                    "first": u.first_ts,
                    "last": u.last_ts,
                    "files": 0,
                },
            )
            row["records"] += u.records
            row["first"], row["last"] = min(row["first"], u.first_ts), max(row["last"], u.last_ts)
            row["files"] += 1
            row["symbols"] = sorted(set(row["symbols"]) | set(p.symbols.get(inst, [])))
    instruments = sorted(used.values(), key=lambda r: r["first"])
    for row in instruments:
        row["first"], row["last"] = _iso(row["first"]), _iso(row["last"])
    return {
        "files": len(parts),
        "records_read": int(sum(p.records_read for p in parts)),
        "snapshots": len(clock),
        "segments": int(clock.segment[-1]) + 1 if len(clock) else 0,
        "rolls": rolls,
        "instruments": instruments,
        "files_read_whole": [p.job.path for p in parts if p.read_whole],
    }


def _iso(ts_ns: int) -> str:
    return datetime.fromtimestamp(ts_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

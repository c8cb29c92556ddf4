"""One DBN file -> its complete book states, chunk by chunk, spilled to disk (DESIGN §4).

The rules are `book.snapshots_from_records`' (the in-memory oracle), applied to the file's records
in time order: per-record drop counts, and each clock interval's last valid complete state. A chunk
is sorted and emitted up to the earliest time among its last records; the records after that wait,
sorted, at the front of the one chunk buffer, and the next records are read in behind them (records
arrive slightly out of order, and a tie keeps file order). A record older
than one already emitted would change the result, so the file is then redone whole in memory.
The states (one row per interval at most) go to `<spill>.{ts,inst,book}.bin`; `stitch.py` puts the
files' states together on one clock.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from perception.data.book import levels
from perception.data.dbn_io import F_LAST, F_MAYBE_BAD_BOOK, N_LEVELS, UNDEF_PRICE
from perception.data.dbn_stream import CHUNK_RECORDS, Mbp10Stream
from perception.data.instruments import instrument_filter, symbols_of
from perception.errors import DataError

BOOK_DTYPE = np.dtype(
    [
        (f"{side}_{kind}", dt, (N_LEVELS,))
        for kind, dt in (("px", "<i8"), ("sz", "<u4"), ("ct", "<u4"))
        for side in ("bid", "ask")
    ]
)
SPILL_DTYPES: dict[str, np.dtype] = {"ts": np.dtype(np.int64), "inst": np.dtype(np.uint32), "book": BOOK_DTYPE}
SPILLS = tuple(SPILL_DTYPES)
_FIELDS = ("ts_recv", "flags", "action", "bid_px_00", "ask_px_00", "instrument_id")


@dataclass
class FileJob:
    index: int  # position in data.paths' expansion
    path: str
    spill: str  # path prefix of the spilled states
    instrument: Optional[str]
    snapshot_interval: float
    chunk_records: int = CHUNK_RECORDS


@dataclass
class InstrumentUse:
    records: int
    first_ts: int
    last_ts: int


@dataclass
class FilePart:
    """What one file gave: its states are in the spill files, the rest is here."""

    job: FileJob
    dataset: str
    records_read: int
    first_ts: Optional[int]  # record times over all the file's records (any instrument)
    last_ts: Optional[int]
    n_states: int
    counts: Counter
    clear_ts: np.ndarray  # (C,) int64, in time order
    ids_seen: set[int]
    symbols: dict[int, list[str]]  # instrument id -> the file's symbols mapping to it
    used: dict[int, InstrumentUse] = field(default_factory=dict)
    read_whole: bool = False  # records out of order by more than a chunk: read whole
    peak_buffer_bytes: int = 0  # the reader's chunk buffer and pending decompressed bytes
    max_held_records: int = 0  # records held at once: a chunk's plus those carried into it


def tail_records(chunk_records: int) -> int:
    """The last records of a chunk whose earliest time bounds what the chunk emits."""
    return max(1, min(8_192, chunk_records // 8))


def carry_cap(chunk_records: int) -> int:
    """Records carried into the next chunk at most (and fewer than the chunk: the next records are
    read in behind them); more and the file is read whole."""
    return max(4 * tail_records(chunk_records), chunk_records // 2)


class _Displaced(Exception):
    """A record older than records already emitted: the chunked order would differ."""


class _Emitter:
    """Sorted records -> states appended to the spill files; counts and clears kept."""

    def __init__(self, job: FileJob, counts: Counter):
        self.counts = counts
        self.interval_ns = int(round(job.snapshot_interval * 1_000_000_000))
        self.files = {name: open(f"{job.spill}.{name}.bin", "wb") for name in SPILLS}
        self.n_states = 0
        self.clears: list[np.ndarray] = []

    def emit(self, cols: dict[str, np.ndarray], rows) -> None:
        """`cols`: the _FIELDS of the records in time order; rows(idx) -> those records in full."""
        flags = cols["flags"]
        is_clear = cols["action"] == b"R"
        bad = (flags & F_MAYBE_BAD_BOOK) != 0
        last = (flags & F_LAST) != 0
        c = self.counts
        c["maybe_bad_book"] += int(np.count_nonzero(bad))
        c["book_clear"] += int(np.count_nonzero(is_clear & ~bad))
        c["incomplete_no_f_last"] += int(np.count_nonzero(~last & ~bad & ~is_clear))
        state = last & ~bad & ~is_clear
        bid0, ask0 = cols["bid_px_00"], cols["ask_px_00"]
        one_sided = state & ((bid0 == UNDEF_PRICE) | (ask0 == UNDEF_PRICE))
        crossed = state & ~one_sided & (bid0 >= ask0)
        c["one_sided"] += int(np.count_nonzero(one_sided))
        c["crossed_or_locked"] += int(np.count_nonzero(crossed))
        state &= ~one_sided & ~crossed
        ts = cols["ts_recv"]
        self.clears.append(ts[is_clear & ~bad].astype(np.int64))
        where = np.flatnonzero(state)
        tick = ts[where].astype(np.int64) // self.interval_ns
        where = where[np.r_[tick[1:] != tick[:-1], True]] if len(tick) else where
        st = rows(where)
        book = np.empty(len(st), BOOK_DTYPE)
        for name in BOOK_DTYPE.names or ():  # a structured dtype: its names are never None
            book[name] = levels(st, name)
        self.files["ts"].write(ts[where].astype(np.int64).data)
        self.files["inst"].write(cols["instrument_id"][where].astype(np.uint32).data)
        self.files["book"].write(book.view(np.uint8).data)
        self.n_states += len(where)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class _FileClock:
    def __init__(self, job: FileJob, counts: Counter, tail: int):
        self.job = job
        self.out = _Emitter(job, counts)
        self.counts = counts
        self.tail = tail  # records whose earliest time bounds what a chunk may emit
        self.max_emitted: Optional[int] = None
        self.run_max: Optional[int] = None  # running max of ts_recv in file order (late count)
        self.n_late = 0
        self.max_held = 0

    def add(self, block: np.ndarray, n_carried: int, final: bool) -> int:
        """`block`: the records carried from the last call (sorted) at its front, then new ones.
        Emits what no later record can precede; moves the rest, sorted, to the block's front and
        returns how many (the reader reads the next records after them: one buffer, no copies)."""
        ts_new = block["ts_recv"][n_carried:]
        if len(ts_new):
            self._count_late(ts_new)
            if self.max_emitted is not None and int(ts_new.min()) < self.max_emitted:
                raise _Displaced
        self.max_held = max(self.max_held, len(block))
        ts = block["ts_recv"]
        ordered = bool(np.all(ts[1:] >= ts[:-1]))
        order = np.arange(len(ts)) if ordered else np.argsort(ts, kind="stable")
        if final:
            n_emit = len(ts)
        elif len(ts_new):
            cutoff = ts_new[-self.tail :].min()
            n_emit = int(np.searchsorted(ts if ordered else ts[order], cutoff, side="right"))
        else:
            n_emit = 0
        if n_emit:
            emit_rows = order[:n_emit]
            emit = slice(0, n_emit) if ordered else emit_rows
            # each column gathered once out of the 368-byte records: emit reads them several times
            cols = {name: np.ascontiguousarray(block[name][emit]) for name in _FIELDS}
            self.out.emit(cols, lambda where: take(block, where if ordered else emit_rows[where]))
            self.max_emitted = int(cols["ts_recv"][-1])
        rest = len(block) - n_emit
        if rest > carry_cap(self.job.chunk_records):
            raise _Displaced
        if rest:  # numpy copies through a temporary where the two ranges overlap
            copy_records(block[:rest], block[n_emit:] if ordered else take(block, order[n_emit:]))
        return rest

    def _count_late(self, ts: np.ndarray) -> None:
        acc = np.maximum.accumulate(ts)
        if self.run_max is None:
            self.n_late += int(np.count_nonzero(ts[1:] < acc[:-1]))
        else:
            prev = np.maximum(acc[:-1], self.run_max)
            self.n_late += int(ts[0] < self.run_max) + int(np.count_nonzero(ts[1:] < prev))
        self.run_max = int(acc[-1]) if self.run_max is None else max(self.run_max, int(acc[-1]))

    def close(self) -> None:
        if self.n_late:
            self.counts["out_of_order_reordered"] += self.n_late
        self.out.close()


class Stopped(Exception):
    """The build stopped (another file failed) before this file was read."""


def extract_file(job: FileJob, stop: Optional[threading.Event] = None) -> FilePart:
    """Stream one file into its spill; a file out of order by more than a chunk is redone whole.
    `stop`, once set, ends the reading at the next chunk (Stopped)."""
    try:
        return _extract(job, whole=False, stop=stop)
    except _Displaced:
        return _extract(job, whole=True, stop=stop)


def raw(records: np.ndarray) -> np.ndarray:
    """(n, itemsize) uint8 view of contiguous records. numpy copies a structured array field by
    field, holding the GIL (~60x slower for 368-byte records); as bytes it is one memcpy per record
    and releases the GIL, so the reader threads run side by side."""
    return records.view(np.uint8).reshape(len(records), records.dtype.itemsize)


def take(records: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """records[idx], each record copied whole."""
    return np.take(raw(records), idx, axis=0).view(records.dtype).reshape(len(idx))


def copy_records(dest: np.ndarray, src: np.ndarray) -> None:
    """dest[:] = src for records of one dtype (overlapping ranges copied through a temporary)."""
    raw(dest)[:] = raw(src)


def _extract(job: FileJob, whole: bool, stop: Optional[threading.Event]) -> FilePart:
    counts: Counter = Counter()
    tail = tail_records(job.chunk_records)
    with Mbp10Stream(job.path, job.chunk_records) as stream:
        header = stream.header
        assert header is not None  # read on entering the with block
        select = instrument_filter(header, job.instrument)
        part = FilePart(
            job,
            header.dataset,
            0,
            None,
            None,
            0,
            counts,
            np.zeros(0, np.int64),
            set(),
            symbols_of(header),
            read_whole=whole,
        )
        clock = _FileClock(job, counts, tail)
        buf = stream.buffer()  # (chunk_records,): the records carried, then the next ones read
        held: list[np.ndarray] = []
        n_carried = 0
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise Stopped(job.path)
                if n_carried == len(buf):  # the carry fills the chunk: no room to read on
                    raise _Displaced
                recs = stream.read_into(buf[n_carried:])
                at_end = len(recs) < len(buf) - n_carried
                if len(recs):
                    recs = _observe(part, recs, select)
                    if whole:
                        held.append(recs.copy())
                    else:
                        n_carried = clock.add(buf[: n_carried + len(recs)], n_carried, final=False)
                if at_end:
                    break
            if part.records_read == 0:
                raise DataError(f"{job.path}: no MBP-10 records")
            last = np.concatenate(held) if whole else buf[:n_carried]
            clock.add(last, 0 if whole else n_carried, final=True)
        finally:
            clock.close()
        part.peak_buffer_bytes = stream.stats.chunk_buffer_bytes + stream.stats.max_pending_bytes
    part.n_states = clock.out.n_states
    part.max_held_records = clock.max_held
    part.clear_ts = np.concatenate(clock.out.clears) if clock.out.clears else part.clear_ts
    return part


def _observe(part: FilePart, chunk: np.ndarray, select) -> np.ndarray:
    """Record counts, times and instruments of one chunk; its records of the chosen instrument,
    moved to the chunk's front (a view of it)."""
    ts, ids = chunk["ts_recv"], chunk["instrument_id"]
    part.records_read += len(chunk)
    lo, hi = int(ts.min()), int(ts.max())
    part.first_ts = lo if part.first_ts is None else min(part.first_ts, lo)
    part.last_ts = hi if part.last_ts is None else max(part.last_ts, hi)
    part.ids_seen.update(_unique(ids))
    keep = select.keep(chunk)
    if keep is not None:
        n_other = int(np.count_nonzero(~keep))
        part.counts["other_instrument"] += n_other
        if n_other:
            kept = take(chunk, np.flatnonzero(keep))
            chunk = chunk[: len(kept)]
            copy_records(chunk, kept)
    kept_ids = chunk["instrument_id"]
    kept_insts = _unique(kept_ids)
    for inst in kept_insts:
        mine = chunk["ts_recv"] if len(kept_insts) == 1 else chunk["ts_recv"][kept_ids == inst]
        use = part.used.setdefault(inst, InstrumentUse(0, int(mine.min()), int(mine.max())))
        use.records += len(mine)
        use.first_ts, use.last_ts = min(use.first_ts, int(mine.min())), max(use.last_ts, int(mine.max()))
    return chunk


def _unique(ids: np.ndarray) -> list[int]:
    if not len(ids):
        return []
    if not (ids != ids[0]).any():
        return [int(ids[0])]
    return [int(i) for i in np.unique(ids)]


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM), its reader threads included."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_spill(prefix: str | Path, name: str) -> np.ndarray:
    """A spill file read whole ("ts", "inst"; the book rows are read in spans: stitch.read_books)."""
    return np.fromfile(f"{prefix}.{name}.bin", dtype=SPILL_DTYPES[name])

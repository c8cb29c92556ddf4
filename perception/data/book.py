"""MBP-10 records -> book snapshots on a fixed clock, in segments (DESIGN §4).

A book state is complete at a record flagged F_LAST. Each clock interval keeps its last valid
complete state; the snapshot's time is the interval's start, so Δt between snapshots is the real
clock time elapsed (a quiet interval carries the previous state: Δt grows). A gap longer than
`max_gap`, or a book clear (action R), ends a segment.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from perception.data.dbn_io import F_LAST, F_MAYBE_BAD_BOOK, N_LEVELS, UNDEF_PRICE

NS = 1_000_000_000


@dataclass
class Snapshots:
    ts: np.ndarray  # (T,) int64 ns, start of the clock interval
    bid_px: np.ndarray  # (T, 10) int64, 1e-9 units; UNDEF_PRICE where empty
    ask_px: np.ndarray  # (T, 10) int64
    bid_sz: np.ndarray  # (T, 10) uint32
    ask_sz: np.ndarray  # (T, 10) uint32
    bid_ct: np.ndarray  # (T, 10) uint32
    ask_ct: np.ndarray  # (T, 10) uint32
    dt: np.ndarray  # (T,) float32 seconds since the previous snapshot
    segment: np.ndarray  # (T,) int32

    def __len__(self) -> int:
        return len(self.ts)


def levels(records: np.ndarray, name: str) -> np.ndarray:
    """(N, 10) array of one per-level field, e.g. 'bid_px'."""
    return np.stack([records[f"{name}_{i:02d}"] for i in range(N_LEVELS)], axis=1)


def snapshots_from_records(records: np.ndarray, snapshot_interval: float, max_gap: float, counts: Counter) -> Snapshots:
    """`records` of one instrument, any order; `counts` receives dropped records by reason."""
    order = np.argsort(records["ts_recv"], kind="stable")
    ts_in = records["ts_recv"]
    n_late = int(np.count_nonzero(ts_in[1:] < np.maximum.accumulate(ts_in)[:-1])) if len(ts_in) else 0
    if n_late:
        counts["out_of_order_reordered"] += n_late

    def field(name: str) -> np.ndarray:  # one column in time order; no record copies
        return records[name][order]

    flags = field("flags")
    is_clear = field("action") == b"R"
    bad = (flags & F_MAYBE_BAD_BOOK) != 0
    last = (flags & F_LAST) != 0
    counts["maybe_bad_book"] += int(np.count_nonzero(bad))
    counts["book_clear"] += int(np.count_nonzero(is_clear & ~bad))
    counts["incomplete_no_f_last"] += int(np.count_nonzero(~last & ~bad & ~is_clear))
    state = last & ~bad & ~is_clear
    bid0, ask0 = field("bid_px_00"), field("ask_px_00")
    one_sided = state & ((bid0 == UNDEF_PRICE) | (ask0 == UNDEF_PRICE))
    crossed = state & ~one_sided & (bid0 >= ask0)
    counts["one_sided"] += int(np.count_nonzero(one_sided))
    counts["crossed_or_locked"] += int(np.count_nonzero(crossed))
    state &= ~one_sided & ~crossed

    interval_ns = int(round(snapshot_interval * NS))
    ts = field("ts_recv")
    tick = ts[state].astype(np.int64) // interval_ns
    # the last state in each interval; earlier ones in the same interval are superseded, not dropped
    keep = np.r_[tick[1:] != tick[:-1], True] if len(tick) else np.zeros(0, bool)
    tick = tick[keep]
    st = records[order[state][keep]]
    state_ts = ts[state][keep]

    steps = np.diff(tick)  # clock intervals between consecutive snapshots
    clear_ts = ts[is_clear & ~bad]
    n_clears = np.searchsorted(clear_ts, state_ts, side="right")
    new_seg = np.r_[True, (steps * snapshot_interval > max_gap) | (np.diff(n_clears) > 0)]
    dt = np.r_[snapshot_interval, steps * snapshot_interval].astype(np.float32)
    dt[new_seg] = snapshot_interval  # no previous snapshot in this segment: the nominal interval
    return Snapshots(
        ts=tick * interval_ns,
        bid_px=levels(st, "bid_px"),
        ask_px=levels(st, "ask_px"),
        bid_sz=levels(st, "bid_sz"),
        ask_sz=levels(st, "ask_sz"),
        bid_ct=levels(st, "bid_ct"),
        ask_ct=levels(st, "ask_ct"),
        dt=dt,
        segment=(np.cumsum(new_seg) - 1).astype(np.int32),
    )


def smallest_price_step(snaps: Snapshots, max_rows: int = 200_000) -> int:
    """Smallest positive difference between prices seen (1e-9 units): the tick when none is set."""
    rows = slice(0, max_rows)
    return price_step(prices_seen(snaps.bid_px[rows], snaps.ask_px[rows]))


def prices_seen(bid_px: np.ndarray, ask_px: np.ndarray) -> np.ndarray:
    """The distinct defined prices of some rows, sorted: the union over blocks is the whole's."""
    px = np.concatenate([bid_px.ravel(), ask_px.ravel()])
    return np.unique(px[px != UNDEF_PRICE])


def price_step(prices: np.ndarray) -> int:
    """Smallest positive difference between sorted distinct prices; 0 for fewer than two."""
    steps = np.diff(prices)
    steps = steps[steps > 0]
    return int(steps.min()) if len(steps) else 0

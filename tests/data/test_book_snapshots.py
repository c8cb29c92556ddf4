"""Records -> snapshots on the fixed clock: last complete state, drops by reason, gaps, clears."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from perception.data.book import NS, snapshots_from_records
from perception.data.dataset import build_snapshots
from perception.data.dbn_io import UNDEF_PRICE
from perception.data.features import FEATURE_NAMES, compute_features

from tests.data.builders import T0, TICK, dbn_config, make_records


def _snap(rec, interval=1.0, max_gap=60.0):
    counts = Counter()
    return snapshots_from_records(rec, interval, max_gap, counts), counts


def test_each_interval_keeps_its_last_complete_state():
    rec = make_records([0.1, 0.5, 0.9, 1.2], bid0_ticks=[100, 101, 102, 103])
    rec["flags"][2] = 0  # not F_LAST: the book is mid-event at 0.9 s
    snaps, counts = _snap(rec)
    assert snaps.bid_px[:, 0].tolist() == [101 * TICK, 103 * TICK]
    assert snaps.ts.tolist() == [T0, T0 + NS]
    assert counts["incomplete_no_f_last"] == 1


def test_maybe_bad_book_crossed_and_one_sided_are_dropped_and_counted():
    rec = make_records(np.arange(6) + 0.5, bid0_ticks=100)
    rec["flags"][1] |= 4  # MAYBE_BAD_BOOK
    rec["ask_px_00"][2] = rec["bid_px_00"][2]  # locked
    rec["ask_px_00"][3] = rec["bid_px_00"][3] - TICK  # crossed
    rec["bid_px_00"][4] = UNDEF_PRICE  # one-sided
    snaps, counts = _snap(rec)
    assert len(snaps) == 2
    assert counts == Counter(maybe_bad_book=1, crossed_or_locked=2, one_sided=1)
    assert snaps.dt.tolist() == [1.0, 5.0]  # the first state carried through the dropped ones


def test_gaps_up_to_max_gap_are_carried_and_longer_ones_end_a_segment():
    snaps, _ = _snap(make_records([0.5, 1.5, 31.5, 32.5, 200.5, 201.5]), max_gap=60.0)
    assert snaps.segment.tolist() == [0, 0, 0, 0, 1, 1]
    assert snaps.dt.tolist() == [1.0, 1.0, 30.0, 1.0, 1.0, 1.0]


def test_a_book_clear_ends_the_segment():
    rec = make_records([0.5, 1.5, 2.2, 2.5, 3.5])
    rec["action"][2] = b"R"
    for i in range(10):
        rec[f"bid_px_{i:02d}"][2] = rec[f"ask_px_{i:02d}"][2] = UNDEF_PRICE
    snaps, counts = _snap(rec)
    assert snaps.segment.tolist() == [0, 0, 1, 1]
    assert counts["book_clear"] == 1


def test_out_of_order_records_are_sorted_by_ts_recv():
    rec = make_records([0.5, 1.5, 2.5, 3.5], bid0_ticks=[10, 11, 12, 13])
    snaps, counts = _snap(rec[[0, 2, 1, 3]])
    assert snaps.bid_px[:, 0].tolist() == [t * TICK for t in (10, 11, 12, 13)]
    assert counts["out_of_order_reordered"] == 1


def test_several_files_are_read_in_time_order(write_dbn):
    rec = make_records(np.arange(40) + 0.3, bid0_ticks=100 + np.arange(40) % 3)
    whole = write_dbn(rec, "whole.dbn")
    late, early = write_dbn(rec[20:], "a_late.dbn"), write_dbn(rec[:20], "b_early.dbn.zst", compress=True)
    one, _, _ = build_snapshots(dbn_config([whole]), progress=False)
    two, _, _ = build_snapshots(dbn_config([late, early]), progress=False)
    for name in ("ts", "bid_px", "ask_sz", "dt", "segment"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))


def test_empty_levels_give_finite_features():
    rec = make_records([0.5, 1.5])
    for i in range(6, 10):  # a thin book: four empty levels on the ask side
        rec[f"ask_px_{i:02d}"] = UNDEF_PRICE
        rec[f"ask_sz_{i:02d}"] = 0
        rec[f"ask_ct_{i:02d}"] = 0
    snaps, _ = _snap(rec)
    feats = compute_features(snaps, TICK)
    assert np.isfinite(feats).all()
    col = FEATURE_NAMES.index
    assert feats[0, col("ask_dist_5")] == 5.5  # spread 1 tick: level 5 is 5.5 ticks from the mid
    assert feats[0, col("ask_dist_6")] == 6.5 and feats[0, col("ask_dist_9")] == 9.5
    assert feats[0, col("ask_sz_9")] == 0.0


def test_tick_size_from_config_overrides_the_inferred_step(write_dbn):
    path = write_dbn(make_records([0.5, 1.5]))
    _, tick, _ = build_snapshots(dbn_config([path]), progress=False)
    assert tick == TICK
    _, tick, _ = build_snapshots(dbn_config([path], tick_size=0.05), progress=False)
    assert tick == 50_000_000


@pytest.mark.parametrize("interval", [0.25, 5.0])
def test_snapshot_interval_sets_the_clock(interval):
    snaps, _ = _snap(make_records(np.arange(0, 20, 0.1) + 0.01), interval=interval)
    assert len(snaps) == int(20 / interval)
    assert np.all(np.diff(snaps.ts) == int(interval * NS))

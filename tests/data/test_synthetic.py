"""Synthetic books: seeded, on a tick grid, readable as a real DBN file, with a learnable signal
at both time scales (fast in the last snapshots, slow only through the whole window)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from perception.data import synthetic
from perception.data.config import DataConfig, DataSource
from perception.data.dataset import build_snapshots, load_dataset
from perception.data.dbn_io import write_mbp10
from perception.data.features import FEATURE_NAMES
from perception.data.folds import eligible_ends

SMOKE = dict(n_snapshots=40_000, window=64, window_stride=2, horizons=[5, 10, 30, 100, 300])


def test_seeded_and_deterministic():
    a = synthetic.generate(3000, 1, [2, 40], 32)
    b = synthetic.generate(3000, 1, [2, 40], 32)
    c = synthetic.generate(3000, 2, [2, 40], 32)
    np.testing.assert_array_equal(a.bid_px, b.bid_px)
    np.testing.assert_array_equal(a.ask_sz, b.ask_sz)
    assert not np.array_equal(a.bid_px, c.bid_px)


def test_books_are_well_formed_on_a_tick_grid():
    s = synthetic.generate(20_000, 0, [5, 300], 64, session=7_000)
    assert np.all(s.bid_px % synthetic.TICK == 0) and np.all(s.ask_px % synthetic.TICK == 0)
    spread = (s.ask_px[:, 0] - s.bid_px[:, 0]) // synthetic.TICK
    assert set(np.unique(spread)) == {1, 2, 3}  # spread dynamics
    assert np.all(np.diff(s.bid_px, axis=1) < 0) and np.all(np.diff(s.ask_px, axis=1) > 0)
    assert s.bid_sz.min() >= 1 and np.all(s.bid_ct <= s.bid_sz) and s.ask_ct.min() >= 1
    assert s.segment.tolist()[::7_000] == [0, 1, 2]  # a session break ends a segment
    assert len(np.unique(s.bid_px[:, 0])) > 50  # the mid moves


@pytest.mark.parametrize("compress", [False, True])
def test_written_dbn_reads_back_to_the_same_snapshots(tmp_path, compress):
    cfg = DataConfig(n_snapshots=5_000, synthetic_session=2_000, window=16, horizons=[2, 20])
    made, tick, _ = build_snapshots(cfg, progress=False)
    path = tmp_path / ("synthetic.dbn.zst" if compress else "synthetic.dbn")
    write_mbp10(path, synthetic.to_records(made), compress=compress)
    dbn_cfg = DataConfig(source=DataSource.dbn, paths=[str(path)], window=16, horizons=[2, 20], cache=False)
    read, read_tick, counts = build_snapshots(dbn_cfg, progress=False)
    assert read_tick == tick
    for name in ("ts", "bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct", "dt", "segment"):
        np.testing.assert_array_equal(getattr(read, name), getattr(made, name), err_msg=name)
    assert not any(counts.values())  # nothing dropped; superseded earlier states in an interval are not drops
    a = load_dataset(DataConfig(**{**cfg.__dict__, "cache": False}), progress=False)
    b = load_dataset(dbn_cfg, progress=False)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.y, b.y)


# ------------------------------------------------------------------ the signal


@pytest.fixture(scope="module")
def smoke_windows():
    ds = load_dataset(DataConfig(**SMOKE, cache=False), progress=False)
    K = SMOKE["window"]
    ends = eligible_ends(ds.segment, K, SMOKE["window_stride"], SMOKE["horizons"][0])
    ends = ends[ends + SMOKE["horizons"][-1] < len(ds)]
    X = ds.features.astype(np.float64)
    csum = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(X, axis=0)])
    window_mean = (csum[ends + 1] - csum[ends + 1 - K]) / K  # (N, F)
    last = X[ends]
    col = FEATURE_NAMES.index
    simple = np.c_[last, window_mean[:, [col("imbalance_l0"), col("imbalance_cum"), col("mid_logret")]]]
    return ends, last, simple, ds.y


def _auc(features, labels, ends):
    """Fit on the first 60 % of windows, score the last 30 % (a 10 % gap: no shared spans)."""
    n = len(ends)
    tr, te = slice(0, int(0.6 * n)), slice(int(0.7 * n), n)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    model.fit(features[tr], labels[tr])
    return roc_auc_score(labels[te], model.predict_proba(features[te])[:, 1])


@pytest.mark.parametrize("j", [0, 4], ids=["shortest", "longest"])
def test_window_features_predict_both_ends(smoke_windows, j):
    ends, _, simple, y = smoke_windows
    assert _auc(simple, y[ends, j], ends) > 0.55


def test_last_snapshot_alone_misses_the_slow_signal(smoke_windows):
    ends, last, _, y = smoke_windows
    assert _auc(last, y[ends, 4], ends) < 0.53
    assert _auc(last, y[ends, 0], ends) > 0.55  # the fast signal is in the last snapshot


@pytest.mark.parametrize("j", [0, 4], ids=["shortest", "longest"])
def test_shuffled_labels_carry_no_signal(smoke_windows, j):
    ends, _, simple, y = smoke_windows
    shuffled = np.random.default_rng(0).permutation(y[ends, j])
    assert abs(_auc(simple, shuffled, ends) - 0.5) <= 0.02


# ------------------------------------------------------------------ worlds with a known answer


@pytest.fixture(scope="module")
def worlds():
    out = {}
    for world in ("default", "no_signal", "per_horizon"):
        cfg = DataConfig(**SMOKE, cache=False, synthetic_world=world)
        ds = load_dataset(cfg, progress=False)
        K = SMOKE["window"]
        ends = eligible_ends(ds.segment, K, SMOKE["window_stride"], SMOKE["horizons"][0])
        ends = ends[ends + SMOKE["horizons"][-1] < len(ds)]
        X = ds.features.astype(np.float64)
        csum = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(X, axis=0)])
        window_mean = (csum[ends + 1] - csum[ends + 1 - K]) / K
        out[world] = (ends, np.c_[X[ends], window_mean], ds)
    return out


@pytest.mark.parametrize("j, tolerance", [(0, 0.02), (4, 0.04)], ids=["shortest", "longest"])
def test_no_signal_world_labels_are_unpredictable(worlds, j, tolerance):
    """Labels 300 snapshots long overlap across ~150 windows: the test set holds only ~40 independent
    outcomes at the longest horizon, hence the wider band there (the default world scores > 0.55)."""
    ends, feats, ds = worlds["no_signal"]
    assert abs(_auc(feats, ds.y[ends, j], ends) - 0.5) <= tolerance
    default_ends, default_feats, default_ds = worlds["default"]
    np.testing.assert_array_equal(ds.features, default_ds.features)  # the same books, other labels
    np.testing.assert_array_equal(ds.mask, default_ds.mask)
    assert ds.y[ds.mask[:, j], j].mean() == pytest.approx(0.5, abs=0.05)


def test_per_horizon_world_announces_the_horizons_by_separate_events():
    horizons, K, n = SMOKE["horizons"], SMOKE["window"], SMOKE["n_snapshots"]
    events = synthetic._horizon_events(np.random.default_rng([0, 0xE7E]), n, horizons, K, 0.6)
    (fast_t, fast_s), (slow_t, slow_s) = events.fast, events.slow
    assert len(fast_t) > len(slow_t) > 10 and set(np.unique(fast_s)) == {-1.0, 1.0}
    # the drifts sum the events' signed steps: before the first event's delay ends there is none,
    # and over the whole series the signs balance out to a drift of mean ~0
    assert not events.drift[: int(min(fast_t[0] + horizons[0], slow_t[0] + K // 4))].any()
    assert abs(events.drift.mean()) < 0.1 * np.abs(events.drift).max()
    snaps = synthetic.generate(n, 0, horizons, K, world="per_horizon")
    plain = synthetic.generate(n, 0, horizons, K)
    marked = np.flatnonzero((snaps.bid_sz[:, 9] != plain.bid_sz[:, 9]) | (snaps.ask_sz[:, 9] != plain.ask_sz[:, 9]))
    np.testing.assert_array_equal(marked, np.sort(fast_t))
    assert np.array_equal(snaps.bid_ct[:, 8] != plain.bid_ct[:, 8], np.isin(np.arange(n), slow_t[slow_s > 0]))


def test_world_is_part_of_the_data_hash_and_default_keeps_old_hashes():
    from perception.data.dataset import data_hash

    base = DataConfig(**SMOKE)
    assert data_hash(base) == data_hash(DataConfig(**SMOKE, synthetic_world="default"))
    assert len({data_hash(DataConfig(**SMOKE, synthetic_world=w)) for w in ("default", "no_signal", "per_horizon")}) == 3

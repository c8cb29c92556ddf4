"""Synthetic books: seeded, on a tick grid, readable as a real DBN file, with a learnable signal
at both time scales (fast in the last snapshots, slow only through the whole window)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from perception.data import horizon_jumps, synthetic
from perception.data.config import DataConfig, DataSource
from perception.data.dataset import build_snapshots, load_dataset
from perception.data.dbn_io import write_mbp10
from perception.data.features import FEATURE_NAMES, compute_labels
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


PH_HORIZONS, PH_K = [2, 5, 10, 20, 40], 32  # experiment=ci's scales


def _last_event_sides(events, kind, ends, window):
    """(N,) the side flagged by the last `kind` event inside each window ending at `ends`, 0 where none."""
    t, side = events.times[kind], events.sides[kind]
    i = np.searchsorted(t, ends, side="right") - 1
    seen = (i >= 0) & (ends - t[np.maximum(i, 0)] < window)
    return np.where(seen, side[np.maximum(i, 0)], 0.0)


@pytest.fixture(scope="module")
def per_horizon_worlds():
    """Both worlds at ci's scales, large enough that an oracle's AUC is known to ~0.01."""
    n, seed = 120_000, 3
    out = {}
    for world in ("per_horizon", "per_horizon_null"):
        snaps = synthetic.generate(n, seed, PH_HORIZONS, PH_K, world=world)
        events = synthetic._horizon_events(np.random.default_rng([seed, 0xE7E]), n, PH_HORIZONS, PH_K, 0.6,
                                           null=world == "per_horizon_null")
        y, _ = compute_labels(snaps, PH_HORIZONS)
        ends = np.arange(PH_K, n - PH_HORIZONS[-1], 4)
        sides = {kind: _last_event_sides(events, kind, ends, PH_K) for kind in events.times}
        out[world] = snaps, events, y[ends], sides
    return out


def test_per_horizon_worlds_are_seeded_and_mark_every_event():
    a = synthetic.generate(20_000, 5, PH_HORIZONS, PH_K, world="per_horizon")
    b = synthetic.generate(20_000, 5, PH_HORIZONS, PH_K, world="per_horizon")
    c = synthetic.generate(20_000, 6, PH_HORIZONS, PH_K, world="per_horizon")
    np.testing.assert_array_equal(a.bid_px, b.bid_px)
    np.testing.assert_array_equal(a.bid_ct, b.bid_ct)
    assert not np.array_equal(a.bid_px, c.bid_px)
    plain = synthetic.generate(20_000, 5, PH_HORIZONS, PH_K)
    events = synthetic._horizon_events(np.random.default_rng([5, 0xE7E]), 20_000, PH_HORIZONS, PH_K, 0.6)
    for kind, levels in synthetic.MARKER_LEVELS.items():
        t = events.times[kind]
        assert len(t) > 50 and set(np.unique(events.sides[kind])) == {-1.0, 1.0}
        for level in levels:  # the kind's markers: eight-fold counts on both sides
            np.testing.assert_array_equal(a.ask_ct[t, level], plain.ask_ct[t, level] * synthetic.MARKER_FACTOR)
        for level in synthetic.SIDE_LEVELS:  # the side: ten-fold sizes on the flagged side only
            flagged = np.where(events.sides[kind] > 0, a.bid_sz[t, level] // plain.bid_sz[t, level],
                               a.ask_sz[t, level] // plain.ask_sz[t, level])
            assert np.all(flagged == synthetic.SIDE_FACTOR)
    # events of one kind are spaced beyond their drift: at most one of each kind in a window
    for kind, pieces in synthetic.drift_pieces(PH_HORIZONS, PH_K).items():
        assert np.diff(events.times[kind]).min() > max([e for _, e, _ in pieces] + [PH_K])


def test_null_twin_has_the_same_books_but_the_sides_flagged(per_horizon_worlds):
    world, _, y, _ = per_horizon_worlds["per_horizon"]
    twin, events, y_twin, _ = per_horizon_worlds["per_horizon_null"]
    for name in ("ts", "bid_px", "ask_px", "bid_ct", "ask_ct", "dt", "segment"):
        np.testing.assert_array_equal(getattr(twin, name), getattr(world, name), err_msg=name)
    np.testing.assert_array_equal(y_twin, y)  # the same drifts, so the same labels
    differs = np.flatnonzero((twin.bid_sz != world.bid_sz).any(axis=1) | (twin.ask_sz != world.ask_sz).any(axis=1))
    all_events = np.concatenate(list(events.times.values()))
    assert np.isin(differs, all_events).all() and len(differs) > 0.3 * len(all_events)
    assert set(np.flatnonzero((twin.bid_sz != world.bid_sz).any(axis=0))) == set(synthetic.SIDE_LEVELS)  # the flag only
    for kind, signs in events.drift_signs.items():  # the twin's flags are independent of the drifts
        if signs.any():
            assert abs(np.mean(events.sides[kind] == signs) - 0.5) < 0.05


def _oracle_auc(score, labels):
    seen = score != 0
    return roc_auc_score(labels[seen], score[seen])


@pytest.mark.parametrize("world", ["per_horizon", "per_horizon_null"])
def test_each_horizon_is_decided_by_its_own_event(per_horizon_worlds, world):
    """An oracle that reads the relevant event's side: the short event decides h2..h20 and says nothing
    at h40, the long event decides h40 and not h2; the distractor decides nothing. In the twin no
    event side predicts any horizon."""
    _, _, y, sides = per_horizon_worlds[world]
    auc = {kind: [_oracle_auc(sides[kind], y[:, j]) for j in range(len(PH_HORIZONS))] for kind in sides}
    if world == "per_horizon":
        assert min(auc["short"][:4]) > 0.6 and abs(auc["short"][4] - 0.5) < 0.03
        assert auc["long"][4] > 0.72 and abs(auc["long"][0] - 0.5) < 0.03
        assert max(abs(a - 0.5) for a in auc["distractor"]) < 0.03
    else:
        assert max(abs(a - 0.5) for aucs in auc.values() for a in aucs) < 0.03


def test_one_shared_read_of_the_events_loses_the_longest_horizon(per_horizon_worlds):
    """The construction's claim: over all windows, reading the short event (what a shared query serving
    four horizons takes) leaves h40 at chance, while a per-horizon read of the long event predicts it;
    the pooled sum of every event's side (attending to all of them) is worse than either at its horizons."""
    _, _, y, sides = per_horizon_worlds["per_horizon"]
    everything = sides["short"] + sides["long"] + sides["distractor"]
    h40 = y[:, -1]
    auc_long, auc_short, auc_sum = (roc_auc_score(h40, s) for s in (sides["long"], sides["short"], everything))
    assert auc_long > 0.63 and abs(auc_short - 0.5) < 0.02 and auc_sum < auc_long - 0.03
    assert roc_auc_score(y[:, 1], everything) < roc_auc_score(y[:, 1], sides["short"]) - 0.02


def test_world_is_part_of_the_data_hash_and_default_keeps_old_hashes():
    from perception.data.dataset import data_hash

    base = DataConfig(**SMOKE)
    assert data_hash(base) == data_hash(DataConfig(**SMOKE, synthetic_world="default"))
    assert len({data_hash(DataConfig(**SMOKE, synthetic_world=w)) for w in ("default", "no_signal", "per_horizon", "per_horizon_null",
                                                                          "per_horizon_jumps", "per_horizon_jumps_null")}) == 6


@pytest.fixture(scope="module")
def jump_worlds():
    """per_horizon_jumps and its twin at ci's scales, large enough that an oracle's AUC is known to ~0.01;
    per window (stride 4), the burst it holds whole (or -1)."""
    n, seed = 120_000, 3
    out = {}
    for world in ("per_horizon_jumps", "per_horizon_jumps_null"):
        snaps = synthetic.generate(n, seed, PH_HORIZONS, PH_K, world=world)
        bursts = horizon_jumps.jump_bursts(np.random.default_rng([seed, 0x1B5]), n, PH_HORIZONS, PH_K, 0.6,
                                           null=world.endswith("_null"))
        y, _ = compute_labels(snaps, PH_HORIZONS)
        ends = np.arange(PH_K, n - PH_HORIZONS[-1], 4)
        first = np.minimum(bursts.times["short"][:, 0], bursts.times["long"][:, 0])
        last = np.maximum(bursts.times["short"][:, -1], bursts.times["long"][:, -1])
        b = np.minimum(np.searchsorted(bursts.starts, ends - PH_K + 1), len(bursts.starts) - 1)
        held = np.where((first[b] > ends - PH_K) & (last[b] <= ends), b, -1)
        out[world] = snaps, bursts, y[ends], held
    return out


def _per_window(held, per_burst):
    return np.where(held >= 0, per_burst[np.maximum(held, 0)], 0.0)


def test_jump_worlds_are_seeded_and_mark_each_set_apart(jump_worlds):
    a = synthetic.generate(20_000, 5, PH_HORIZONS, PH_K, world="per_horizon_jumps")
    b = synthetic.generate(20_000, 5, PH_HORIZONS, PH_K, world="per_horizon_jumps")
    np.testing.assert_array_equal(a.bid_px, b.bid_px)
    np.testing.assert_array_equal(a.ask_ct, b.ask_ct)
    snaps, bursts, _, _ = jump_worlds["per_horizon_jumps"]
    plain = synthetic.generate(len(snaps), 3, PH_HORIZONS, PH_K)  # the same books without the bursts
    for kind, levels in horizon_jumps.SET_LEVELS.items():
        t = bursts.times[kind].ravel()
        other = horizon_jumps.SET_LEVELS["long" if kind == "short" else "short"]
        ratio = snaps.bid_ct[t].astype(float) / plain.bid_ct[t]
        assert np.all(np.abs(ratio[:, list(levels)] - horizon_jumps.SET_FACTOR) < 1.0)  # its set's marker
        assert np.all(ratio[:, list(other)] == 1.0)  # and not the other's
        intensity = np.log(np.median(ratio[:, list(horizon_jumps.INTENSITY_LEVELS)], axis=1))
        assert np.corrcoef(intensity, bursts.intensity[kind].ravel())[0, 1] > 0.97
    assert np.all(np.diff(bursts.starts) > PH_K + horizon_jumps.burst_span(PH_K))  # one whole burst a window


def test_jump_twin_has_the_same_books_and_labels_but_the_sides(jump_worlds):
    world, _, y, _ = jump_worlds["per_horizon_jumps"]
    twin, bursts, y_twin, _ = jump_worlds["per_horizon_jumps_null"]
    for name in ("ts", "bid_px", "ask_px", "bid_ct", "ask_ct", "dt", "segment"):
        np.testing.assert_array_equal(getattr(twin, name), getattr(world, name), err_msg=name)
    np.testing.assert_array_equal(y_twin, y)
    assert set(np.flatnonzero((twin.bid_sz != world.bid_sz).any(axis=0))) == set(horizon_jumps.SIDE_LEVELS)
    for kind in ("short", "long"):
        assert abs(np.mean(bursts.strongest_sides(kind) == bursts.signs[kind]) - 0.5) < 0.03


def test_one_softmax_cannot_read_both_sets_strongest(jump_worlds):
    """The construction's claim, by oracles over every window: the short set's strongest decides h20 and
    the long set's h40; what one shared read can take (the short set's strongest, the strongest of both
    sets, a vote linear in the intensity) leaves h40 well below a per-horizon read. In the twin no side
    predicts any horizon."""
    _, bursts, y, held = jump_worlds["per_horizon_jumps"]
    short = _per_window(held, bursts.strongest_sides("short"))
    long_ = _per_window(held, bursts.strongest_sides("long"))
    both = np.concatenate([bursts.intensity["short"], bursts.intensity["long"]], axis=1)
    sides = np.concatenate([bursts.sides["short"], bursts.sides["long"]], axis=1)
    top = both.argmax(axis=1)
    union_long = _per_window(held, np.where(top >= horizon_jumps.PER_SET, sides[np.arange(len(top)), top], 0.0))
    vote_long = _per_window(held, (bursts.sides["long"] * bursts.intensity["long"]).sum(axis=1))
    h20, h40 = y[:, -2], y[:, -1]
    assert roc_auc_score(h20, short) > 0.70 and roc_auc_score(h40, long_) > 0.68
    assert abs(roc_auc_score(h20, long_) - 0.5) < 0.02
    for shared_read in (short, union_long, vote_long):
        assert roc_auc_score(h40, shared_read) < roc_auc_score(h40, long_) - 0.06
    _, twin_bursts, y_twin, held_twin = jump_worlds["per_horizon_jumps_null"]
    for kind in ("short", "long"):
        read = _per_window(held_twin, twin_bursts.strongest_sides(kind))
        assert max(abs(roc_auc_score(y_twin[:, j], read) - 0.5) for j in range(len(PH_HORIZONS))) < 0.03

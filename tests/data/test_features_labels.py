"""Features and labels from snapshots; z-scoring from training-fold snapshots only."""

from __future__ import annotations

import numpy as np

from perception.data import Normalizer, load_dataset, median_dt, purged_split
from perception.data.book import Snapshots
from perception.data.config import DataConfig
from perception.data.features import FEATURE_NAMES, compute_labels, mid2

CI = dict(n_snapshots=6000, window=32, window_stride=4, horizons=[2, 5, 10, 20, 40], cache=False)


def test_features_are_raw_float32_with_names():
    ds = load_dataset(DataConfig(**CI), progress=False)
    assert ds.features.dtype == np.float32 and ds.features.shape == (6000, len(FEATURE_NAMES))
    assert ds.feature_names == FEATURE_NAMES and 40 <= len(FEATURE_NAMES) <= 70
    assert np.isfinite(ds.features).all()
    col = FEATURE_NAMES.index
    assert set(np.unique(ds.features[:, col("spread_ticks")])) == {1.0, 2.0, 3.0}
    assert ds.dt.dtype == np.float32 and ds.segment.dtype == np.int32
    assert ds.y.dtype == np.uint8 and ds.mask.dtype == bool and ds.y.shape == (6000, 5)


def _two_segment_snaps(mids2: list[int], segment: list[int]) -> Snapshots:
    T = len(mids2)
    bid = np.asarray(mids2, np.int64)[:, None] // 2 - np.arange(10)
    ask = bid + (np.asarray(mids2)[:, None] - 2 * bid[:, :1])
    z = np.ones((T, 10), np.uint32)
    return Snapshots(np.arange(T), bid, ask, z, z, z, z, np.ones(T, np.float32), np.asarray(segment, np.int32))


def test_labels_compare_future_mid_and_mask_past_segment_end():
    m = [10, 12, 12, 8, 14, 20, 18, 30]
    seg = [0, 0, 0, 0, 0, 1, 1, 1]
    snaps = _two_segment_snaps(m, seg)
    assert mid2(snaps).tolist() == m
    y, mask = compute_labels(snaps, [1, 3])
    for t in range(8):
        for j, h in enumerate([1, 3]):
            inside = t + h < 8 and seg[t + h] == seg[t]
            assert mask[t, j] == inside
            assert y[t, j] == (inside and m[t + h] > m[t])


def test_normalizer_ignores_validation_values():
    cfg = DataConfig(**CI)
    ds = load_dataset(cfg, progress=False)
    split = purged_split(ds, cfg)
    before = Normalizer.fit(ds, split.train_ends, cfg.window)
    rows_val = np.arange(split.val_ends.min() - cfg.window + 1, split.val_ends.max() + 1)
    ds.features = ds.features.copy()
    ds.features[rows_val] = 1e6  # validation snapshots changed wholesale
    after = Normalizer.fit(ds, split.train_ends, cfg.window)
    np.testing.assert_array_equal(before.mean, after.mean)
    np.testing.assert_array_equal(before.std, after.std)
    ds.features[split.train_ends[-1]] += 100.0  # a training snapshot does move them
    moved = Normalizer.fit(ds, split.train_ends, cfg.window)
    assert not np.array_equal(before.mean, moved.mean)


def test_normalizer_matches_direct_statistics_and_median_dt():
    cfg = DataConfig(**CI)
    ds = load_dataset(cfg, progress=False)
    split = purged_split(ds, cfg)
    rows = np.unique((split.train_ends[:, None] + np.arange(-cfg.window + 1, 1)).ravel())
    norm = Normalizer.fit(ds, split.train_ends, cfg.window)
    np.testing.assert_allclose(norm.mean, ds.features[rows].astype(np.float64).mean(0), rtol=1e-5, atol=1e-6)
    std = ds.features[rows].astype(np.float64).std(0)
    np.testing.assert_allclose(norm.std, np.where(std < 1e-6, 1.0, std), rtol=1e-4, atol=1e-6)
    ds.dt = ds.dt.copy()
    ds.dt[rows[::2]] = 3.0
    assert median_dt(ds, split.train_ends, cfg.window) == float(np.median(ds.dt[rows]))

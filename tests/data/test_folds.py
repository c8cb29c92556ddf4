"""Purged K-fold with embargo (DESIGN §4), as properties over random segmentations."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perception.data import load_dataset, purged_split
from perception.data.config import DataConfig
from perception.data.folds import eligible_ends
from perception.errors import ConfigError


@st.composite
def fold_cases(draw):
    seg_lens = draw(st.lists(st.integers(1, 400), min_size=1, max_size=4))
    segment = np.repeat(np.arange(len(seg_lens)), seg_lens).astype(np.int32)
    h = sorted(draw(st.sets(st.integers(1, 60), min_size=1, max_size=4)))
    n_folds = draw(st.integers(2, 5))
    cfg = DataConfig(
        window=draw(st.integers(1, 80)),
        window_stride=draw(st.integers(1, 9)),
        horizons=h,
        n_folds=n_folds,
        fold=draw(st.integers(0, n_folds - 1)),
        embargo=draw(st.one_of(st.none(), st.integers(0, 100))),
        cache=False,
    )
    return SimpleNamespace(segment=segment), cfg


def _split_or_none(ds, cfg):
    try:
        return purged_split(ds, cfg)
    except ConfigError as e:
        msg = str(e)
        eligible = eligible_ends(ds.segment, cfg.window, cfg.window_stride, cfg.horizons[0])
        assert len(eligible) < cfg.n_folds or "no training window survives" in msg, msg
        return None


@given(fold_cases())
def test_purge_embargo_and_windows(case):
    ds, cfg = case
    split = _split_or_none(ds, cfg)
    if split is None:
        return
    K, h_max = cfg.window, cfg.horizons[-1]
    embargo = h_max if cfg.embargo is None else cfg.embargo
    tr, va = split.train_ends, split.val_ends
    assert len(tr) and len(va) and not np.intersect1d(tr, va).size
    assert np.all(np.diff(tr) > 0) and np.all(np.diff(va) > 0)
    for ends in (tr, va):  # windows inside one segment, on the stride grid
        assert np.all(ds.segment[ends - K + 1] == ds.segment[ends])
        assert np.all((ends - (K - 1)) % cfg.window_stride == 0)
    # no training span [t-K+1, t+h_max] meets any validation window's span (closed intervals)
    meets = (tr[:, None] - K + 1 <= va[None, :] + h_max) & (tr[:, None] + h_max >= va[None, :] - K + 1)
    assert not meets.any()
    # embargo: no training window starts within `embargo` snapshots after the validation span
    starts = tr - K + 1
    end = va.max() + h_max
    assert not np.any((starts > end) & (starts <= end + embargo))


@given(fold_cases())
def test_every_eligible_end_is_validated_once_in_ordered_contiguous_blocks(case):
    ds, cfg = case
    eligible = eligible_ends(ds.segment, cfg.window, cfg.window_stride, cfg.horizons[0])
    blocks = []
    for fold in range(cfg.n_folds):
        cfg.fold = fold
        split = _split_or_none(ds, cfg)
        if split is None:
            return
        blocks.append(split.val_ends)
    np.testing.assert_array_equal(np.concatenate(blocks), eligible)  # once each, in order
    for b in blocks:  # contiguous: a block is a run of consecutive eligible ends
        i = np.searchsorted(eligible, b)
        assert np.all(np.diff(i) == 1)


def test_fewer_windows_than_folds_is_a_clear_error():
    ds = SimpleNamespace(segment=np.zeros(40, np.int32))
    cfg = DataConfig(window=30, window_stride=8, horizons=[1, 5], n_folds=3)
    with pytest.raises(ConfigError, match=r"data.n_folds=3: only 2 eligible windows"):
        purged_split(ds, cfg)


@pytest.mark.parametrize(
    "override, key", [({"window": 3000}, "data.window=3000"), ({"horizons": [2, 5000]}, r"data.horizons\[-1\]=5000")]
)
def test_window_or_horizon_longer_than_the_data_is_a_clear_error(override, key):
    cfg = DataConfig(n_snapshots=2000, **{"window": 16, "horizons": [2, 20], **override}, cache=False)
    with pytest.raises(ConfigError, match=key + ".*longest segment"):
        load_dataset(cfg, progress=False)


def test_window_longer_than_every_segment_leaves_no_window():
    ds = SimpleNamespace(segment=np.repeat(np.arange(5), 50).astype(np.int32))
    cfg = DataConfig(window=60, window_stride=1, horizons=[1, 2], n_folds=2)
    with pytest.raises(ConfigError, match="only 0 eligible windows"):
        purged_split(ds, cfg)

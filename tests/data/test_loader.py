"""Window loader: gathers from one array, normalised, in a (seed, epoch)-determined order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perception.data import Normalizer, WindowLoader, load_dataset, purged_split
from perception.data import dataset as dataset_module
from tests.conftest import SMALL_BOOK

CFG = SMALL_BOOK


@pytest.fixture
def prepared(small_book):
    return small_book


def test_batches_hold_normalised_windows(prepared):
    ds, split, norm = prepared
    loader = WindowLoader(ds, split.train_ends, CFG.window, batch_size=8, normalizer=norm, seed=3)
    batch = next(loader.batches(epoch=0))
    K, F, H = CFG.window, ds.features.shape[1], len(CFG.horizons)
    assert batch.x.shape == (8, K, F) and batch.x.dtype == torch.float32
    assert batch.dt.shape == (8, K) and batch.dt.dtype == torch.float32
    assert batch.y.shape == (8, H) and batch.y.dtype == torch.float32
    assert batch.mask.shape == (8, H) and batch.mask.dtype == torch.bool
    assert batch.index.dtype == torch.int64
    for b, t in enumerate(batch.index.tolist()):
        want = (ds.features[t - K + 1 : t + 1] - norm.mean) / norm.std
        np.testing.assert_allclose(batch.x[b].numpy(), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(batch.dt[b].numpy(), ds.dt[t - K + 1 : t + 1])
        np.testing.assert_array_equal(batch.y[b].numpy(), ds.y[t])
        np.testing.assert_array_equal(batch.mask[b].numpy(), ds.mask[t])


def test_order_depends_on_seed_and_epoch_only_and_resumes(prepared):
    ds, split, norm = prepared

    def make(seed):
        return WindowLoader(ds, split.train_ends, CFG.window, 7, normalizer=norm, seed=seed)

    def idx(loader, epoch, start=0):
        return [x.index for x in loader.batches(epoch, start)]

    a, b = make(5), make(5)
    first = torch.cat(idx(a, 1))
    assert torch.equal(first, torch.cat(idx(b, 1)))
    assert not torch.equal(first, torch.cat(idx(a, 2)))
    assert not torch.equal(first, torch.cat(idx(make(6), 1)))
    assert sorted(first.tolist()) == split.train_ends.tolist()  # each window once per epoch
    assert torch.equal(torch.cat(idx(a, 1, start=3)), first[3 * 7 :])
    assert len(a) == -(-len(split.train_ends) // 7)
    assert len(idx(a, 1)[-1]) == len(split.train_ends) % 7 or len(split.train_ends) % 7 == 0


def test_unshuffled_validation_keeps_window_order(prepared):
    ds, split, _ = prepared
    loader = WindowLoader(ds, split.val_ends, CFG.window, 32, shuffle=False)
    got = torch.cat([b.index for b in loader.batches(0)])
    assert got.tolist() == split.val_ends.tolist()


def test_memory_mapped_cache_feeds_the_loader(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_module, "MMAP_BYTES", 0)
    ds = load_dataset(CFG, home=tmp_path, progress=False)
    assert isinstance(ds.features, np.memmap)
    split = purged_split(ds, CFG)
    norm = Normalizer.fit(ds, split.train_ends, CFG.window)
    batch = next(WindowLoader(ds, split.train_ends, CFG.window, 4, normalizer=norm).batches(0))
    t = int(batch.index[0])
    np.testing.assert_allclose(batch.x[0, -1].numpy(), (ds.features[t] - norm.mean) / norm.std, rtol=1e-5, atol=1e-5)
    assert np.array_equal(ds.features[t], np.load(ds.cache_path / "features.npy")[t])  # cache untouched


def test_a_batch_survives_drawing_the_next(prepared):
    ds, split, norm = prepared
    loader = WindowLoader(ds, split.train_ends, CFG.window, 5, normalizer=norm, seed=1)
    it = loader.batches(0)
    first = next(it)
    kept = first.x.clone()
    second = next(it)
    assert torch.equal(first.x, kept) and not torch.equal(second.x, kept)

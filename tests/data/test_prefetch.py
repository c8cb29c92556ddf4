"""Batches drawn ahead by a thread: the same batches in the same order, errors raised where they
belong, the thread stopped when the caller leaves early; on a GPU, the copies equal the host batches."""

from __future__ import annotations

import threading
from itertools import count, islice

import pytest
import torch

from perception.data import WindowLoader, prefetched
from tests.conftest import SMALL_BOOK

CFG = SMALL_BOOK


@pytest.fixture
def prepared(small_book):
    return small_book


def loader(prepared, pin_memory: bool = False) -> WindowLoader:
    ds, split, norm = prepared
    return WindowLoader(ds, split.train_ends, CFG.window, 7, normalizer=norm, seed=5, pin_memory=pin_memory)


def expected(prepared) -> list[dict]:
    return [{k: getattr(b, k).clone() for k in ("x", "dt", "y", "mask", "index")} for b in loader(prepared).batches(1)]


def assert_same(got: list, want: list[dict]) -> None:
    assert len(got) == len(want) > 2  # more batches than the loader's two reused buffers
    for g, w in zip(got, want):
        for key, value in w.items():
            assert torch.equal(getattr(g, key).cpu(), value), key


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "perception-prefetch"]


@pytest.mark.parametrize("ahead", [False, True])
def test_same_batches_in_the_same_order_kept_after_later_draws(prepared, ahead):
    with prefetched(loader(prepared).batches(1), torch.device("cpu"), ahead=ahead) as batches:
        got = list(batches)  # every batch held until the end: none may be overwritten by a later draw
    if ahead:
        assert_same(got, expected(prepared))
    else:  # as they are drawn: x lives in the loader's reused buffers, so compare batch by batch
        with prefetched(loader(prepared).batches(1), torch.device("cpu"), ahead=False) as batches:
            for g, w in zip(batches, expected(prepared)):
                assert all(torch.equal(getattr(g, k), v) for k, v in w.items())


def test_an_error_in_the_source_reaches_the_caller_after_the_batches_before_it(prepared):
    def failing():
        yield from islice(loader(prepared).batches(0), 2)
        raise OSError("disk went away at batch 2")

    got = []
    with pytest.raises(OSError, match="disk went away at batch 2"):
        with prefetched(failing(), torch.device("cpu"), ahead=True) as batches:
            for batch in batches:
                got.append(batch)
    assert len(got) == 2
    assert not prefetch_threads()


def test_leaving_early_stops_the_thread(prepared):
    source = loader(prepared)

    def endless():
        for epoch in count():
            yield from source.batches(epoch)

    with prefetched(endless(), torch.device("cpu"), ahead=True) as batches:
        first = next(iter(batches))
        assert prefetch_threads()
    assert first.x.shape[0] == 7
    assert not prefetch_threads()


@pytest.mark.cuda
def test_batches_on_the_gpu_equal_the_host_batches(prepared):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda")
    source = loader(prepared, pin_memory=True)
    assert next(source.batches(0)).x.is_pinned()
    with prefetched(source.batches(1), device) as batches:
        got = []
        for batch in batches:
            assert batch.x.device.type == "cuda" and batch.index.device.type == "cpu"
            torch.empty(1 << 20, device=device)  # allocator churn on the consumer's stream meanwhile
            got.append(batch)
        torch.cuda.synchronize()
    assert_same(got, expected(prepared))
    assert not prefetch_threads()


@pytest.mark.cuda
def test_training_on_prefetched_batches_equals_training_inline(prepared):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from perception.model import ModelConfig, PerceptionModel, masked_bce
    from perception.train.epoch import train_epoch

    ds = prepared[0]
    device = torch.device("cuda")

    def trained(ahead: bool) -> dict[str, torch.Tensor]:
        model = PerceptionModel(
            ModelConfig(d_model=16, ops="cuda"), n_features=ds.features.shape[1], horizons=CFG.horizons, seed=0
        ).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        with prefetched(loader(prepared, pin_memory=ahead).batches(0), device, ahead=ahead) as batches:
            totals = train_epoch(
                model, batches, opt, sched, masked_bce, precision="fp32", device=device, grad_clip=1.0, epoch=0
            )
        assert totals.steps > 2
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    inline, ahead = trained(False), trained(True)
    assert inline.keys() == ahead.keys()
    assert all(torch.equal(inline[k], ahead[k]) for k in inline)

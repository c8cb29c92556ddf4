"""Batches on the training device, drawn one step ahead on a CUDA GPU so that the step never waits for
the host: a background thread gathers the next windows (into the loader's pinned buffers) and copies
them to the GPU on a stream of its own while the current step runs. The gather and the copy release
the GIL. On the CPU the batches come as they are drawn, in the caller's thread (a thread would only
compete with the step for the same cores), unless `ahead=True` asks for the thread anyway.

    with prefetched(loader.batches(epoch), device) as batches:
        for batch in batches: ...

A batch's x, dt, y and mask are on `device`, its index stays on the host. An error in the thread is
raised in the caller at the batch it would have produced; leaving the `with` early stops the thread."""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager, nullcontext
from typing import Iterable, Iterator

import torch

from perception.data.loader import Batch

_POLL_S = 0.1  # how often a thread blocked on a full queue checks whether it was told to stop


def to_device(batch: Batch, device: torch.device, non_blocking: bool = False) -> Batch:
    return Batch(
        x=batch.x.to(device, non_blocking=non_blocking),
        dt=batch.dt.to(device, non_blocking=non_blocking),
        y=batch.y.to(device, non_blocking=non_blocking),
        mask=batch.mask.to(device, non_blocking=non_blocking),
        index=batch.index,
    )


@contextmanager
def prefetched(batches: Iterable[Batch], device: torch.device, ahead: bool | None = None) -> Iterator[Iterator[Batch]]:
    """`batches` on `device`; drawn and copied one batch ahead by a thread when `ahead` (default: on CUDA)."""
    if ahead is None:
        ahead = device.type == "cuda"
    if not ahead:
        yield (to_device(b, device) for b in batches)
        return
    worker = _Prefetcher(iter(batches), device)
    try:
        yield iter(worker)
    finally:
        worker.close()


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class _Prefetcher:
    def __init__(self, batches: Iterator[Batch], device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.queue: queue.Queue = queue.Queue(maxsize=1)  # one batch ready while the step runs
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(batches,), name="perception-prefetch", daemon=True)
        self.thread.start()

    def _run(self, batches: Iterator[Batch]) -> None:
        try:
            with self._on_copy_stream():
                for batch in batches:
                    moved = to_device(batch, self.device, non_blocking=True)
                    # the loader reuses the batch's host buffer two draws later
                    if self.stream is not None:
                        self.stream.synchronize()  # so the copy must be done
                    else:
                        moved.x = moved.x.clone()  # the caller may still read the batch before this one
                    if not self._put(moved):
                        return
            self._put(_End())
        except BaseException as error:  # raised in the consumer, which knows the run it belongs to
            self._put(_Failed(error))

    def _on_copy_stream(self):
        if self.stream is None:
            return nullcontext()
        return torch.cuda.stream(self.stream)  # the current stream is per thread: this thread's only

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Batch]:
        consumer = torch.cuda.current_stream(self.device) if self.stream is not None else None
        while True:
            item = self.queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.error
            if consumer is not None:
                for t in (item.x, item.dt, item.y, item.mask):
                    t.record_stream(consumer)  # allocated on the copy stream, freed after the consumer's use
            yield item

    def close(self) -> None:
        self.stop.set()
        self.thread.join()

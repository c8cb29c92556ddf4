"""Training statistics, the CfC time scale and the window loader.

Windows are gathers from one contiguous float32 array through a precomputed offset grid
(ends[:, None] + offsets): one fancy-indexing call per batch, never a per-sample copy loop.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

_CHUNK_ROWS = 1 << 18  # statistics pass over a memory-mapped array in row chunks


def covered_rows(n_rows: int, ends: np.ndarray, window: int) -> np.ndarray:
    """(T,) bool: rows read by at least one window [t-K+1, t] ending in `ends`."""
    diff = np.zeros(n_rows + 1, np.int64)
    np.add.at(diff, np.asarray(ends) - window + 1, 1)
    np.add.at(diff, np.asarray(ends) + 1, -1)
    return np.cumsum(diff[:-1]) > 0


@dataclass
class Normalizer:
    mean: np.ndarray  # (F,) float32
    std: np.ndarray  # (F,) float32, constant features get 1

    @classmethod
    def fit(cls, ds, train_ends: np.ndarray, window: int) -> "Normalizer":
        """z-score statistics from the snapshots the training windows read, and no others."""
        rows = covered_rows(len(ds.features), train_ends, window)
        F = ds.features.shape[1]
        s, ss, n = np.zeros(F), np.zeros(F), 0
        for lo in range(0, len(rows), _CHUNK_ROWS):
            sel = rows[lo : lo + _CHUNK_ROWS]
            if sel.any():
                x = np.asarray(ds.features[lo : lo + _CHUNK_ROWS][sel], np.float64)
                s += x.sum(0)
                ss += np.square(x).sum(0)
                n += len(x)
        if n == 0:
            raise ValueError("Normalizer.fit: the training windows cover no snapshot")
        mean = s / n
        std = np.sqrt(np.maximum(ss / n - mean**2, 0.0))
        std[std < 1e-6] = 1.0
        return cls(mean.astype(np.float32), std.astype(np.float32))


def median_dt(ds, train_ends: np.ndarray, window: int) -> float:
    """Median Δt (seconds) over the training windows' snapshots: the CfC's time scale."""
    rows = covered_rows(len(ds.dt), train_ends, window)
    return float(np.median(np.asarray(ds.dt)[rows]))


@dataclass
class Batch:
    x: torch.Tensor  # (B, K, F) float32, normalised
    dt: torch.Tensor  # (B, K) float32 seconds
    y: torch.Tensor  # (B, H) float32
    mask: torch.Tensor  # (B, H) bool
    index: torch.Tensor  # (B,) int64 window end


class WindowLoader:
    """Batches of windows ending at `ends`. A batch's `x` lives in one of two reused buffers:
    it stays valid while the next batch is drawn and is overwritten by the one after (clone it
    to keep it longer). dt, y, mask and index are fresh tensors. `pin_memory`: the buffers are
    page-locked, so a copy to a CUDA GPU runs asynchronously and at full speed."""

    def __init__(
        self,
        ds,
        ends: np.ndarray,
        window: int,
        batch_size: int,
        normalizer: Optional[Normalizer] = None,
        shuffle: bool = True,
        seed: int = 0,
        pin_memory: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: expected an integer >= 1")
        self.ds, self.window, self.batch_size = ds, window, batch_size
        self.ends = np.asarray(ends, np.int64)
        if len(self.ends) and (self.ends.min() < window - 1 or self.ends.max() >= len(ds.dt)):
            raise ValueError(f"window ends must lie in [{window - 1}, {len(ds.dt) - 1}]")
        self.shuffle, self.seed, self.pin_memory = shuffle, seed, pin_memory
        self._ring: list = [None, None]
        self._turn = 0
        self.offsets = np.arange(-window + 1, 1, dtype=np.int64)  # (K,)
        with warnings.catch_warnings():  # a read-only memory map: torch only reads it here
            warnings.simplefilter("ignore", UserWarning)
            self._features = torch.from_numpy(np.asarray(ds.features))  # (T, F), no copy
        self._affine: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (1 / std, -mean / std)
        if normalizer is not None:
            self._affine = (torch.from_numpy(1.0 / normalizer.std), torch.from_numpy(-normalizer.mean / normalizer.std))

    def _buffer(self, n_rows: int) -> torch.Tensor:
        """(n_rows, F) from a ring of two reused buffers: fresh 100 MB tensors cost more in page
        faults than the gather itself."""
        self._turn ^= 1
        buf = self._ring[self._turn]
        if buf is None or buf.shape[0] < n_rows:
            buf = self._ring[self._turn] = torch.empty(n_rows, self._features.shape[1], pin_memory=self.pin_memory)
        return buf[:n_rows]

    def __len__(self) -> int:
        return -(-len(self.ends) // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """Window ends in this epoch's order: a function of (seed, epoch) only."""
        if not self.shuffle:
            return self.ends
        return self.ends[np.random.default_rng([self.seed, epoch]).permutation(len(self.ends))]

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        ends = self.order(epoch)
        for b in range(start, len(self)):
            yield self.gather(ends[b * self.batch_size : (b + 1) * self.batch_size])

    def gather(self, ends: np.ndarray) -> Batch:
        rows = ends[:, None] + self.offsets  # (B, K)
        B, K = rows.shape
        x = self._buffer(B * K).view(B, K, -1)
        torch.index_select(self._features, 0, torch.from_numpy(rows.reshape(-1)), out=x.view(B * K, -1))
        if self._affine is not None:
            scale, shift = self._affine
            torch.addcmul(shift, x, scale, out=x)  # (x - mean) / std in one pass
        return Batch(
            x=x,
            dt=torch.from_numpy(np.asarray(self.ds.dt)[rows]),
            y=torch.from_numpy(np.asarray(self.ds.y[ends], np.float32)),
            mask=torch.from_numpy(np.asarray(self.ds.mask[ends])),
            index=torch.from_numpy(ends.copy()),
        )

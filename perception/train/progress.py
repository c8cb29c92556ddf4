"""The per-epoch progress of a training: a tqdm bar on a terminal; elsewhere (a pod, a log file, a
pipe) one plain line every `PLAIN_INTERVAL_S` seconds, since carriage-return frames make a log
unreadable and, redrawn ten times a second for days, very large."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

PLAIN_INTERVAL_S = 60.0


class PlainProgress:
    """tqdm's interface as the training loop uses it (update, set_postfix, close), as plain lines:
    `shared-f0 epoch 3/30: 1200/5000 batches (24%), loss=0.6931 samples_s=1234`."""

    def __init__(self, total: int, desc: str, stream: TextIO, interval: float = PLAIN_INTERVAL_S):
        self.total, self.desc, self.stream, self.interval = total, desc, stream, interval
        self.n, self.postfix = 0, ""
        self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.interval:
            self._print()

    def set_postfix(self, **values) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        pass  # the epoch's own summary line follows

    def _print(self) -> None:
        self._last = time.monotonic()
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        print(
            f"{self.desc}: {self.n}/{self.total} batches{pct}" + (f", {self.postfix}" if self.postfix else ""),
            file=self.stream,
            flush=True,
        )


def progress(total: int, desc: str, enabled: bool, stream: Optional[TextIO] = None):
    """A tqdm bar where stderr is a terminal, else PlainProgress; disabled: a silent PlainProgress."""
    stream = stream or sys.stderr
    if enabled and stream.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="batch", leave=False, dynamic_ncols=True, file=stream)
    return PlainProgress(total, desc, stream, PLAIN_INTERVAL_S if enabled else float("inf"))

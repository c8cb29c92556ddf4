"""`data.instrument` -> which records of a file to keep: an instrument id, or a symbol resolved per date.

A raw symbol (`ESH4`) or a continuous / parent symbol (`ES.c.0`) is looked up in each file's own
symbology mappings, whose intervals name the instrument for each UTC date (of `ts_recv`, the time
the clock runs on); so across a roll the records of each day's contract are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Optional

import numpy as np

from perception.data.dbn_stream import DbnHeader
from perception.errors import DataError

DAY_NS = 86_400 * 1_000_000_000
_EPOCH = date(1970, 1, 1)


def _day(d: date) -> int:
    return (d - _EPOCH).days


def _date(day: int) -> date:
    return _EPOCH + timedelta(days=int(day))


@dataclass
class InstrumentFilter:
    """Keeps the records of the instrument the config names (all records when it names none)."""

    path: str
    instrument: Optional[str]
    target_id: Optional[int] = None  # a fixed instrument id
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # interval first days
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # first days past them
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # -1: mapped to nothing

    def keep(self, records: np.ndarray) -> Optional[np.ndarray]:
        """Bool mask of the records to keep, or None for all of them."""
        if self.instrument is None:
            return None
        inst = records["instrument_id"]
        if self.target_id is not None:
            return inst == self.target_id
        day = records["ts_recv"].astype(np.int64) // DAY_NS
        at = np.searchsorted(self.starts, day, side="right") - 1
        safe = np.maximum(at, 0)
        covered = (at >= 0) & (day < self.ends[safe]) & (self.ids[safe] >= 0)
        if not covered.all():
            bad = _date(day[np.argmin(covered)])
            raise DataError(
                f"{self.path}: the symbology of data.instrument={self.instrument!r} does not cover "
                f"{bad.isoformat()} (the file's mapping intervals: {self._describe()})"
            )
        return inst == self.ids[safe]

    def _describe(self) -> str:
        return (
            ", ".join(
                f"{_date(s)}..{_date(e)} -> {i if i >= 0 else 'none'}"
                for s, e, i in zip(self.starts, self.ends, self.ids)
            )
            or "none"
        )


def instrument_filter(header: DbnHeader, instrument: Optional[str]) -> InstrumentFilter:
    path = str(header.path)
    if instrument is None:
        return InstrumentFilter(path, None)
    inst = str(instrument)
    if inst.isdigit():
        return InstrumentFilter(path, inst, target_id=int(inst))
    intervals = header.mappings.get(inst)
    if not intervals:
        known = sorted(header.mappings)
        raise DataError(
            f"{path}: data.instrument={inst!r} is not in the file's symbology (symbols "
            f"{known[:10] or 'none'}); use a symbol the files map, or an instrument id"
        )
    starts = np.array([_day(iv.start) for iv in intervals], np.int64)
    ends = np.array([_day(iv.end) for iv in intervals], np.int64)
    ids = np.array([int(iv.symbol) if iv.symbol.isdigit() else -1 for iv in intervals], np.int64)
    return InstrumentFilter(path, inst, starts=starts, ends=ends, ids=ids)


def symbols_of(header: DbnHeader) -> dict[int, list[str]]:
    """instrument id -> the file's symbols that map to it on some date."""
    out: dict[int, list[str]] = {}
    for symbol, intervals in header.mappings.items():
        for iv in intervals:
            if iv.symbol.isdigit() and symbol not in out.setdefault(int(iv.symbol), []):
                out[int(iv.symbol)].append(symbol)
    return out

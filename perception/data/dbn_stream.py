"""A DBN MBP-10 file's records in bounded chunks (`.dbn` and `.dbn.zst`), for inputs larger than memory.

Decompression is the standard library's `compression.zstd` (its backport before Python 3.14): its
decompressor takes a `max_length`, so no call returns more than ZSTD_OUT bytes however well the data
compresses, and its `eof` tells a complete stream from a truncated one (`zstandard`'s stream reader
has neither a bound per call on its decompressobj nor a truncation error on its reader).
databento-dbn's decoder yields one Python object per record, ~30x slower. Memory: the chunk buffer
plus at most one ZSTD_OUT (or _RAW_PIECE) piece waiting to be copied into it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import databento_dbn as dbn
import numpy as np

try:
    from compression.zstd import ZstdDecompressor, ZstdError
except ImportError:  # Python < 3.14
    from backports.zstd import ZstdDecompressor, ZstdError

from perception.data.dbn_io import _ZSTD_MAGIC, MBP10_DTYPE, check_records, is_legacy_dbz, legacy_dbz_error
from perception.errors import DataError

CHUNK_RECORDS = 262_144  # records per chunk: 96 MB of buffer
ZSTD_PIECE = 128 << 10  # compressed bytes read at a time
ZSTD_OUT = 1 << 20  # decompressed bytes per decompressor call, at most
_RAW_PIECE = 8 << 20  # uncompressed reads


@dataclass
class Interval:
    start: date  # first day the mapping holds
    end: date  # first day it no longer holds
    symbol: str  # what the input symbol maps to (an instrument id as text)


@dataclass
class DbnHeader:
    path: Path
    dataset: str
    record_dtype: np.dtype  # MBP10_DTYPE, plus ts_out when the file has it
    mappings: dict[str, list[Interval]] = field(default_factory=dict)


@dataclass
class ReaderStats:
    """What the reader held at most: the memory test checks these against their bounds."""

    chunk_buffer_bytes: int = 0
    max_pending_bytes: int = 0  # decompressed bytes waiting to be copied into the chunk buffer


class Mbp10Stream:
    """`with Mbp10Stream(path, chunk_records) as s: s.header; for chunk in s.chunks(): ...`

    Each chunk is a view into the same buffer, valid until the next one is read; `offset` (records
    before it in the file) names records in errors. `buffer()` and `read_into` let a reader keep
    records of one chunk at the front of the buffer and fill only the rest (file_clock.py).
    """

    def __init__(self, path: str | Path, chunk_records: int = CHUNK_RECORDS):
        self.path = Path(path)
        self.chunk_records = int(chunk_records)
        self.stats = ReaderStats()
        self._file: BinaryIO | None = None
        self._pieces: Iterator[np.ndarray] = iter(())
        self._pending = np.zeros(0, np.uint8)
        self._records_read = 0
        self.header: DbnHeader | None = None

    def __enter__(self) -> "Mbp10Stream":
        try:
            f = self._file = open(self.path, "rb")
            magic = f.read(4)
            f.seek(0)
        except OSError as e:
            raise DataError(f"{self.path}: cannot read ({e.strerror})") from None
        if not magic:
            raise DataError(f"{self.path}: empty file (expected a DBN MBP-10 file)")
        if is_legacy_dbz(magic):
            raise legacy_dbz_error(self.path)
        self._pieces = self._zstd_pieces(f) if magic == _ZSTD_MAGIC else self._raw_pieces(f)
        self.header = self._read_header()
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()

    # ------------------------------------------------------------ bytes

    def _raw_pieces(self, f: BinaryIO) -> Iterator[np.ndarray]:
        while piece := f.read(_RAW_PIECE):
            yield np.frombuffer(piece, np.uint8)

    def _zstd_pieces(self, f: BinaryIO) -> Iterator[np.ndarray]:
        dec, feed = ZstdDecompressor(), b""
        while True:
            if dec.eof:  # a frame ended: the file ends here, or another frame follows
                feed = dec.unused_data or f.read(ZSTD_PIECE)
                if not feed:
                    return
                dec = ZstdDecompressor()
            elif dec.needs_input and not feed:
                feed = f.read(ZSTD_PIECE)
                if not feed:
                    raise DataError(f"{self.path}: truncated file (the zstd stream ends early)")
            try:
                out = dec.decompress(feed, max_length=ZSTD_OUT)
            except ZstdError as e:
                raise DataError(f"{self.path}: corrupt zstd stream ({e})") from None
            feed = b""
            if out:
                yield np.frombuffer(out, np.uint8)

    def _readinto(self, out: np.ndarray) -> int:
        """Fills the bytes `out` (uint8) as far as the file goes; numpy copies without the GIL, so
        readers in threads of one process decompress and copy side by side."""
        n = 0
        while n < len(out):
            if not len(self._pending):
                piece = next(self._pieces, None)
                if piece is None:
                    break
                self._pending = piece
                self.stats.max_pending_bytes = max(self.stats.max_pending_bytes, len(piece))
            k = min(len(out) - n, len(self._pending))
            out[n : n + k] = self._pending[:k]
            self._pending = self._pending[k:]
            n += k
        return n

    def _read_exact(self, n: int, what: str) -> bytes:
        buf = bytearray(n)
        got = self._readinto(np.frombuffer(buf, np.uint8))
        if got < n:
            raise DataError(f"{self.path}: {what} ({got} of {n} bytes)")
        return bytes(buf)

    # ------------------------------------------------------------ header and records

    def _read_header(self) -> DbnHeader:
        lead = bytearray(8)
        got = self._readinto(np.frombuffer(lead, np.uint8))
        if got < 8 or not lead.startswith(b"DBN"):
            raise DataError(f"{self.path}: not a DBN file (invalid DBN header {bytes(lead[:4])!r})")
        (meta_len,) = struct.unpack_from("<I", lead, 4)
        body = self._read_exact(meta_len, "truncated DBN metadata")
        try:
            meta = dbn.Metadata.decode(bytes(lead) + body)
        except Exception as e:  # databento_dbn raises its own DBNError / ValueError variants
            raise DataError(f"{self.path}: unreadable DBN metadata ({e})") from None
        if meta.schema != dbn.Schema.MBP_10:
            raise DataError(f"{self.path}: schema is {meta.schema}, expected mbp-10")
        dtype = MBP10_DTYPE
        if meta.ts_out:
            dtype = np.dtype(dbn.MBP10Msg._dtypes + [("ts_out", "u8")])
        return DbnHeader(self.path, str(meta.dataset), dtype, _mappings(meta))

    def buffer(self) -> np.ndarray:
        """(chunk_records,) records of the header's dtype: the one buffer a reader fills."""
        if self.header is None:
            raise RuntimeError(f"{self.path}: the stream is not open (read it inside its with block)")
        buf = np.empty(self.chunk_records, self.header.record_dtype)
        self.stats.chunk_buffer_bytes = buf.nbytes
        return buf

    def read_into(self, out: np.ndarray) -> np.ndarray:
        """The next records of the file, read into `out` (contiguous records of the header's
        dtype); fewer than len(out) only at the end of the file."""
        size = out.dtype.itemsize
        got = self._readinto(out.view(np.uint8))
        if got % size:
            raise DataError(
                f"{self.path}: truncated file ({self._records_read * size + got} record bytes is not "
                f"a whole number of {size}-byte MBP-10 records)"
            )
        records = out[: got // size]
        check_records(self.path, records, self._records_read, size)
        self._records_read += len(records)
        return records

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(offset, records) for each chunk of up to `chunk_records` records, in file order."""
        buf = self.buffer()
        while True:
            offset = self._records_read
            records = self.read_into(buf)
            if not len(records):
                return
            yield offset, records
            if len(records) < len(buf):  # the stream is exhausted (and the zstd end check has run)
                return


def _mappings(meta) -> dict[str, list[Interval]]:
    out: dict[str, list[Interval]] = {}
    for symbol, intervals in (meta.mappings or {}).items():
        rows = []
        for iv in intervals:
            get: Callable[[str], Any] = iv.get if isinstance(iv, dict) else lambda k: getattr(iv, k)
            rows.append(Interval(get("start_date"), get("end_date"), str(get("symbol"))))
        out[str(symbol)] = sorted(rows, key=lambda r: r.start)
    return out

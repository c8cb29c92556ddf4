"""Databento DBN MBP-10 files <-> numpy record arrays.

Reading views the record bytes after the metadata header as one numpy structured array (the
layout is `databento_dbn.MBP10Msg._dtypes`, the same in DBN v1, v2 and v3); decoding millions of
records through Python objects is ~30x slower. The header itself is parsed by databento-dbn.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import databento_dbn as dbn
import numpy as np

from perception.errors import DataError

MBP10_DTYPE = np.dtype(dbn.MBP10Msg._dtypes)  # 368 bytes per record
MBP10_RTYPE = 10
UNDEF_PRICE = np.int64(dbn.UNDEF_PRICE)
F_LAST = int(dbn.F_LAST)  # 128: the record completes a book state
F_MAYBE_BAD_BOOK = int(dbn.F_MAYBE_BAD_BOOK)  # 4
N_LEVELS = 10
PRICE_SCALE = 1e-9  # fixed-point prices: int64 units of 1e-9

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Legacy DBZ opens with a zstd skippable frame: magic 0x184D2A50..0x184D2A5F, little-endian, so its
# first byte is any of 0x50..0x5F ('P'..'_') followed by "*M\x18".
_SKIPPABLE_TAIL = b"*M\x18"


def is_legacy_dbz(lead: bytes) -> bool:
    """The file's first bytes are a zstd skippable frame's magic, as a legacy DBZ file's are."""
    return len(lead) >= 4 and 0x50 <= lead[0] <= 0x5F and bytes(lead[1:4]) == _SKIPPABLE_TAIL


def legacy_dbz_error(path: Path) -> DataError:
    return DataError(
        f"{path}: legacy DBZ format is not supported; convert it to DBN (e.g. `dbn --upgrade` from Databento's dbn CLI)"
    )


@dataclass
class DbnFile:
    path: Path
    records: np.ndarray  # structured, MBP10_DTYPE fields (plus ts_out when present)
    symbols: dict[str, int]  # raw symbol -> instrument_id, from the metadata's mappings
    dataset: str


def read_mbp10(path: str | Path) -> DbnFile:
    """All MBP-10 records of one `.dbn` / `.dbn.zst` file; DataError names the file and problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if not raw:
        raise DataError(f"{path}: empty file (expected a DBN MBP-10 file)")
    if is_legacy_dbz(raw[:4]):
        raise legacy_dbz_error(path)
    if raw.startswith(_ZSTD_MAGIC):
        raw = _zstd_decompress(path, raw)
    if not raw.startswith(b"DBN") or len(raw) < 8:
        raise DataError(f"{path}: not a DBN file (invalid DBN header {raw[:4]!r})")
    (meta_len,) = struct.unpack_from("<I", raw, 4)
    if len(raw) < 8 + meta_len:
        raise DataError(f"{path}: truncated DBN metadata ({len(raw)} of {8 + meta_len} header bytes)")
    try:
        meta = dbn.Metadata.decode(raw[: 8 + meta_len])
    except Exception as e:  # databento_dbn raises its own DBNError / ValueError variants
        raise DataError(f"{path}: unreadable DBN metadata ({e})") from None
    if meta.schema != dbn.Schema.MBP_10:
        raise DataError(f"{path}: schema is {meta.schema}, expected mbp-10")
    body = memoryview(raw)[8 + meta_len :]
    records = _view_records(path, body, bool(meta.ts_out))
    return DbnFile(path, records, _symbol_map(meta), str(meta.dataset))


def _zstd_decompress(path: Path, raw: bytes) -> bytes:
    try:
        import zstandard
    except ImportError:  # the slow path: let databento-dbn decompress and decode
        return _decompress_with_dbn(path, raw)
    dobj = zstandard.ZstdDecompressor().decompressobj()
    try:
        out = dobj.decompress(raw)
    except zstandard.ZstdError as e:
        raise DataError(f"{path}: corrupt zstd stream ({e})") from None
    if not dobj.eof:
        raise DataError(f"{path}: truncated file (the zstd stream ends early)")
    return out


def _decompress_with_dbn(path: Path, raw: bytes) -> bytes:
    dec = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
    try:
        dec.write(raw)
        items = dec.decode()
    except Exception as e:
        raise DataError(f"{path}: unreadable DBN stream ({e})") from None
    meta = items[0] if items else None
    if not isinstance(meta, dbn.Metadata):  # a stream of records without the header that names them
        raise DataError(f"{path}: no DBN metadata at the start of the stream")
    return meta.encode() + b"".join(bytes(r) for r in items[1:])


def _view_records(path: Path, body: memoryview, ts_out: bool) -> np.ndarray:
    dtype = MBP10_DTYPE
    if ts_out:
        dtype = np.dtype(dbn.MBP10Msg._dtypes + [("ts_out", "u8")])
    size = dtype.itemsize
    if len(body) % size:
        raise DataError(
            f"{path}: truncated file ({len(body)} record bytes is not a whole number of {size}-byte MBP-10 records)"
        )
    records = np.frombuffer(body, dtype=dtype)
    check_records(path, records, offset=0, size=size)
    return records


def check_records(path: Path, records: np.ndarray, offset: int, size: int) -> None:
    """Every record is MBP-10 of the header's record size; `offset` numbers them within the file."""
    bad = (records["length"].astype(np.int64) * 4 != size) | (records["rtype"] != MBP10_RTYPE)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{path}: record {offset + i} is not an MBP-10 record (rtype {records['rtype'][i]}, "
            f"length {int(records['length'][i]) * 4} bytes)"
        )


def _symbol_map(meta) -> dict[str, int]:
    out: dict[str, int] = {}
    for symbol, intervals in (meta.mappings or {}).items():
        for iv in intervals:
            sid = str(iv.get("symbol", "") if isinstance(iv, dict) else getattr(iv, "symbol", ""))
            if sid.isdigit():
                out[symbol] = int(sid)
    return out


def write_mbp10(
    path: str | Path,
    records: np.ndarray,
    dataset: str = "SYNTH.MBP10",
    symbol: Optional[str] = None,
    compress: bool = False,
    mappings: Optional[dict] = None,
    stype_in=None,
) -> None:
    """A real DBN v3 MBP-10 stream: `Metadata(...).encode()` + the records' bytes
    (`.dbn.zst` when `compress`, through databento-dbn's own zstd transcoder). `mappings`:
    {symbol: [(start_date, end_date, instrument id), ...]}, Databento's dated symbology."""
    from types import SimpleNamespace

    from perception.atomic import atomic_path

    records = np.ascontiguousarray(records, dtype=MBP10_DTYPE)
    ts = records["ts_recv"]
    symbols = [symbol] if symbol else sorted(mappings or {})
    symbol_mappings = None
    if mappings is not None:  # databento-dbn takes objects with these attributes
        symbol_mappings = [
            SimpleNamespace(
                raw_symbol=sym, intervals=[SimpleNamespace(start_date=a, end_date=b, symbol=str(i)) for a, b, i in ivs]
            )
            for sym, ivs in mappings.items()
        ]
    meta = dbn.Metadata(
        dataset=dataset,
        start=int(ts.min()) if len(ts) else 0,
        end=int(ts.max()) + 1 if len(ts) else 1,
        stype_in=stype_in if stype_in is not None else dbn.SType.RAW_SYMBOL,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.MBP_10,
        symbols=symbols,
        mappings=symbol_mappings,
    )
    payload = meta.encode() + records.tobytes()
    with atomic_path(path) as tmp:
        if compress:
            with open(tmp, "wb") as f:
                tc = dbn.Transcoder(f, dbn.Encoding.DBN, dbn.Compression.ZSTD)
                tc.write(payload)
                tc.flush()
                del tc  # the zstd frame is closed when the transcoder is dropped
        else:
            tmp.write_bytes(payload)


def empty_records(n: int) -> np.ndarray:
    """n MBP-10 records with header fields set and every level empty."""
    rec = np.zeros(n, dtype=MBP10_DTYPE)
    rec["length"] = MBP10_DTYPE.itemsize // 4
    rec["rtype"] = MBP10_RTYPE
    rec["publisher_id"] = 1
    rec["price"] = UNDEF_PRICE
    rec["action"] = b"A"
    rec["side"] = b"N"
    rec["flags"] = F_LAST
    for i in range(N_LEVELS):
        rec[f"bid_px_{i:02d}"] = UNDEF_PRICE
        rec[f"ask_px_{i:02d}"] = UNDEF_PRICE
    return rec

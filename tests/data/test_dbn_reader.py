"""The MBP-10 reader on Databento's own samples, and one clear DataError per kind of bad input."""

from __future__ import annotations

import csv

import databento_dbn as dbn
import numpy as np
import pytest

from perception.data.dataset import build_snapshots, load_dataset
from perception.data.dbn_io import read_mbp10
from perception.errors import DataError

from tests.data.builders import dbn_config, make_records

MBP10_SAMPLES = [
    "test_data.mbp-10.dbn",
    "test_data.mbp-10.v1.dbn.zst",
    "test_data.mbp-10.v2.dbn.zst",
    "test_data.mbp-10.v3.dbn.zst",
]


def _rendered(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _assert_matches_rendering(records, rows):
    assert len(records) == len(rows)
    for rec, row in zip(records, rows):
        for name in records.dtype.names:
            if name == "length":
                continue
            value = rec[name]
            expected = row[name]
            if isinstance(value, bytes):
                assert value.decode() == expected, name
            else:
                assert int(value) == int(expected), name


@pytest.mark.parametrize("name", MBP10_SAMPLES)
def test_dbn_versions_decode_to_the_rendered_fields(databento_dir, name):
    f = read_mbp10(databento_dir / "dbn" / name)
    _assert_matches_rendering(f.records, _rendered(databento_dir / "renderings" / "dbn__test_data.mbp-10.csv"))


def test_databento_python_sample_decodes_with_its_symbols(databento_dir):
    f = read_mbp10(databento_dir / "databento-python" / "GLBX.MDP3" / "test_data.mbp-10.dbn.zst")
    rows = _rendered(databento_dir / "renderings" / "databento-python__GLBX.MDP3__test_data.mbp-10.csv")
    _assert_matches_rendering(f.records, rows)
    assert f.symbols == {"ESH1": 5482}
    assert f.dataset == "GLBX.MDP3"


def test_real_sample_gives_the_last_complete_book(databento_dir):
    path = databento_dir / "databento-python" / "GLBX.MDP3" / "test_data.mbp-10.dbn.zst"
    for inst in (None, "ESH1", "5482"):
        snaps, tick, counts = build_snapshots(dbn_config([path], instrument=inst), progress=False)
        rows = _rendered(databento_dir / "renderings" / "databento-python__GLBX.MDP3__test_data.mbp-10.csv")
        assert len(snaps) == 1  # 4 records within 0.08 s: one 1-second interval
        last = rows[-1]
        assert snaps.bid_px[0, 3] == int(last["bid_px_03"]) and snaps.ask_sz[0, 9] == int(last["ask_sz_09"])
        assert tick == 250_000_000  # ES trades in quarter points
    with pytest.raises(DataError, match="ESZ9"):
        build_snapshots(dbn_config([path], instrument="ESZ9"), progress=False)


# ------------------------------------------------------------------ bad input


def _expect_data_error(path, match):
    with pytest.raises(DataError, match=match) as err:
        load_dataset(dbn_config([path]), progress=False)
    assert str(path) in str(err.value)


def test_legacy_dbz_is_named(databento_dir):
    _expect_data_error(databento_dir / "dbn" / "test_data.mbp-10.dbz", "legacy DBZ")


@pytest.mark.parametrize("first", range(0x50, 0x60), ids=lambda b: f"{b:#x}")
def test_every_skippable_frame_header_gets_the_legacy_message(tmp_path, first):
    """A zstd skippable frame's magic is 0x184D2A5?: any of the sixteen opens a legacy DBZ file."""
    from perception.data.dbn_stream import Mbp10Stream

    path = tmp_path / "old.dbz"
    path.write_bytes(bytes([first]) + b"*M\x18" + bytes(60))
    _expect_data_error(path, "legacy DBZ format is not supported")
    with pytest.raises(DataError, match="legacy DBZ format is not supported"):
        read_mbp10(path)
    with pytest.raises(DataError, match="legacy DBZ format is not supported"):
        Mbp10Stream(path, 16).__enter__()


@pytest.mark.parametrize("lead", [b"O*M\x18", b"`*M\x18", b"P*M\x19", b"DBN\x02"], ids=repr)
def test_headers_beside_the_skippable_range_are_not_called_legacy(tmp_path, lead):
    path = tmp_path / "other.dbn"
    path.write_bytes(lead + bytes(60))
    with pytest.raises(DataError) as err:
        read_mbp10(path)
    assert "legacy" not in str(err.value) and str(path) in str(err.value)


def test_perception_data_build_names_a_legacy_file_whatever_its_frame_number(perception_home):
    import os
    import subprocess

    path = perception_home / "ES.dbz"
    path.write_bytes(b"Q*M\x18" + bytes(60))
    env = {**os.environ, "PERCEPTION_HOME": str(perception_home)}
    r = subprocess.run(
        ["perception-data", "build", "data=dbn", f"data.paths=[{path}]", "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert r.returncode == 1, r.stderr
    assert f"{path}: legacy DBZ format is not supported" in r.stderr and "Traceback" not in r.stderr
    cache = perception_home / "cache"  # no entry, and no build folder left (the inputs' digests may stay)
    assert not cache.exists() or not [p for p in cache.iterdir() if p.is_dir()]


@pytest.mark.parametrize("name", ["test_data.mbp-1.dbn", "test_data.mbp-1.v2.dbn.zst"])
def test_other_schema_is_named(databento_dir, name):
    _expect_data_error(databento_dir / "dbn" / name, "schema is mbp-1, expected mbp-10")


def test_trades_schema_is_named(tmp_path):
    rec = np.zeros(3, np.dtype(dbn.TradeMsg._dtypes))
    rec["length"], rec["rtype"] = rec.dtype.itemsize // 4, 0
    meta = dbn.Metadata(
        dataset="X",
        start=0,
        stype_in=dbn.SType.RAW_SYMBOL,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.TRADES,
        end=1,
    )
    path = tmp_path / "trades.dbn"
    path.write_bytes(meta.encode() + rec.tobytes())
    _expect_data_error(path, "schema is trades")


def test_empty_file_is_named(tmp_path):
    path = tmp_path / "empty.dbn"
    path.write_bytes(b"")
    _expect_data_error(path, "empty file")


@pytest.mark.parametrize("name", ["test_data.mbp-10.dbn", "test_data.mbp-10.v3.dbn.zst"])
def test_truncated_file_is_named(databento_dir, tmp_path, name):
    raw = (databento_dir / "dbn" / name).read_bytes()
    path = tmp_path / name
    path.write_bytes(raw[: len(raw) - 50])
    _expect_data_error(path, "truncated")


def test_not_dbn_is_named(tmp_path):
    path = tmp_path / "notes.dbn"
    path.write_text("hello, this is not a DBN file")
    _expect_data_error(path, "not a DBN file")


def test_zero_usable_snapshots_names_file_and_reasons(write_dbn):
    path = write_dbn(make_records([0.1, 1.2, 2.3], flags=128 | 4))  # all MAYBE_BAD_BOOK
    with pytest.raises(DataError, match="zero usable snapshots") as err:
        load_dataset(dbn_config([path]), progress=False)
    assert str(path) in str(err.value) and "maybe_bad_book" in str(err.value)


def test_several_instruments_need_a_choice(write_dbn):
    rec = make_records(np.arange(20) + 0.5)
    rec["instrument_id"][::2] = 9
    path = write_dbn(rec)
    with pytest.raises(DataError, match=r"2 instruments present.*data.instrument"):
        build_snapshots(dbn_config([path]), progress=False)
    snaps, _, counts = build_snapshots(dbn_config([path], instrument="9"), progress=False)
    assert len(snaps) == 10 and counts["other_instrument"] == 10

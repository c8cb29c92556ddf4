"""Continuous contracts across a roll, overlapping files, and bad files in a multi-file build: a clear
error naming the file, and no partial cache left behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from datetime import date, timedelta

import databento_dbn as dbn
import numpy as np
import pytest

from perception.data.dataset import _build, load_dataset
from perception.data.digests import DIGESTS_FILE
from perception.data.dbn_io import write_mbp10
from perception.errors import DataError

from tests.data.builders import dbn_config, make_records

DAY0 = date(2024, 3, 11)
DAY_NS = 86_400 * 10**9
DAY0_NS = (DAY0 - date(1970, 1, 1)).days * DAY_NS
FRONT, NEXT = 1001, 2002  # ESH4, ESM4: the continuous symbol rolls from one to the other on day 3
ROLL = dict(snapshot_interval=60.0, max_gap=600.0, tick_size=0.25)


def cache_entries(cache: Path) -> list[Path]:
    """What the cache holds besides the inputs' digest memo (a file's digest is kept whether or not it reads)."""
    return [p for p in cache.iterdir() if p.name != DIGESTS_FILE] if cache.exists() else []


def _day_records(day: int) -> np.ndarray:
    """Both contracts quoting all day, every 30 s; the later contract 100 ticks higher."""
    t = (np.arange(2880) * 30.0 + 15.0) + day * 86_400.0
    recs = []
    for inst, bid0 in ((FRONT, 20_000), (NEXT, 20_100)):
        r = make_records(t, bid0_ticks=bid0 + (np.arange(len(t)) % 3))
        r["ts_recv"] = DAY0_NS + np.rint(t * 1e9).astype(np.int64)
        r["instrument_id"] = inst
        recs.append(r)
    both = np.concatenate(recs)
    return both[np.argsort(both["ts_recv"], kind="stable")]


def _roll_files(tmp_path, continuous_on_day=None):
    """Four daily files; each maps ES.c.0 for its own date (Databento's daily downloads), and the
    raw symbols for the whole period."""
    paths = []
    for day in range(4):
        d = DAY0 + timedelta(days=day)
        mapped = (
            continuous_on_day(day, d) if continuous_on_day else (d, d + timedelta(days=1), FRONT if day < 2 else NEXT)
        )
        mappings = {
            "ES.c.0": [mapped],
            "ESH4": [(DAY0, DAY0 + timedelta(days=4), FRONT)],
            "ESM4": [(DAY0, DAY0 + timedelta(days=4), NEXT)],
        }
        path = tmp_path / f"glbx-mdp3-{d:%Y%m%d}.mbp-10.dbn.zst"
        write_mbp10(
            path,
            _day_records(day),
            dataset="GLBX.MDP3",
            compress=True,
            mappings=mappings,
            stype_in=dbn.SType.CONTINUOUS,
        )
        paths.append(path)
    return paths


def test_a_continuous_symbol_keeps_both_contracts_with_a_segment_break_at_the_roll(tmp_path):
    paths = _roll_files(tmp_path)
    ds = _build(dbn_config(paths, instrument="ES.c.0", horizons=[1, 5], chunk_records=1000, **ROLL), "", progress=False)
    assert len(ds) == 4 * 1440  # one snapshot a minute on each of the four days
    roll = 2 * 1440
    assert ds.segment.tolist() == [0] * roll + [1] * roll  # a gap of 60 s only: the roll alone breaks it
    assert ds.drop_counts["other_instrument"] == 4 * 2880
    assert not ds.mask[roll - 5 : roll, 1].any() and ds.mask[roll - 6, 1]  # no label across the roll
    assert ds.features[roll, 60] == 0.0  # no mid return across it (prices jump by 100 ticks)
    used = {row["instrument_id"]: row for row in ds.summary["instruments"]}
    assert used[FRONT]["records"] == used[NEXT]["records"] == 2 * 2880
    assert used[FRONT]["first"].startswith("2024-03-11T00:00:15") and used[FRONT]["last"].startswith(
        "2024-03-12T23:59:45"
    )
    assert used[NEXT]["first"].startswith("2024-03-13T00:00:15") and used[NEXT]["last"].startswith(
        "2024-03-14T23:59:45"
    )
    assert used[FRONT]["symbols"] == ["ES.c.0", "ESH4"] and ds.summary["rolls"] == 1


@pytest.mark.parametrize("instrument", ["ESM4", str(NEXT)])
def test_a_raw_symbol_or_an_id_keeps_one_contract_throughout(tmp_path, instrument):
    ds = _build(dbn_config(_roll_files(tmp_path), instrument=instrument, horizons=[1, 5], **ROLL), "", progress=False)
    assert len(ds) == 4 * 1440 and set(ds.segment.tolist()) == {0}
    assert [row["instrument_id"] for row in ds.summary["instruments"]] == [NEXT]


def test_a_symbol_the_files_do_not_map_names_file_and_symbol(tmp_path):
    paths = _roll_files(tmp_path)
    with pytest.raises(DataError, match=r"data.instrument='NQ.c.0' is not in the file's symbology") as err:
        _build(dbn_config(paths, instrument="NQ.c.0", **ROLL), "", progress=False)
    assert any(str(p) in str(err.value) for p in paths) and "ES.c.0" in str(err.value)  # the first reader to fail


def test_a_date_the_mapping_does_not_cover_names_file_symbol_and_date(tmp_path):
    def stale(day, d):  # the last file's mapping is for the day before it
        return (d - timedelta(days=1), d, NEXT) if day == 3 else (d, d + timedelta(days=1), FRONT if day < 2 else NEXT)

    paths = _roll_files(tmp_path, stale)
    with pytest.raises(DataError, match=r"ES.c.0.*does not cover 2024-03-14") as err:
        _build(dbn_config(paths, instrument="ES.c.0", **ROLL), "", progress=False)
    assert str(paths[3]) in str(err.value)


def test_the_cli_lists_the_instruments_with_dates_and_counts(tmp_path, perception_home):
    paths = _roll_files(tmp_path)
    env = {**os.environ, "PERCEPTION_HOME": str(perception_home)}
    res = subprocess.run(
        [
            "perception-data",
            "build",
            "data=dbn",
            f"data.paths=[{','.join(map(str, paths))}]",
            "data.instrument=ES.c.0",
            "data.snapshot_interval=60",
            "data.max_gap=600",
            "data.window=8",
            "data.horizons=[1,5]",
            "data.window_stride=1",
            "data.n_folds=2",
            "data.workers=2",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "records:   23040 read from 4 files, 5760 snapshots in 2 segments (1 instrument changes)" in out
    assert (
        f"instrument {FRONT} (ES.c.0,ESH4): 5760 records, 2024-03-11T00:00:15.000000Z .. "
        "2024-03-12T23:59:45.000000Z, 2 files"
    ) in out
    assert f"instrument {NEXT} (ES.c.0,ESM4): 5760 records, 2024-03-13T00:00:15" in out
    assert "other_instrument=11520" in out and "peak RSS:" in out


# ------------------------------------------------------------ overlap and bad files


def test_files_whose_times_overlap_are_refused_naming_both(write_dbn):
    a = write_dbn(make_records(np.arange(100) + 0.5), "a.dbn")
    b = write_dbn(make_records(np.arange(90, 150) + 0.5), "b.dbn.zst", compress=True)
    with pytest.raises(DataError, match="overlaps") as err:
        _build(dbn_config([b, a]), "", progress=False)
    assert str(a) in str(err.value) and str(b) in str(err.value)
    assert "2024-01-01T10:01:30.500000Z" in str(err.value) and "2024-01-01T10:01:39.500000Z" in str(err.value)


def test_files_that_touch_end_to_start_are_not_an_overlap(write_dbn):
    a = write_dbn(make_records(np.arange(100) + 0.5), "a.dbn")
    b = write_dbn(make_records(np.arange(99, 150) + 0.5), "b.dbn")  # b starts at a's last time
    assert len(_build(dbn_config([a, b]), "", progress=False)) == 150


def _good_files(write_dbn, n=3):
    return [
        write_dbn(make_records(np.arange(400) * 0.5 + 1000 * i), f"good{i}.dbn.zst", compress=True) for i in range(n)
    ]


def _truncated_zst(write_dbn):
    path = write_dbn(make_records(np.arange(3000) * 0.5 + 5000), "cut.dbn.zst", compress=True)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path, "truncated file"


def _truncated_dbn(write_dbn):
    path = write_dbn(make_records(np.arange(3000) * 0.5 + 5000), "cut.dbn")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 100])  # mid-record, in the last of several chunks
    return path, "truncated file"


def _other_schema(write_dbn):
    rec = np.zeros(3, np.dtype(dbn.MBP1Msg._dtypes))
    rec["length"], rec["rtype"] = rec.dtype.itemsize // 4, 1
    meta = dbn.Metadata(
        dataset="SYNTH.MBP10",
        start=0,
        stype_in=dbn.SType.RAW_SYMBOL,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.MBP_1,
        end=1,
    )
    path = _tmp(write_dbn) / "mbp1.dbn"  # the fixture writes MBP-10 only
    path.write_bytes(meta.encode() + rec.tobytes())
    return path, "schema is mbp-1, expected mbp-10"


def _other_dataset(write_dbn):
    path = _tmp(write_dbn) / "xnas.dbn.zst"
    write_mbp10(path, make_records(np.arange(50) * 0.5 + 5000), dataset="XNAS.ITCH", compress=True)
    return path, "dataset 'XNAS.ITCH' differs from 'SYNTH.MBP10'"


def _tmp(write_dbn):
    return write_dbn(make_records([0.5]), "probe.dbn").parent


@pytest.mark.parametrize("bad", [_truncated_zst, _truncated_dbn, _other_schema, _other_dataset])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_file_is_named_and_leaves_no_cache(write_dbn, perception_home, bad, workers):
    good = _good_files(write_dbn)
    path, message = bad(write_dbn)
    cfg = dbn_config([*good, path], cache=True, workers=workers, chunk_records=512)
    with pytest.raises(DataError, match=message) as err:
        load_dataset(cfg, progress=False)
    assert str(path) in str(err.value)
    cache = perception_home / "cache"
    assert cache_entries(cache) == []  # no partial cache, no temp directory


def test_a_failing_reader_stops_the_others_and_leaves_no_cache(write_dbn, perception_home, monkeypatch):
    """A reader thread failing outside the data checks (here: out of memory) ends the build with its
    error; the other readers stop at their next chunk and nothing is cached."""
    from perception.data import ingest
    from perception.data.file_clock import Stopped, extract_file

    good = [write_dbn(make_records(np.arange(20_000) * 0.5 + 20_000 * i), f"long{i}.dbn") for i in range(4)]
    cfg = dbn_config(good, cache=True, workers=2, chunk_records=64)
    outcome = {}

    def reader(job, stop):
        if job.index == 0:
            raise MemoryError("no memory for the chunk buffer")
        try:
            part = extract_file(job, stop)
        except Stopped:
            outcome[job.index] = "stopped"
            raise
        outcome[job.index] = "read"
        return part

    monkeypatch.setattr(ingest, "extract_file", reader)
    with pytest.raises(MemoryError, match="no memory for the chunk buffer"):
        load_dataset(cfg, progress=False)
    assert "stopped" in outcome.values() and "read" not in outcome.values()  # or never started
    cache = perception_home / "cache"
    assert cache_entries(cache) == []

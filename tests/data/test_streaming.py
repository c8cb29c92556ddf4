"""The streamed DBN build equals the whole-array oracle (`build_in_memory`), bit for bit, on the real
samples and on multi-file synthetic sets; any chunk size and any number of workers give the same."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perception.data import assemble
from perception.data.assemble import Assembly
from perception.data.dataset import _build, build_in_memory
from perception.data.dbn_io import UNDEF_PRICE, read_mbp10, write_mbp10
from perception.data.dbn_stream import ZSTD_OUT, Mbp10Stream, _RAW_PIECE
from perception.data.file_clock import FileJob, extract_file

from tests.data.builders import dbn_config, make_records

MBP10_SAMPLES = [
    "dbn/test_data.mbp-10.dbn",
    "dbn/test_data.mbp-10.v1.dbn.zst",
    "dbn/test_data.mbp-10.v2.dbn.zst",
    "dbn/test_data.mbp-10.v3.dbn.zst",
    "databento-python/GLBX.MDP3/test_data.mbp-10.dbn.zst",
]
_ARRAYS = ("features", "dt", "y", "mask", "segment")


def assert_same(streamed, oracle):
    for name in _ARRAYS:
        a, b = np.asarray(getattr(streamed, name)), np.asarray(getattr(oracle, name))
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name  # bit-identical, NaN patterns included
    assert streamed.drop_counts == oracle.drop_counts


def streamed(cfg):
    return _build(cfg, "", progress=False)


@pytest.mark.parametrize("name", MBP10_SAMPLES)
@pytest.mark.parametrize("chunk", [1, 3, 1_000_000])
def test_real_samples_stream_as_they_read_whole(databento_dir, name, chunk):
    cfg = dbn_config([databento_dir / name], chunk_records=chunk)
    assert_same(streamed(cfg), build_in_memory(cfg))


def test_real_sample_records_over_several_days_and_chunks(databento_dir, write_dbn):
    """The real sample's records, repeated on five days (a file each) at many times of day."""
    rec = read_mbp10(databento_dir / "databento-python/GLBX.MDP3/test_data.mbp-10.dbn.zst").records
    files = []
    for day in range(5):
        copies = np.concatenate([rec] * 40)
        copies["ts_recv"] += np.repeat(np.arange(40), len(rec)).astype(np.uint64) * 7_000_000_000 + np.uint64(
            day * 86_400_000_000_000
        )
        files.append(write_dbn(copies, f"day{day}.dbn.zst", compress=day % 2 == 0))
    for chunk in (5, 64):
        cfg = dbn_config(files, chunk_records=chunk)
        assert_same(streamed(cfg), build_in_memory(cfg))


# ------------------------------------------------------------ synthetic multi-file sets


def _book_events(rng: np.random.Generator, n: int) -> np.ndarray:
    """n records of instrument 7 (some of 9) with superseded states, incomplete and bad books,
    crossed and one-sided books, book clears and gaps."""
    steps = rng.choice([0.0, 0.05, 0.3, 0.9, 1.7, 75.0], size=n, p=[0.1, 0.4, 0.25, 0.15, 0.08, 0.02])
    times = np.cumsum(steps)
    rec = make_records(times, bid0_ticks=20_000 + rng.integers(-3, 4, size=n).cumsum(), spread=1)
    rec["bid_sz_00"] = rng.integers(1, 50, size=n)
    rec["instrument_id"] = np.where(rng.random(n) < 0.15, 9, 7)
    rec["flags"] = np.where(rng.random(n) < 0.1, 0, 128)
    rec["flags"] |= np.where(rng.random(n) < 0.03, 4, 0).astype(np.uint8)
    crossed = rng.random(n) < 0.03
    rec["ask_px_00"][crossed] = rec["bid_px_00"][crossed]
    one_sided = rng.random(n) < 0.03
    rec["bid_px_00"][one_sided] = UNDEF_PRICE
    clear = rng.random(n) < 0.02
    rec["action"][clear] = b"R"
    return rec


def _jumbled(rng: np.random.Generator, rec: np.ndarray, far: bool) -> np.ndarray:
    """Records slightly out of order (neighbour swaps), and with `far` one moved a long way back."""
    order = np.arange(len(rec))
    for i in rng.integers(0, max(len(rec) - 1, 1), size=len(rec) // 8):
        order[i], order[i + 1] = order[i + 1], order[i]
    if far and len(rec) > 20:
        order = np.r_[order[:2], order[-1], order[2:-1]]
    return rec[order]


def _write_set(folder: Path, rng: np.random.Generator, n: int, n_files: int, far: bool) -> list[Path]:
    rec = _book_events(rng, n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=n_files - 1, replace=False))
    paths = []
    for i, part in enumerate(np.split(rec, cuts)):
        path = folder / (f"part{i:02d}.dbn" + (".zst" if i % 2 else ""))
        write_mbp10(path, _jumbled(rng, part, far and i == 0), compress=bool(i % 2))
        paths.append(path)
    return paths


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(40, 400),
    n_files=st.integers(1, 4),
    chunk=st.integers(1, 120),
    far=st.booleans(),
    instrument=st.sampled_from(["7", "9"]),
    block=st.integers(1, 40),
)
def test_streaming_equals_in_memory_over_random_chunk_sizes(seed, n, n_files, chunk, far, instrument, block):
    """`block`: feature rows a block, so that features are computed while later files are read."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(assemble, "FEATURE_BLOCK", block):
        paths = _write_set(Path(tmp), rng, n, n_files, far)
        cfg = dbn_config(
            paths,
            instrument=instrument,
            chunk_records=chunk,
            snapshot_interval=1.0,
            max_gap=60.0,
            tick_size=0.25,
            workers=1,
        )  # workers: test_workers_give_...
        try:
            oracle = build_in_memory(cfg)
        except Exception as e:  # e.g. zero usable snapshots: the streamed build must refuse alike
            with pytest.raises(type(e)):
                streamed(cfg)
            return
        assert_same(streamed(cfg), oracle)


@pytest.fixture
def small_blocks(monkeypatch):
    """Feature blocks of 7 rows and the tick from the first 30 (the sets' price step shows in
    any row): rows get their features while later files are still being read."""
    monkeypatch.setattr(assemble, "FEATURE_BLOCK", 7)
    monkeypatch.setattr(assemble, "TICK_ROWS", 30)


def _rows_done_ahead(monkeypatch) -> list[int]:
    """Rows with features after each file was added, in the order files were added."""
    done, add = [], Assembly.add

    def counted(self, part):
        add(self, part)
        done.append(self.out.n)

    monkeypatch.setattr(Assembly, "add", counted)
    return done


def test_features_are_computed_as_files_arrive_and_equal_the_whole(tmp_path, small_blocks, monkeypatch):
    paths = _write_set(tmp_path, np.random.default_rng(11), 900, 4, far=False)
    cfg = dbn_config(paths, instrument="7", chunk_records=23, workers=1)
    done = _rows_done_ahead(monkeypatch)
    assert_same(streamed(cfg), build_in_memory(cfg))
    assert 0 < done[0] < done[1] < done[2] < done[3]  # the work went along with the reading


@pytest.mark.parametrize("listed", [[2, 1, 0], [0, 2, 1], [0, 1, 3, 2]])
def test_files_are_taken_in_time_order_whatever_their_listed_order(tmp_path, small_blocks, monkeypatch, listed):
    """Listed out of time order: the features done ahead in the listed order are dropped."""
    paths = _write_set(tmp_path, np.random.default_rng(3), 300 * len(listed), len(listed), far=False)
    cfg = dbn_config(paths, instrument="7", chunk_records=17)
    done = _rows_done_ahead(monkeypatch)
    assert_same(
        streamed(dbn_config([paths[i] for i in listed], instrument="7", chunk_records=17)), build_in_memory(cfg)
    )
    assert len(done) == len(listed)


def test_workers_give_bit_identical_results(tmp_path, small_blocks):
    paths = _write_set(tmp_path, np.random.default_rng(11), 600, 4, far=True)
    one = streamed(dbn_config(paths, instrument="7", chunk_records=23, workers=1))
    two = streamed(dbn_config(paths, instrument="7", chunk_records=23, workers=2))
    assert_same(two, one)
    this_run = ("files_read_whole",)  # the chunk per worker decides which files fall back to it
    assert {k: v for k, v in one.summary.items() if k not in this_run} == {
        k: v for k, v in two.summary.items() if k not in this_run
    }
    assert_same(one, build_in_memory(dbn_config(paths, instrument="7")))


def test_a_file_out_of_order_beyond_a_chunk_is_read_whole_and_still_exact(write_dbn, tmp_path):
    rec = make_records(np.arange(200) * 0.7, bid0_ticks=100 + np.arange(200) % 5)
    moved = rec[np.r_[np.arange(1, 150), 0, np.arange(150, 200)]]  # the first record 149 places late
    path = write_dbn(moved, "late.dbn")
    cfg = dbn_config([path], chunk_records=16)
    part = extract_file(FileJob(0, str(path), str(tmp_path / "spill"), None, 1.0, 16))
    assert part.read_whole
    ds = streamed(cfg)
    assert_same(ds, build_in_memory(cfg))
    assert ds.summary["files_read_whole"] == [str(path)]


# ------------------------------------------------------------ memory: the reader's bounds


@pytest.mark.parametrize("compress", [False, True])
def test_buffers_are_bounded_by_the_chunk_not_the_file(write_dbn, tmp_path, compress):
    """Files of 1x and 30x the chunk hold the same buffers: a chunk (the records carried from the
    last one included) and the pending decompressed bytes of one read."""
    chunk = 500
    for n in (chunk, 30 * chunk):
        rec = _jumbled(np.random.default_rng(n), make_records(np.arange(n) * 0.01), far=False)
        path = write_dbn(rec, f"n{n}.dbn" + (".zst" if compress else ""), compress=compress)
        with Mbp10Stream(path, chunk) as stream:
            n_read = sum(len(c) for _, c in stream.chunks())
            stats = stream.stats
        assert n_read == n
        assert stats.chunk_buffer_bytes == chunk * 368
        assert 0 < stats.max_pending_bytes <= (ZSTD_OUT if compress else _RAW_PIECE)
        part = extract_file(FileJob(0, str(path), str(tmp_path / f"s{n}"), None, 1.0, chunk))
        assert not part.read_whole
        assert 0 < part.max_held_records <= chunk

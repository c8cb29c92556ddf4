"""Feature cache keyed by data_hash, concurrent builders, config checks and `perception-data build`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from perception.data import check_data_config, data_hash, load_dataset
from perception.data.config import DataConfig, DataSource
from perception.errors import ConfigError

from tests.data.builders import dbn_config, make_records

CI = dict(n_snapshots=6000, window=32, window_stride=4, horizons=[2, 5, 10, 20, 40])


def test_hash_ignores_fold_and_follows_config_and_file_bytes(write_dbn, tmp_path):
    assert data_hash(DataConfig(**CI, fold=0)) == data_hash(DataConfig(**CI, fold=2, cache=False))
    assert data_hash(DataConfig(**CI)) != data_hash(DataConfig(**{**CI, "n_snapshots": 6001}))
    path = write_dbn(make_records(np.arange(30) + 0.5))
    before = data_hash(dbn_config([path]))
    moved = tmp_path / "elsewhere.dbn"
    shutil.copy(path, moved)
    assert data_hash(dbn_config([moved])) == before  # contents, not names
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    assert data_hash(dbn_config([path])) != before


def test_cache_is_built_once_and_shared_by_folds(perception_home):
    a = load_dataset(DataConfig(**CI, fold=0), progress=False)
    stamp = (a.cache_path / "meta.json").stat().st_mtime_ns
    b = load_dataset(DataConfig(**CI, fold=2), progress=False)
    assert a.cache_path == b.cache_path == perception_home / "cache" / a.data_hash
    assert (b.cache_path / "meta.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    np.testing.assert_array_equal(a.features, b.features)
    assert sorted(p.name for p in (perception_home / "cache").iterdir()) == [a.data_hash]


def test_an_incomplete_cache_is_rebuilt(perception_home):
    a = load_dataset(DataConfig(**CI), progress=False)
    (a.cache_path / "y.npy").unlink()  # as if a writer had been killed mid-way
    b = load_dataset(DataConfig(**CI), progress=False)
    np.testing.assert_array_equal(a.y, b.y)


_BUILD = """
import sys
from perception.data import load_dataset
from perception.data.config import DataConfig
ds = load_dataset(DataConfig(n_snapshots=120_000, window=64, horizons=[5, 300]), progress=False)
print(ds.data_hash, float(ds.features.sum()))
"""


def test_two_concurrent_builders_leave_one_valid_cache(perception_home):
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    entries = list((perception_home / "cache").iterdir())
    assert [e.name for e in entries] == [outs[0][0]]  # no temp directory left behind
    meta = json.loads((entries[0] / "meta.json").read_text())
    assert np.load(entries[0] / "features.npy", mmap_mode="r").shape == (meta["T"], meta["F"])


@pytest.mark.parametrize(
    "override, key",
    [
        ({"horizons": [10, 5]}, "data.horizons"),
        ({"horizons": [0, 5]}, "data.horizons"),
        ({"horizons": []}, "data.horizons"),
        ({"fold": 3}, "data.fold=3: expected an integer in 0..2"),
        ({"n_folds": 1, "fold": 0}, "data.n_folds=1"),
        ({"window": 0}, "data.window=0"),
        ({"window_stride": 0}, "data.window_stride=0"),
        ({"embargo": -1}, "data.embargo=-1"),
        ({"snapshot_interval": 0.0}, "data.snapshot_interval"),
        ({"max_gap": 0.5}, "data.max_gap"),
        ({"tick_size": -0.25}, "data.tick_size"),
        ({"workers": 0}, "data.workers=0: expected an integer >= 1"),
        ({"chunk_records": 0}, "data.chunk_records=0"),
        ({"source": DataSource.dbn}, "data.paths is empty"),
        ({"source": DataSource.dbn, "paths": ["/nonexistent/*.dbn.zst"]}, r"'/nonexistent/\*.dbn.zst' matches no file"),
        ({"source": "csv"}, "data.source='csv'"),
    ],
)
def test_config_errors_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        check_data_config(DataConfig(**{**CI, **override}))


def _cli(*args, env_home):
    import os

    env = {**os.environ, "PERCEPTION_HOME": str(env_home)}
    return subprocess.run(["perception-data", *args], capture_output=True, text=True, env=env, timeout=180)


def test_cli_builds_the_cache_and_reports_it(perception_home):
    res = _cli("build", "experiment=ci", "data.n_snapshots=5000", env_home=perception_home)
    assert res.returncode == 0, res.stderr
    expected = data_hash(DataConfig(**{**CI, "n_snapshots": 5000}))
    assert f"data_hash: {expected}" in res.stdout
    assert f"cache:     {perception_home / 'cache' / expected}" in res.stdout
    assert "T:         5000" in res.stdout and "F:         65" in res.stdout
    assert "build data" in res.stderr and "stage/s" in res.stderr  # the progress bar
    again = load_dataset(DataConfig(**{**CI, "n_snapshots": 5000}), progress=False)
    assert again.data_hash == expected and again.cache_path.is_dir()


def test_cli_exit_codes(perception_home, write_dbn, tmp_path):
    bad = _cli("build", "experiment=ci", "data.window_stride=0", env_home=perception_home)
    assert bad.returncode == 2 and "data.window_stride=0" in bad.stderr
    unknown = _cli("build", "data.bogus=1", env_home=perception_home)
    assert unknown.returncode == 2 and "data.bogus" in unknown.stderr
    assert _cli(env_home=perception_home).returncode == 2
    empty = tmp_path / "empty.dbn.zst"
    empty.write_bytes(b"")
    res = _cli("build", "data=dbn", f"data.paths=[{empty}]", "--no-progress", env_home=perception_home)
    assert res.returncode == 1 and f"{empty}: empty file" in res.stderr
    assert "Traceback" not in res.stderr


_BUILD_IMPORTS = """
import sys
from perception.train.data_cli import build
build(sys.argv[1:], progress=False)
heavy = sorted(m for m in ("torch", "mlflow", "sklearn", "scipy") if m in sys.modules)
print(",".join(heavy) or "none")
"""


def test_a_dbn_build_imports_neither_torch_nor_mlflow(perception_home, write_dbn):
    """`perception-data build` composes the training config (whose model and precision name torch
    types) but needs none of the trainer's libraries: ~1.5 s and ~230 MB of a build."""
    import os

    path = write_dbn(make_records(np.arange(400) * 0.5))
    env = {**os.environ, "PERCEPTION_HOME": str(perception_home)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _BUILD_IMPORTS,
            "data=dbn",
            f"data.paths=[{path}]",
            "data.window=8",
            "data.horizons=[1,5]",
            "data.window_stride=1",
            "data.n_folds=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "none"


# ------------------------------------------------------------ the key of DBN inputs


def _big_dbn(write_dbn, name="big.dbn"):
    return write_dbn(make_records(np.arange(20_000) * 0.5), name)  # 7.4 MB


def _flip(path, offset):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 1
    path.write_bytes(bytes(raw))


def _counting_reads(monkeypatch) -> list[int]:
    """Bytes read through perception.data.digests' open(), one entry per read."""
    from perception.data import digests

    read: list[int] = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            block = self.f.read(n)
            read.append(len(block))
            return block

    monkeypatch.setattr(digests, "open", lambda p, mode="r": Counting(open(p, mode)), raising=False)
    return read


def test_a_memoised_key_reads_no_input_byte_and_an_edit_or_replacement_always_misses(write_dbn, tmp_path, monkeypatch):
    """DVC's way: each input's full sha256 is memoised with the (size, mtime_ns, inode) it was computed
    for; the key reads a file again only when that triple changed."""
    import os

    from perception.data.digests import DIGESTS_FILE

    path = _big_dbn(write_dbn)
    memo = tmp_path / "cache" / DIGESTS_FILE
    read = _counting_reads(monkeypatch)
    key = data_hash(dbn_config([path]), memo)
    assert sum(read) == path.stat().st_size  # computed once, whole
    read.clear()
    assert data_hash(dbn_config([path]), memo) == key and sum(read) == 0  # a pod: no input byte read
    assert data_hash(dbn_config([path])) == key  # the memo changes no key

    st = path.stat()
    _flip(path, st.st_size // 2)  # edited in place, same size: a new mtime
    assert path.stat().st_size == st.st_size and data_hash(dbn_config([path]), memo) != key
    _flip(path, st.st_size // 2)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old bytes and mtime again: the old key
    assert data_hash(dbn_config([path]), memo) == key

    other = tmp_path / "replacement.dbn"
    raw = bytearray(path.read_bytes())
    raw[st.st_size // 3] ^= 1
    other.write_bytes(bytes(raw))
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)  # same name, size and mtime; another inode
    assert path.stat().st_ino != st.st_ino and data_hash(dbn_config([path]), memo) != key

    memo.write_text('{"' + str(path) + '": {"stamp": [1, 2, 3], "sha256": "not a digest"}}')  # untrusted
    read.clear()
    assert data_hash(dbn_config([path]), memo) != key and sum(read) == path.stat().st_size


def test_the_key_follows_every_byte_and_the_size_not_name_workers_or_chunks(write_dbn, tmp_path):
    path = _big_dbn(write_dbn)
    key = data_hash(dbn_config([path]))
    moved = tmp_path / "copy.dbn"
    shutil.copy(path, moved)
    assert data_hash(dbn_config([moved], workers=2, chunk_records=77)) == key
    size = path.stat().st_size
    for offset in (10, size // 2 + 100, size - 1):  # the header, the middle, the last byte
        probe = tmp_path / f"probe{offset}.dbn"
        shutil.copy(path, probe)
        _flip(probe, offset)
        assert data_hash(dbn_config([probe])) != key, offset
    longer = tmp_path / "longer.dbn"
    longer.write_bytes(path.read_bytes() + bytes(368))
    assert data_hash(dbn_config([longer])) != key


def test_a_training_finds_the_cache_without_reading_the_records(write_dbn, perception_home, monkeypatch):
    from perception.data import dataset, ingest

    path = _big_dbn(write_dbn)
    cfg = dbn_config([path], cache=True)
    built = load_dataset(cfg, progress=False)
    monkeypatch.setattr(ingest, "extract_all", lambda *a, **k: pytest.fail("the files were read again"))
    again = load_dataset(cfg, progress=False)
    assert again.cache_path == built.cache_path and again.data_hash == dataset.data_hash(cfg)
    np.testing.assert_array_equal(again.features, built.features)

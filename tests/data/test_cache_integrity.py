"""The feature cache trusts no sampled bytes and keeps no dead builds, through `perception-data build`:
a `.dbn` edited in place (same size, bytes the old key's sampled blocks never read) is read again, not
served from the stale cache; a build killed mid-way leaves a temp directory that the next build
removes, with a notice; a build still running keeps its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import numpy as np

from perception.data.dataset import BUILD_LOCK, remove_stale_builds
from perception.data.dbn_io import MBP10_DTYPE, read_mbp10
from tests.data.builders import make_records

DBN_ARGS = ["data.window=8", "data.horizons=[1,5]", "data.window_stride=1", "data.n_folds=2", "--no-progress"]
LEVEL0_BID_SZ = MBP10_DTYPE.fields["bid_sz_00"][1]  # its offset in a record


def data_cli(home, *args: str, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "PERCEPTION_HOME": str(home)}
    return subprocess.run(["perception-data", *args], capture_output=True, text=True, env=env, timeout=300)


def built_hash(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr[-3000:]
    return re.search(r"^data_hash: (\w+)$", res.stdout, re.M).group(1)


def test_a_dbn_edited_in_place_between_sampled_blocks_is_read_again(perception_home, write_dbn):
    records = make_records(np.arange(20_000) * 0.5)
    path = write_dbn(records, "book.dbn")  # 7.4 MB: the old key read 1.3 MB of it
    args = ["build", "data=dbn", f"data.paths=[{path}]", *DBN_ARGS]
    first = built_hash(data_cli(perception_home, *args))
    assert built_hash(data_cli(perception_home, *args)) == first  # unchanged: found, not rebuilt

    size, n = path.stat().st_size, len(records)
    record = size - n * MBP10_DTYPE.itemsize + (n // 2 + 37) * MBP10_DTYPE.itemsize  # far from any old sampled block
    raw = bytearray(path.read_bytes())
    raw[record + LEVEL0_BID_SZ] ^= 0x04  # one order-book size changed, as a re-download's correction would
    path.write_bytes(bytes(raw))
    assert path.stat().st_size == size
    changed = read_mbp10(path).records["bid_sz_00"]
    assert int((changed != records["bid_sz_00"]).sum()) == 1  # a valid file, one size edited

    second = data_cli(perception_home, *args)
    assert built_hash(second) != first
    cached = sorted(p.name for p in (perception_home / "cache").iterdir() if not p.name.startswith("."))
    assert cached == sorted([first, built_hash(second)])
    old = np.load(perception_home / "cache" / first / "features.npy")
    new = np.load(perception_home / "cache" / built_hash(second) / "features.npy")
    assert old.shape == new.shape and not np.array_equal(old, new)  # the edit reached the features


def test_a_killed_build_leaves_a_temp_directory_the_next_build_removes(perception_home):
    args = ["build", "experiment=ci", "data.n_snapshots=1500000", "--no-progress"]
    env = {**os.environ, "PERCEPTION_HOME": str(perception_home)}
    cache = perception_home / "cache"
    proc = subprocess.Popen(["perception-data", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(cache.glob(f".*.tmp/{BUILD_LOCK}")):
            assert proc.poll() is None, "the build ended before it could be killed"
            assert time.monotonic() < deadline, "no temp build directory within 120 s"
            time.sleep(0.02)
        (tmp,) = cache.glob(".*.tmp")
        assert remove_stale_builds(cache) == [] and tmp.is_dir()  # its builder runs: kept
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert tmp.is_dir() and (tmp / BUILD_LOCK).exists()  # what a kill leaves

    lockless = cache / ".0123abcd.lockless.tmp"  # a builder killed before it took its lock
    lockless.mkdir()
    (lockless / "features.npy").write_bytes(bytes(1000))
    os.utime(lockless, (time.time() - 3600, time.time() - 3600))

    res = data_cli(perception_home, "build", "experiment=ci", "data.n_snapshots=5000", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"removed the stale feature-cache build {tmp} (" in res.stderr and "its builder is gone" in res.stderr
    assert f"removed the stale feature-cache build {lockless} (" in res.stderr and "no builder recorded" in res.stderr
    assert list(cache.glob(".*.tmp")) == []

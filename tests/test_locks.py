"""perception.locks with real processes: a live holder refuses others by name, a holder killed -9 (or
one elsewhere whose heartbeat stopped) is taken over with a notice, racing takers get one winner, and a
holder whose lock was taken over stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from perception.locks import HEARTBEAT_ENV, STALE_ENV, Lock, LockHeld, read_holder

# Holds the lock at argv[1] until argv[2] exists; says "held" or "refused: <message>" on stdout.
HOLDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from perception.locks import Lock, LockHeld
    lock = Lock(Path(sys.argv[1]), "sweep test")
    try:
        lock.acquire()
    except LockHeld as exc:
        print("refused:", exc, flush=True)
        sys.exit(2)
    print("held", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
    lock.release()
""")
FAST = {HEARTBEAT_ENV: "0.1", STALE_ENV: "0.5"}


def start_holder(tmp_path: Path, lock: Path, release: Path, env: dict | None = None) -> subprocess.Popen:
    script = tmp_path / "holder.py"
    if not script.exists():  # rewritten while a holder starts, it would read an empty script
        script.write_text(HOLDER)
    return subprocess.Popen(
        [sys.executable, str(script), str(lock), str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def killed_holder(tmp_path: Path, lock: Path, release: Path) -> subprocess.Popen:
    """A holder that took the lock and was killed -9: its lock file is left behind."""
    holder = start_holder(tmp_path, lock, release)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait(timeout=60)
    return holder


def wait_until(condition, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:.0f} s"
        time.sleep(0.02)


@pytest.fixture
def fast(monkeypatch):
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)


def test_a_live_holder_refuses_a_second_taker_naming_itself(tmp_path):
    lock, release = tmp_path / "sweep.lock", tmp_path / "release"
    holder = start_holder(tmp_path, lock, release)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld) as refused:
            Lock(lock, "sweep test").acquire()
        h = refused.value.holder
        assert h.pid == holder.pid and h.host == os.uname().nodename and "holder.py" in h.command
        assert f"pid {holder.pid} on host {h.host} since {h.started}" in str(refused.value)
        assert str(lock) in str(refused.value) and h.started.endswith("UTC")
    finally:
        release.touch()
        holder.wait(timeout=60)
    assert holder.returncode == 0 and not lock.exists()  # released: nothing left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["holder.py", "release"]


def test_a_holder_killed_9_is_taken_over_with_a_notice(tmp_path):
    lock, release = tmp_path / "sweep.lock", tmp_path / "release"
    holder = killed_holder(tmp_path, lock, release)
    assert read_holder(lock).pid == holder.pid  # left behind by the kill
    notices: list[str] = []
    with Lock(lock, "sweep test", say=notices.append) as taken:
        assert read_holder(lock) == taken.holder and taken.holder.pid == os.getpid()
    [notice] = notices
    assert f"taking over the lock of sweep test from pid {holder.pid}" in notice and "no longer runs" in notice
    assert not lock.exists()


def _foreign_lock(lock: Path) -> None:
    """A lock file written by a process on another machine (its pid means nothing here)."""
    lock.write_text(
        json.dumps(
            {
                "pid": 4242,
                "host": "node-7",
                "started": "2026-01-01 00:00:00 UTC",
                "command": "perception-train sweep_id=x",
                "token": "t",
                "machine": "node-7|boot|pid:[1]",
                "pid_start": 1,
            }
        )
    )


def test_a_holder_elsewhere_whose_heartbeat_stopped_is_taken_over(tmp_path, fast):
    lock = tmp_path / "run.lock"
    _foreign_lock(lock)
    os.utime(lock, (time.time() - 60, time.time() - 60))
    notices: list[str] = []
    with Lock(lock, "run x", say=notices.append):
        assert read_holder(lock).pid == os.getpid()
    [notice] = notices
    assert "from pid 4242 on host node-7" in notice and "no heartbeat for" in notice


def test_a_holder_elsewhere_that_beats_is_alive(tmp_path, fast):
    lock, stop = tmp_path / "run.lock", threading.Event()
    _foreign_lock(lock)
    os.utime(lock, (time.time() - 60, time.time() - 60))  # looks old: another clock, but it beats

    def beat():
        while not stop.wait(0.1):
            os.utime(lock)

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        with pytest.raises(LockHeld, match="pid 4242 on host node-7"):
            Lock(lock, "run x").acquire()
    finally:
        stop.set()
        beating.join()


def test_racing_takers_of_a_dead_holders_lock_get_one_winner(tmp_path):
    lock, release = tmp_path / "sweep.lock", tmp_path / "release"
    killed_holder(tmp_path, lock, release)
    takers = [start_holder(tmp_path, lock, release) for _ in range(4)]
    try:
        outs = [t.stdout.readline().strip() for t in takers]
        assert outs.count("held") == 1, outs
        assert all(o.startswith("refused: sweep test is in use by pid ") for o in outs if o != "held"), outs
        winner = takers[outs.index("held")]
        assert read_holder(lock).pid == winner.pid
    finally:
        release.touch()
        for t in takers:
            t.wait(timeout=60)
    assert not lock.exists()


def test_a_holder_whose_lock_was_taken_over_is_told_and_the_new_holder_keeps_it(tmp_path, fast):
    lock, lost = tmp_path / "run.lock", []
    first = Lock(lock, "run x", on_lost=lost.append)
    first.acquire()
    try:
        lock.unlink()  # as a taker does that judged it gone (a node cut off from the volume)
        second = Lock(lock, "run x")
        second.acquire()
        wait_until(lambda: lost, "the first holder noticing")
        assert "lost the lock of run x" in lost[0] and f"by pid {os.getpid()}" in lost[0]
    finally:
        first.release()
    assert read_holder(lock) == second.holder  # the first one's release left the new lock alone
    second.release()
    assert not lock.exists()


def test_a_bad_heartbeat_setting_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(HEARTBEAT_ENV, "soon")
    with pytest.raises(Exception, match=f"{HEARTBEAT_ENV}='soon': expected seconds > 0"):
        Lock(tmp_path / "x.lock", "run x")


def test_sync_leaves_a_run_in_use_alone(tmp_path):
    from perception.locks import run_lock
    from perception.tracking import RunLedger, replay_unsent

    run_dir = tmp_path / "runs" / "s" / "shared-f0"
    ledger = RunLedger(run_dir, "http://127.0.0.1:9")
    ledger.record("metrics", step=0, values={"val_auc_mean": 0.6})
    with run_lock(run_dir, "s"):  # its trainer sends its own ledger: sync must not send it a second time
        with pytest.raises(RuntimeError, match=f"shared-f0: run shared-f0 of sweep s is in use by pid {os.getpid()}"):
            replay_unsent("s", tmp_path, "http://127.0.0.1:9")
    assert len(ledger.unsent()) == 1

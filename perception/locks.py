"""One writer per sweep and per run: an exclusive lock file that names its holder, kept fresh by a
heartbeat.

Mechanism: the lock file is created whole by link(2) of a private file (atomic on a local disk and on
the NFSv3+/EFS/CephFS volumes a workflow mounts ReadWriteMany: the NFS-safe recipe of open(2)), and
its holder touches its mtime every HEARTBEAT_S. Not fcntl locks: on NFS mounted `nolock` they lock
only the local node, silently, and a process drops them when it closes any descriptor of the file.

A lock whose holder is gone is taken over, with a one-line notice:
- a holder on this machine (same host, boot and pid namespace) is gone when its pid no longer runs
  (or is another process now: its start time differs);
- a holder elsewhere is gone when its heartbeat stands still for STALE_S, watched on this machine's
  own monotonic clock, so the nodes' clocks need not agree.
Takers of one stale lock remove it one at a time (an O_EXCL takeover file), so exactly one wins.
A holder whose lock was taken over (it looked gone: a node cut off from the volume, a process stopped
for longer than STALE_S) finds out at its next heartbeat and exits at once, writing nothing more.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from perception.errors import ConfigError, PerceptionError

HEARTBEAT_ENV, STALE_ENV = "PERCEPTION_LOCK_HEARTBEAT_S", "PERCEPTION_LOCK_STALE_S"
DEFAULT_HEARTBEAT_S, DEFAULT_STALE_S = 5.0, 30.0
EXIT_LOST = 1  # the process exits with this when its lock was taken over
_ATTEMPTS = 8  # takeovers raced by other takers: give up (as held) after this many rounds


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started: str  # when it took the lock, UTC
    command: str
    token: str  # unique per acquisition
    machine: str = ""  # host, boot id and pid namespace: where `pid` names this process
    pid_start: Optional[int] = None  # the pid's start in clock ticks since boot (Linux): a reused pid differs

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} since {self.started} ({self.command})"

    @classmethod
    def me(cls) -> "Holder":
        argv = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
        return cls(
            os.getpid(),
            socket.gethostname(),
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
            shlex.join(argv),
            uuid.uuid4().hex,
            _machine(),
            _pid_start(os.getpid()),
        )


class LockHeld(PerceptionError):
    """Another live process holds the lock; `holder` says which (pid, host, start time, command)."""

    def __init__(self, what: str, path: Path, holder: Holder):
        super().__init__(f"{what} is in use by {holder.describe()}; lock file {path}")
        self.what, self.path, self.holder = what, path, holder


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _exit_lost(message: str) -> None:
    _say(message)
    os._exit(EXIT_LOST)  # from the heartbeat thread: no cleanup may write over the new holder's work


class Lock:
    """`with Lock(path, "sweep x"):` holds `path` for the block, or raises LockHeld naming the holder."""

    def __init__(
        self, path: Path, what: str, say: Callable[[str], None] = _say, on_lost: Callable[[str], None] = _exit_lost
    ):
        self.path, self.what, self.say, self.on_lost = Path(path), what, say, on_lost
        self.heartbeat_s = _seconds(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)
        self.stale_s = max(_seconds(STALE_ENV, DEFAULT_STALE_S), 2 * self.heartbeat_s)
        self.holder: Optional[Holder] = None
        self._fd: Optional[int] = None
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # ---- taking and giving back ------------------------------------------------------------------
    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = Holder.me()
        mine = self.path.with_name(f".{self.path.name}.{me.token}")
        fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, json.dumps(asdict(me), indent=2).encode() + b"\n")
            os.fsync(fd)
            holder = None
            for _ in range(_ATTEMPTS):
                if self._link(mine, fd):
                    self._fd, self.holder = fd, me
                    break
                seen = _read(self.path)
                if seen is None:  # released meanwhile: try again
                    continue
                holder, st = seen
                verdict = self._judge(holder, st)
                if verdict == _ALIVE:
                    raise LockHeld(self.what, self.path, holder)
                if verdict != _CHANGED and self._remove(holder, st):
                    self.say(f"[perception] taking over the lock of {self.what} from {holder.describe()}: {verdict}")
            else:
                if holder is None:
                    raise PerceptionError(
                        f"{self.path}: could not take the lock of {self.what} in {_ATTEMPTS} "
                        f"attempts (other processes kept taking and releasing it)"
                    )
                raise LockHeld(self.what, self.path, holder)
        except BaseException:
            if self._fd is None:
                os.close(fd)
            raise
        finally:
            mine.unlink(missing_ok=True)  # the lock file keeps the inode
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, args=(fd,), name=f"lock {self.path.name}", daemon=True)
        self._beat.start()

    def release(self) -> None:
        if self._fd is None:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        try:
            if self._is_mine(self._fd):
                self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd, self.holder = None, None

    # ---- internals ---------------------------------------------------------------------------------
    def _link(self, mine: Path, fd: int) -> bool:
        try:
            os.link(mine, self.path)
            return True
        except FileExistsError:
            return os.fstat(fd).st_nlink == 2  # NFS: a lost reply to a link that did succeed

    def _judge(self, holder: Holder, st: os.stat_result) -> str:
        """_ALIVE, _CHANGED (another lock file replaced it meanwhile) or why its holder is gone."""
        if holder.machine and holder.machine == _machine():
            return _ALIVE if _running(holder) else "that process no longer runs"
        age = time.time() - st.st_mtime
        if age < 2 * self.heartbeat_s:
            return _ALIVE
        watch = min(self.stale_s, max(2 * self.heartbeat_s, self.stale_s - age))
        deadline = time.monotonic() + watch
        while time.monotonic() < deadline:
            time.sleep(min(self.heartbeat_s / 4, max(0.0, deadline - time.monotonic())))
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                return _CHANGED
            if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
                return _CHANGED
            if now.st_mtime_ns != st.st_mtime_ns:
                return _ALIVE
        return f"no heartbeat for {age + watch:.0f} s"

    def _remove(self, holder: Holder, st: os.stat_result) -> bool:
        """Removes the lock file judged stale, and only that one: True when it did. One taker at a time
        (the takeover file), so a taker that judged late cannot remove the lock a faster one just took."""
        guard = self.path.with_name(self.path.name + ".takeover")
        try:
            os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            self._wait_for_taker(guard)
            return False
        try:
            seen = _read(self.path)
            if (
                seen is None
                or seen[0].token != holder.token
                or (seen[1].st_ino, seen[1].st_dev) != (st.st_ino, st.st_dev)
            ):
                return False  # released, or taken over meanwhile
            self.path.unlink()
            return True
        finally:
            guard.unlink(missing_ok=True)

    def _wait_for_taker(self, guard: Path) -> None:
        """Another taker holds the takeover file for a moment; one that died holding it is cleared."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                age = time.time() - os.stat(guard).st_mtime
            except FileNotFoundError:
                return
            time.sleep(0.02)
        if age > self.stale_s:
            guard.unlink(missing_ok=True)

    def _is_mine(self, fd: int) -> bool:
        now, mine = os.stat(self.path), os.fstat(fd)
        return (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev)

    def _heartbeat(self, fd: int) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self._is_mine(fd):
                    raise FileNotFoundError(self.path)
                os.utime(fd)
            except FileNotFoundError:
                seen = _read(self.path)
                by = f" by {seen[0].describe()}" if seen else ""
                self.on_lost(
                    f"[perception] lost the lock of {self.what} ({self.path}): taken over{by}; "
                    f"stopping without writing more"
                )
                return
            except OSError:  # a passing error of the volume: beat again next time
                continue


_ALIVE, _CHANGED = "alive", "changed"
SWEEP_LOCK, RUN_LOCK = "sweep.lock", "run.lock"


def sweep_lock(sweep_dir: Path, sweep_id: str) -> Lock:
    """Held by `perception-sweep local` and `prepare` on runs/<sweep_id>/ for their lifetime."""
    return Lock(Path(sweep_dir) / SWEEP_LOCK, f"sweep {sweep_id}")


def run_lock(run_dir: Path, sweep_id: str) -> Lock:
    """Held by `perception-train` on its run directory while it trains."""
    return Lock(Path(run_dir) / RUN_LOCK, f"run {Path(run_dir).name} of sweep {sweep_id}")


def read_holder(path: Path) -> Optional[Holder]:
    """Who holds the lock at `path` now, if anyone (for messages; the lock decides nothing by it)."""
    seen = _read(Path(path))
    return seen[0] if seen else None


def _read(path: Path) -> Optional[tuple[Holder, os.stat_result]]:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(text)
        return Holder(**{k: fields[k] for k in Holder.__dataclass_fields__ if k in fields}), st
    except (ValueError, TypeError):  # not one of ours: judged by its mtime alone
        return Holder(0, "unknown", "unknown", f"unreadable lock file {path}", ""), st


def _running(holder: Holder) -> bool:
    if holder.pid_start is not None:
        return _pid_start(holder.pid) == holder.pid_start
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_start(pid: int) -> Optional[int]:
    """Field 22 of /proc/<pid>/stat (start time); None where there is no /proc or the pid is a zombie."""
    try:
        after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if after_name[0] in ("Z", "X") else int(after_name[19])


def _machine() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        boot, pid_ns = "", ""
    return f"{socket.gethostname()}|{boot}|{pid_ns}"


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{name}={text!r}: expected seconds > 0")
    return value

"""Loaded by every Python process started with this folder on PYTHONPATH and WRITE_AUDIT_LOG set:
records, one line each, every path the process opens for writing, creates, renames onto, removes or
changes, through Python's audit hooks (PEP 578), and every program it starts."""

import os
import sys

_LOG = os.environ.get("WRITE_AUDIT_LOG")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# event -> (index of the path written, index of the dir_fd it is relative to, or None)
_WRITES = {
    "os.mkdir": (0, 2),
    "os.remove": (0, 1),
    "os.rmdir": (0, 1),
    "os.chmod": (0, 2),
    "os.chown": (0, 3),
    "os.utime": (0, 3),
    "os.truncate": (0, None),
    "os.rename": (1, 3),
    "os.replace": (1, 3),
    "os.symlink": (1, 2),
    "os.link": (1, 3),
    "tempfile.mkdtemp": (0, None),
    "tempfile.mkstemp": (0, None),
    "sqlite3.connect": (0, None),
}


def _text(path):
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return path if isinstance(path, str) and path not in ("", ":memory:") else None


def _absolute(path, dir_fd=None):
    """Relative paths resolve against their dir_fd (shutil.rmtree's removals) or the working directory."""
    path = _text(path)
    if path is None or os.path.isabs(path):
        return path
    base = os.readlink(f"/proc/self/fd/{dir_fd}") if isinstance(dir_fd, int) and dir_fd >= 0 else os.getcwd()
    return os.path.join(base, path)


def _written(event, args):
    """(path, dir_fd) the event writes, or None."""
    if event == "open":
        path, mode, flags = (list(args) + [None, None, None])[:3]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        ):
            return path, None
    elif event in _WRITES:
        i, j = _WRITES[event]
        return args[i], (args[j] if j is not None and j < len(args) else None)
    return None


if _LOG:
    _fd = os.open(_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _busy = [False]

    def _hook(event, args):
        if _busy[0]:
            return
        _busy[0] = True
        try:
            if event == "subprocess.Popen":
                os.write(_fd, f"exec\t{args[0]}\n".encode())
            else:
                written = _written(event, args)
                path = _absolute(*written) if written else None
                if path is not None:
                    os.write(_fd, f"{event}\t{path}\n".encode())
        except Exception:  # a hook that raises would fail the audited call
            pass
        finally:
            _busy[0] = False

    sys.addaudithook(_hook)

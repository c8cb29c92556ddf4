"""`train.log` in the run directory: what the run wrote to stdout and stderr, and its log records,
kept beside the checkpoints and uploaded with the run (a pod's own log vanishes with the pod).

Python-level: print, warnings, tqdm and logging reach the file (MLflow's INFO lines the file only, not
the terminal); output written by C code straight
to file descriptors 1 and 2 does not. A retried or resumed run appends to the same file.
Carriage-return frames (progress bars drawn on a terminal) reach the file as their last frame only.

A stream that already writes into the log (a sweep's lane sends a training's stdout and stderr there,
C-level output and errors before the run included) is not copied again, nor is a log record that a
handler already writes through it: every line is in the file once.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO, cast

from perception.mlflow_logs import mlflow_info_into

LOG_FILE = "train.log"


class _LineFile:
    """Writes whole lines to the log; of a line redrawn with '\\r', only what follows the last one."""

    def __init__(self, f: TextIO):
        self.f, self.partial = f, ""

    def write(self, text: str) -> None:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self.f.write(line.rsplit("\r", 1)[-1].rstrip() + "\n")
        if "\r" in self.partial:  # a bar redrawn for hours: keep its last frame, not every frame
            self.partial = self.partial[self.partial.rindex("\r") :]
        self.f.flush()

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        if self.partial.rsplit("\r", 1)[-1].strip():
            self.write("\n")
        self.f.close()


class _Tee:
    """A text stream that writes to the original stream and to the log."""

    def __init__(self, stream: TextIO, log: _LineFile):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:  # progress bars decide on the terminal, not on the log
        return self.stream.isatty()

    def __getattr__(self, name):  # encoding, fileno, … of the original stream
        return getattr(self.stream, name)


class RunLog:
    """Context manager: tees sys.stdout and sys.stderr into `path` and sends log records there too."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self) -> "RunLog":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = _LineFile(open(self.path, "a", encoding="utf-8", errors="replace"))
        self._file.write(f"---- {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC: {' '.join(sys.argv)}\n")
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = (self._tee(stream) for stream in self._saved)
        self._handler = logging.StreamHandler(self._file)  # type: ignore[arg-type]
        self._handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        root = logging.getLogger()
        if not any(isinstance(h, logging.StreamHandler) and self._is_log(h.stream) for h in root.handlers):
            root.addHandler(self._handler)
        self._mlflow = mlflow_info_into(self._file)  # type: ignore[arg-type]
        self._mlflow.__enter__()  # MLflow's INFO lines here only, not on the terminal
        return self

    def _tee(self, stream: TextIO) -> TextIO:
        """`stream`, copied into the log unless it writes there already (then line-buffered, so its lines
        reach the file in order with the log's own and survive a kill)."""
        if not self._is_log(stream):
            return cast(TextIO, _Tee(stream, self._file))  # it has what print, tqdm and logging call
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
        return stream

    def _is_log(self, stream) -> bool:
        """The stream's file descriptor is the log file itself."""
        try:
            return os.path.samestat(os.fstat(stream.fileno()), os.stat(self.path))
        except (AttributeError, OSError, ValueError):  # no descriptor (a StringIO, pytest's capture): not it
            return False

    def exception(self, exc: BaseException) -> None:
        """The traceback, into the log only: Python prints it to the terminal after the run has
        already uploaded its log."""
        self._file.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def __exit__(self, *exc) -> None:
        self._mlflow.__exit__(None, None, None)
        logging.getLogger().removeHandler(self._handler)
        sys.stdout, sys.stderr = self._saved
        self._file.close()

"""train.log keeps what a run printed, without progress-bar frames; progress off a terminal is plain
lines; a pinned PERCEPTION_GIT_SHA wins over git."""

from __future__ import annotations

import io
import logging
import sys

from perception import gitinfo
from perception.train.progress import PlainProgress, progress
from perception.train.runlog import RunLog


def test_the_log_gets_prints_records_and_the_last_frame_of_a_redrawn_line(tmp_path, capsys):
    path = tmp_path / "train.log"
    with RunLog(path) as log:
        print("epoch 1 done")
        sys.stderr.write("\r 10%|#    |\r 50%|###  |\r100%|#####|")
        sys.stderr.write("\n")
        logging.getLogger("perception.test").warning("low disk")
        try:
            raise ValueError("boom")
        except ValueError as exc:
            log.exception(exc)
    print("after the run")
    lines = path.read_text().splitlines()
    assert lines[0].startswith("---- ")
    assert "epoch 1 done" in lines and "100%|#####|" in lines
    assert not any("\r" in ln for ln in lines)
    assert any(ln.endswith("- low disk") for ln in lines)
    assert "ValueError: boom" in lines
    assert "after the run" not in path.read_text()
    out = capsys.readouterr()
    assert "epoch 1 done" in out.out and "after the run" in out.out and "\r 50%" in out.err  # the terminal keeps all

    with RunLog(path):
        print("second attempt")
    assert path.read_text().count("---- ") == 2 and "second attempt" in path.read_text()


def test_progress_off_a_terminal_is_periodic_plain_lines():
    stream = io.StringIO()
    bar = progress(100, "shared-f0 epoch 1/3", enabled=True, stream=stream)
    assert isinstance(bar, PlainProgress)
    bar.interval = 0.0
    bar.set_postfix(loss="0.6931", samples_s="1234")
    bar.update(24)
    bar.close()
    assert stream.getvalue() == "shared-f0 epoch 1/3: 24/100 batches (24%), loss=0.6931 samples_s=1234\n"

    quiet = io.StringIO()
    off = progress(100, "x", enabled=False, stream=quiet)
    off.update(100)
    assert quiet.getvalue() == ""


def test_a_pinned_git_sha_wins_over_git(monkeypatch):
    gitinfo.git_sha.cache_clear()
    monkeypatch.setenv("PERCEPTION_GIT_SHA", "pinned0123")
    try:
        assert gitinfo.git_sha() == "pinned0123"
        gitinfo.git_sha.cache_clear()
        monkeypatch.delenv("PERCEPTION_GIT_SHA")
        assert gitinfo.git_sha() != "pinned0123"
    finally:
        gitinfo.git_sha.cache_clear()


def test_a_stream_that_already_writes_into_the_log_is_not_copied_again(tmp_path, monkeypatch):
    """A sweep's lane sends the training's stdout and stderr into train.log itself: each line once."""
    path = tmp_path / "train.log"
    out = open(path, "a", encoding="utf-8")  # what the lane's child inherits as fds 1 and 2
    err = open(path, "a", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    console = logging.StreamHandler(out)  # Hydra's console handler, made before the run starts
    root = logging.getLogger()
    root.addHandler(console)
    try:
        with RunLog(path) as log:
            print("epoch 1 done")
            sys.stderr.write("a warning\n")
            logging.getLogger("perception.test").warning("low disk")
            try:
                raise ValueError("boom")
            except ValueError as exc:
                log.exception(exc)
    finally:
        root.removeHandler(console)
        out.close()
        err.close()
    lines = path.read_text().splitlines()
    for line in ("epoch 1 done", "a warning", "low disk", "ValueError: boom"):
        assert sum(line in ln for ln in lines) == 1, (line, lines)
    assert lines[0].startswith("---- ") and lines.index("epoch 1 done") < lines.index("a warning")

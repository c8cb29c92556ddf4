"""How every command ends: the one sweep-id rule and the one mapping from an error to an exit code and
its message (the commands themselves are run in their packages' tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perception.errors import ConfigError, DataError, PerceptionError
from perception.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, Terminated, exit_code
from perception.locks import Holder, LockHeld
from perception.paths import check_sweep_id


@pytest.mark.parametrize("sweep_id", ["a", "sweep-0123456789", "A.b_c-9", "x" * 63])
def test_sweep_ids_every_command_accepts(sweep_id):
    assert check_sweep_id(sweep_id) == sweep_id


@pytest.mark.parametrize("sweep_id", ["", None, "x" * 64, "-lead", ".hidden", "a/b", "../up", "a b", "a'b", "é", "a\n"])
def test_sweep_ids_every_command_refuses_naming_where(sweep_id):
    with pytest.raises(ConfigError, match=r"^-p sweep-id .*at most 63 characters, starting with a letter or digit"):
        check_sweep_id(sweep_id, "-p sweep-id")


def test_each_error_exits_with_its_code_and_one_line_naming_the_command(capsys):
    holder = Holder(1, "host", "2024-01-01 00:00:00 UTC", "perception-train", "t")
    cases = [
        (ConfigError("data.window=0: expected > 0"), {}, EXIT_USAGE, "prog: config error: data.window=0: expected > 0"),
        (ConfigError("bad"), {ConfigError: "error"}, EXIT_USAGE, "prog: error: bad"),
        (
            LockHeld("run x", Path("/r/lock"), holder),
            {},
            EXIT_USAGE,
            "prog: run x is in use by pid 1 on host host since 2024-01-01 00:00:00 UTC (perception-train); lock "
            "file /r/lock",
        ),
        (DataError("f.dbn: truncated"), {}, EXIT_FAILED, "prog: f.dbn: truncated"),
        (DataError("f.dbn: truncated"), {DataError: "data error"}, EXIT_FAILED, "prog: data error: f.dbn: truncated"),
        (PerceptionError("the gate refused"), {}, EXIT_FAILED, "prog: the gate refused"),
    ]
    for exc, labels, code, line in cases:
        assert exit_code(exc, "prog", labels) == code
        assert capsys.readouterr().err == line + "\n"


def test_a_stop_says_what_becomes_of_the_work(capsys):
    assert exit_code(Terminated("signal 15 (SIGTERM)"), "prog", stopped="re-run to continue") == EXIT_TERMINATED
    assert capsys.readouterr().err == "prog: terminated (SIGTERM); re-run to continue\n"
    assert exit_code(KeyboardInterrupt(), "prog", stopped="re-run to continue") == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "prog: interrupted; re-run to continue\n"

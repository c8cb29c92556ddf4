"""Fixtures of the data tests."""

from __future__ import annotations

import pytest

from perception.data.dbn_io import write_mbp10


@pytest.fixture
def write_dbn(tmp_path):
    """write_dbn(records, name) -> path of a real DBN MBP-10 file."""

    def _write(records, name="book.dbn", compress=False):
        path = tmp_path / name
        write_mbp10(path, records, compress=compress)
        return path

    return _write

"""Where the gate finds an A/A noise file: PERCEPTION_HOME's noise folder first (where
`perception-sweep calibrate` writes), then the files shipped with the package; the first file whose
horizons and `match` agree with the runs wins, and a file of one's own that does not match is passed over."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perception.errors import ConfigError
from perception.gate.noise import NOISE_DIR_ENV, noise_dir, matching_noise, shipped_dir
from perception.sweep.calibrate import noise_file_path

SHIPPED_CI = shipped_dir() / "ci.json"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PERCEPTION_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(NOISE_DIR_ENV, raising=False)
    return tmp_path / "home"


def shipped_ci() -> dict:
    return json.loads(SHIPPED_CI.read_text())


def runs_like_shipped_ci() -> dict[str, str]:
    """The params of runs the shipped ci.json was measured for."""
    return dict(shipped_ci()["match"])


def write_home_file(folder, name: str, **match_changes) -> None:
    doc = shipped_ci()
    doc["match"].update(match_changes)
    doc["arms"] = {"shared": {"cov": (np.eye(len(doc["horizons"])) * 0.02**2).tolist(), "n_cells": 7}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(doc))


def test_a_home_file_that_matches_wins_over_the_shipped_one(home):
    write_home_file(home / "noise", "ci.json")
    found = matching_noise(runs_like_shipped_ci(), shipped_ci()["horizons"])
    assert found.source == str(home / "noise" / "ci.json")
    assert found.n_cells == {"shared": 7} and found.covs["shared"][0, 0] == pytest.approx(0.02**2)


def test_the_shipped_file_is_used_when_the_home_has_none(home):
    horizons = shipped_ci()["horizons"]
    assert matching_noise(runs_like_shipped_ci(), horizons).source == str(SHIPPED_CI.resolve())  # no folder at all
    (home / "noise").mkdir(parents=True)
    assert matching_noise(runs_like_shipped_ci(), horizons).source == str(SHIPPED_CI.resolve())  # an empty one


def test_a_home_file_that_does_not_match_falls_through_to_the_shipped_one(home):
    write_home_file(home / "noise", "ci.json", **{"trainer.precision": "bf16"})  # another precision
    write_home_file(home / "noise", "ci_longer.json", **{"trainer.epochs": "9"})  # other epochs
    found = matching_noise(runs_like_shipped_ci(), shipped_ci()["horizons"])
    assert found.source == str(SHIPPED_CI.resolve())
    # runs at bf16: the home file of that precision applies; the shipped tf32 one never would
    bf16 = {**runs_like_shipped_ci(), "trainer.precision": "bf16"}
    assert matching_noise(bf16, shipped_ci()["horizons"]).source == str(home / "noise" / "ci.json")


def test_a_home_file_that_does_not_match_and_no_shipped_one_gives_none(home):
    write_home_file(home / "noise", "ci.json", **{"trainer.precision": "tf32"})
    fp32_runs = {**runs_like_shipped_ci(), "trainer.precision": "fp32"}  # neither file is at fp32
    assert matching_noise(fp32_runs, shipped_ci()["horizons"]) is None
    # other horizons than the runs': passed over too
    assert matching_noise(runs_like_shipped_ci(), [2, 5, 10]) is None


def test_the_noise_dir_variable_takes_the_home_folder_s_place(home, tmp_path, monkeypatch):
    write_home_file(home / "noise", "ci.json")
    write_home_file(tmp_path / "elsewhere", "ci.json")
    monkeypatch.setenv(NOISE_DIR_ENV, str(tmp_path / "elsewhere"))
    assert noise_dir() == tmp_path / "elsewhere"
    assert matching_noise(runs_like_shipped_ci(), shipped_ci()["horizons"]).source == str(
        tmp_path / "elsewhere" / "ci.json"
    )


def test_a_broken_home_file_is_named(home):
    (home / "noise").mkdir(parents=True)
    (home / "noise" / "ci.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"noise file .*ci\.json: unreadable"):
        matching_noise(runs_like_shipped_ci(), shipped_ci()["horizons"])
    (home / "noise" / "ci.json").write_text(json.dumps({"match": {}, "horizons": [2]}))
    with pytest.raises(ConfigError, match=r"noise file .*ci\.json: expected a noise file"):
        matching_noise(runs_like_shipped_ci(), shipped_ci()["horizons"])


def test_calibrate_writes_under_the_home_unless_told_to_write_into_the_package(home, tmp_path):
    assert noise_file_path("ci") == home / "noise" / "ci.json"
    assert noise_file_path("ci", into_package=True) == shipped_dir() / "ci.json"
    assert noise_file_path("ci", out=tmp_path / "x.json") == tmp_path / "x.json"
    with pytest.raises(ConfigError, match="--out .* and --into-package"):
        noise_file_path("ci", out=tmp_path / "x.json", into_package=True)

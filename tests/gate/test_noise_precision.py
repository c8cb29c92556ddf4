"""A/A noise files match on precision: a calibration at one trainer.precision is never used for runs at
another, and the shipped files name the precision they were measured at."""

from __future__ import annotations

import json

import numpy as np

from perception.gate.noise import MATCH_KEYS, matching_noise, shipped_dir

HORIZONS = [2, 5, 10, 20, 40]


def _write(folder, name, precision):
    match = {"experiment": "ci", "trainer.epochs": "2", "trainer.precision": precision}
    (folder / f"{name}.json").write_text(
        json.dumps(
            {
                "match": match,
                "horizons": HORIZONS,
                "source": name,
                "arms": {"shared": {"cov": (np.eye(5) * 1e-4).tolist(), "n_cells": 10}},
            }
        )
    )


def test_a_noise_file_applies_only_to_runs_at_its_precision(tmp_path):
    _write(tmp_path, "ci_tf32", "tf32")
    runs = {"experiment": "ci", "trainer.epochs": "2"}
    assert matching_noise({**runs, "trainer.precision": "tf32"}, HORIZONS, tmp_path).source.endswith("ci_tf32.json")
    assert matching_noise({**runs, "trainer.precision": "bf16"}, HORIZONS, tmp_path) is None
    assert matching_noise(runs, HORIZONS, tmp_path) is None  # a run without the param trained at fp32
    _write(tmp_path, "ci_fp32", "fp32")
    assert matching_noise(runs, HORIZONS, tmp_path).source.endswith("ci_fp32.json")


def test_every_shipped_noise_file_matches_on_every_key_precision_ssd_and_vsn_form_included():
    files = sorted(shipped_dir().glob("*.json"))
    assert files
    for path in files:
        match = json.loads(path.read_text())["match"]
        assert sorted(match) == sorted(MATCH_KEYS), path.name
        assert match["trainer.precision"] in ("fp32", "tf32", "bf16"), path.name
        assert match["model.mamba.ssd"] == "chunked", path.name  # trained on CPU, where only the chunked SSD runs
        assert match["model.vsn.fold_embed"] == "False", path.name  # the experiments' default there
        assert match["model.vsn.fused_grn"] == "False", path.name
        assert match["model.mamba.chunk"] in ("16", "64"), path.name  # experiment=ci's and local's

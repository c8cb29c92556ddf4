"""The precision study's verdicts (perception/studies/precision_quality.py): the single same-seed comparison,
and the paired equivalence test over several seeds per setting; end to end through studies/precision_quality.py
and the installed perception-train on CPU."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import t as student_t

from perception.studies.precision_quality import equivalence, form_of, overrides_of, summarise

ROOT = Path(__file__).resolve().parents[2]
FP32 = {0: 0.750, 1: 0.770, 2: 0.740, 3: 0.760}  # h10 AUC by seed: sd 0.0129


def rows(setting: str, deltas: dict[int, float]) -> list[dict]:
    return [dict(setting=setting, seed=s, auc={"10": FP32[s] + d}) for s, d in deltas.items()]


def fp32_rows() -> list[dict]:
    return rows("fp32", {s: 0.0 for s in FP32})


def test_the_interval_is_the_t_interval_of_the_paired_differences():
    deltas = [0.004, -0.002, 0.007]
    e = equivalence(deltas, margin=0.05)
    half = student_t.ppf(0.95, 2) * statistics.stdev(deltas) / math.sqrt(3)
    assert e["n"] == 3 and e["level"] == 0.90
    assert e["mean_delta"] == pytest.approx(0.003)
    assert e["interval"] == pytest.approx([0.003 - half, 0.003 + half])
    assert e["verdict"] == "holds"


@pytest.mark.parametrize(
    ("deltas", "verdict"),
    [
        ([0.001, -0.001, 0.002], "holds"),  # well inside ±0.01
        ([-0.030, -0.031, -0.029], "differs"),  # well below -0.01
        ([0.001, 0.015, -0.004], "inconclusive"),  # the interval straddles +0.01
    ],
)
def test_equivalence_verdicts(deltas, verdict):
    assert equivalence(deltas, margin=0.01)["verdict"] == verdict


def test_several_seeds_per_setting_are_paired_with_fp32_by_seed():
    sd = statistics.stdev(FP32.values())
    out = summarise(
        fp32_rows() + rows("tf32", {0: 0.001, 1: -0.001, 2: 0.0005}) + rows("bf16", {0: 0.040, 1: 0.038, 2: 0.041}),
        base_seed=0,
    )
    tf32, bf16 = out["settings"]["tf32"], out["settings"]["bf16"]
    assert out["fp32_spread"]["10"]["sd"] == pytest.approx(sd)
    assert tf32["seeds"] == [0, 1, 2]
    assert tf32["per_horizon"]["10"]["deltas"] == pytest.approx({"0": 0.001, "1": -0.001, "2": 0.0005})
    assert tf32["per_horizon"]["10"]["auc"] == pytest.approx(statistics.mean(FP32[s] for s in (0, 1, 2)) + 0.0005 / 3)
    assert tf32["verdict"] == "holds" and tf32["holds"]
    assert bf16["verdict"] == "differs" and not bf16["holds"]


def test_one_seed_keeps_the_same_seed_rule():
    sd = statistics.stdev(FP32.values())
    out = summarise(fp32_rows() + rows("small", {0: 0.5 * sd}) + rows("large", {0: 1.5 * sd}), base_seed=0)
    assert out["settings"]["small"]["verdict"] == "holds"
    assert out["settings"]["large"]["verdict"] == "differs"
    assert "equivalence" not in out["settings"]["small"]["per_horizon"]["10"]


def test_a_setting_run_without_its_fp32_pair_is_left_out():
    out = summarise(rows("fp32", {0: 0.0, 1: 0.0}) + rows("tf32", {0: 0.001, 3: 0.2}), base_seed=0)
    assert out["settings"]["tf32"]["seeds"] == [0]


def test_more_setting_seeds_than_fp32_seeds_is_refused():
    done = subprocess.run(
        [
            sys.executable,
            "studies/precision_quality.py",
            "--fp32-seeds",
            "2",
            "--setting-seeds",
            "3",
            "--settings",
            "tf32",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "--setting-seeds 3: expected 1 .. --fp32-seeds (2)" in done.stderr


def test_a_setting_names_the_ssd_backend_and_the_fused_grn_as_overrides():
    assert overrides_of("bf16+compiled+mamba") == [
        "trainer.precision=bf16",
        "model.compile_trunk=true",
        "model.mamba.ssd=mamba",
    ]
    assert overrides_of("tf32+fla+fusedgrn")[1:] == ["model.mamba.ssd=fla", "model.vsn.fused_grn=true"]
    assert overrides_of("bf16+folded")[1:] == ["model.vsn.fold_embed=true"]
    assert overrides_of("bf16+mamba+chunk128")[1:] == ["model.mamba.ssd=mamba", "model.mamba.chunk=128"]
    with pytest.raises(SystemExit, match=r"unknown part 'mambo'; expected fp32, tf32, bf16, compiled, fla, mamba"):
        overrides_of("bf16+mambo")


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def from_rows(tmp_path: Path, *files: Path, experiment: str = "local") -> subprocess.CompletedProcess:
    env = {**os.environ, "PERCEPTION_RESULTS": str(tmp_path / "out")}
    return subprocess.run(
        [
            sys.executable,
            "studies/precision_quality.py",
            "--experiment",
            experiment,
            "--tag",
            "joined",
            "--machine",
            "NVIDIA H200",
            "--from-rows",
            *map(str, files),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_studies_over_disjoint_seeds_join_into_the_verdict_of_all_their_runs(tmp_path):
    tf32 = {0: 0.001, 1: -0.001, 2: 0.0005, 3: 0.002}
    first = write_rows(tmp_path / "a.jsonl", [r for r in fp32_rows() + rows("tf32", tf32) if r["seed"] < 2])
    second = write_rows(tmp_path / "b.jsonl", [r for r in fp32_rows() + rows("tf32", tf32) if r["seed"] >= 2])
    done = from_rows(tmp_path, first, second)
    assert done.returncode == 0, done.stderr[-2000:]
    joined = json.loads((tmp_path / "out" / "joined.json").read_text())
    direct = summarise(fp32_rows() + rows("tf32", tf32), base_seed=0)
    assert joined["settings"] == direct["settings"] and joined["fp32_runs"] == 4
    assert joined["machine"] == "NVIDIA H200" and len(joined["runs"]) == 8


def test_joining_refuses_a_run_twice_and_a_run_of_another_experiment(tmp_path):
    a = write_rows(tmp_path / "a.jsonl", fp32_rows())
    b = write_rows(tmp_path / "b.jsonl", rows("fp32", {1: 0.0}))
    done = from_rows(tmp_path, a, b)
    assert done.returncode != 0 and f"{b}:1: fp32 seed 1 is also in {a}:2" in done.stderr
    other = write_rows(tmp_path / "c.jsonl", [dict(r, experiment="production") for r in fp32_rows()])
    done = from_rows(tmp_path, other)
    assert done.returncode != 0 and f"{other}:1: a run of experiment=production" in done.stderr
    broken = tmp_path / "d.jsonl"
    broken.write_text('{"setting": "fp32"\n')
    done = from_rows(tmp_path, broken)
    assert done.returncode != 0 and f"{broken}:1: expected a JSON run row" in done.stderr
    assert not (tmp_path / "out" / "joined.json").exists()


@pytest.mark.slow(seconds=160)
def test_paired_verdict_end_to_end_on_cpu(tmp_path):
    """On CPU tf32 is fp32 bit for bit, so every paired difference is 0 and the verdict must be `holds`."""
    env = {**os.environ, "PERCEPTION_RESULTS": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "studies/precision_quality.py",
            "--experiment",
            "ci",
            "--device",
            "cpu",
            "--fp32-seeds",
            "3",
            "--setting-seeds",
            "2",
            "--settings",
            "tf32",
            "--parallel",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "precision_quality_ci.json").read_text())
    tf32 = result["settings"]["tf32"]
    assert tf32["seeds"] == [0, 1] and len(result["runs"]) == 5
    for h, cell in tf32["per_horizon"].items():
        assert cell["deltas"] == {"0": 0.0, "1": 0.0}, h
        assert cell["equivalence"]["verdict"] == "holds", h
    assert tf32["verdict"] == "holds"
    forms = result["forms"]
    assert forms["tf32"]["trainer.precision"] == "tf32" and forms["fp32"]["trainer.precision"] == "fp32"
    assert forms["tf32"]["model.compile_trunk"] is False  # experiment=ci trains eager
    assert (tmp_path / "precision_quality_ci.png").stat().st_size > 0
    kept = tmp_path / "precision_quality_ci.rows.jsonl"  # each run as it finished: what a killed study keeps
    assert sorted((r["setting"], r["seed"]) for r in map(json.loads, kept.read_text().splitlines())) == [
        ("fp32", 0),
        ("fp32", 1),
        ("fp32", 2),
        ("tf32", 0),
        ("tf32", 1),
    ]


def test_fp32_runs_from_an_earlier_study_must_cover_the_seeds_and_come_from_this_gpu(tmp_path):
    def study(earlier: Path, seeds: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "studies/precision_quality.py", "--experiment", "local", "--device", "cpu"]
            + ["--fp32-seeds", str(seeds), "--setting-seeds", "2", "--settings", "bf16", "--fp32-from", str(earlier)],
            cwd=ROOT,
            env={**os.environ, "PERCEPTION_RESULTS": str(tmp_path / "out")},
            capture_output=True,
            text=True,
            timeout=120,
        )

    on_cpu = write_rows(tmp_path / "cpu.jsonl", [dict(r, machine="cpu") for r in fp32_rows()])
    done = study(on_cpu, seeds=6)
    assert done.returncode != 0 and f"--fp32-from {on_cpu}: no finished fp32 run at seed(s) [4, 5]" in done.stderr
    on_gpu = write_rows(tmp_path / "gpu.jsonl", [dict(r, machine="NVIDIA H100 80GB HBM3") for r in fp32_rows()])
    done = study(on_gpu, seeds=4)
    assert done.returncode != 0
    assert "its fp32 runs were made on ['NVIDIA H100 80GB HBM3'], expected this GPU, cpu" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_runs_form_is_read_from_its_resolved_config_and_a_missing_switch_is_named():
    config = {
        "trainer": {"precision": "bf16"},
        "model": {
            "compile_trunk": True,
            "mamba": {"ssd": "mamba", "chunk": 128},
            "vsn": {"fused_grn": False, "fold_embed": True},
        },
    }
    assert form_of(config, "run/config.yaml") == {
        "trainer.precision": "bf16",
        "model.compile_trunk": True,
        "model.mamba.ssd": "mamba",
        "model.mamba.chunk": 128,
        "model.vsn.fused_grn": False,
        "model.vsn.fold_embed": True,
    }
    del config["model"]["vsn"]["fold_embed"]
    with pytest.raises(ValueError, match=r"run/config.yaml: no model.vsn.fold_embed in the run's resolved config"):
        form_of(config, "run/config.yaml")


def test_a_verdict_names_what_each_setting_trained_and_refuses_a_setting_of_two_forms(tmp_path):
    eager = {"trainer.precision": "fp32", "model.compile_trunk": False}
    compiled = {"trainer.precision": "fp32", "model.compile_trunk": True}
    assert summarise(fp32_rows() + rows("tf32", {0: 0.0}), base_seed=0)["forms"] == {"fp32": None, "tf32": None}
    one_form = [dict(r, form=eager) for r in fp32_rows()]
    assert summarise(one_form, base_seed=0)["forms"] == {"fp32": eager}
    mixed = write_rows(tmp_path / "mixed.jsonl", one_form[:2] + [dict(r, form=compiled) for r in fp32_rows()[2:]])
    done = from_rows(tmp_path, mixed)
    assert done.returncode != 0
    assert "setting fp32: its runs trained different forms" in done.stderr
    assert '"model.compile_trunk": true' in done.stderr
    old = write_rows(tmp_path / "old.jsonl", fp32_rows()[:2] + one_form[2:])  # rows from before forms were recorded
    done = from_rows(tmp_path, old)
    assert done.returncode != 0 and "null: not recorded" in done.stderr

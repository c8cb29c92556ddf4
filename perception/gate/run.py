"""The decision gate (DESIGN §7): read a sweep's runs, decide ship_<treatment> / keep_<control> /
inconclusive with the evidence (and the attribution when the sweep has shared_skip), or refuse naming what is wrong;
write the report and log it to a
gate run in MLflow (role=gate, nested under the sweep's parent run).

    outcome = run_gate("sweep-1a2b3c", config_name="local")
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import requests
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from perception import paths
from perception.atomic import atomic_write_text
from perception.gate.comparison import PLOT, log_comparison
from perception.gate.config import check_horizons, load_gate_config
from perception.arms import ATTRIBUTION, DEFAULT_CONTROL, DEFAULT_TREATMENT, get_arm
from perception.contract import ROLE, ROLE_GATE, SWEEP_ID
from perception.errors import ConfigError
from perception.exits import EXIT_DECIDED, EXIT_REFUSED, REFUSED
from perception.gate.inputs import GateRefusal, SweepInputs, find_parent_run, load_sweep
from perception.gate.looks import cost, restrict, sequential_study
from perception.gate.report import refusal_json, summary_json, write_report
from perception.gate.sequential import CONTINUE, FIXED, SEQUENTIAL, planned_boundaries, read_plan
from perception.gate.study import PLAN_TAG, Study, study_result
from perception.tracking import kept_operations, recover_sweep


@dataclass
class GateOutcome:
    decision: Optional[str]  # ship_<treatment> | keep_<control> | inconclusive; None when refused
    refused: bool
    reasons: list[str]
    report_dir: Path
    exit_code: int  # 0 decided, 3 refused
    summary: dict  # report.json's content

    def json_line(self) -> dict:
        s = self.summary
        return {
            "decision": self.decision,
            "W": s.get("W"),
            "G": s.get("G"),
            "p": s.get("p"),
            "rule": s.get("rule"),
            "refused": self.refused,
            "reasons": self.reasons,
            "sweep_id": s.get("sweep_id"),
            "report_dir": str(self.report_dir),
            "gate_run_id": s.get("gate_run_id"),
            "design": s.get("design"),
            "look": s.get("look"),
            "max_looks": s.get("max_looks"),
            "next_wave": s.get("next_wave"),
        }


def run_gate(
    sweep_id: str,
    tracking_uri: Optional[str] = None,
    experiment: str = paths.MLFLOW_EXPERIMENT,
    config_name: str = "default",
    config_overrides: Sequence[str] = (),
    control: str = DEFAULT_CONTROL,
    treatment: str = DEFAULT_TREATMENT,
    out_dir: Optional[Path] = None,
    decision_file: Optional[Path] = None,
    progress: bool = True,
    workflow_url: Optional[str] = None,
    look: Optional[int] = None,
) -> GateOutcome:
    """Raises ConfigError on a usage error (bad config, a config horizon the runs lack, bad id).
    `look`: decide a sequential study at this look exactly, from replicates 0 … look − 1 (the workflow's
    wave k passes k + 1); refused when one of those waves is missing."""
    cfg = load_gate_config(config_name, config_overrides)
    if look is not None and look < 1:
        raise ConfigError(f"--look {look}: expected 1 or more (look k decides replicates 0 … k − 1)")
    get_arm(control), get_arm(treatment)  # unknown arms are usage errors
    if control == treatment:
        raise ConfigError(f"--control and --treatment are both {control!r}: expected two different arms")
    paths.check_sweep_id(sweep_id, "--sweep-id")
    uri = paths.tracking_uri(tracking_uri)
    out_dir = Path(out_dir) if out_dir is not None else paths.perception_home() / "gate" / sweep_id
    client = MlflowClient(tracking_uri=uri)

    recovered = _send_kept_operations(sweep_id, uri)
    inputs: Optional[SweepInputs] = None
    result = None
    try:
        inputs = load_sweep(
            client, uri, experiment, sweep_id, control, treatment, ATTRIBUTION.read_beside(treatment), waves=look
        )
    except GateRefusal as refusal:
        reasons = refusal.reasons + _sync_hint(sweep_id)
        summary = refusal_json(sweep_id, reasons, recovered + refusal.notes, refusal.running)
        outcome = GateOutcome(None, True, reasons, out_dir, EXIT_REFUSED, summary)
    except (MlflowException, requests.RequestException) as e:  # the store is unreachable or broken
        reasons = [f"cannot read sweep {sweep_id!r} from {uri}: {e}"] + _sync_hint(sweep_id)
        outcome = GateOutcome(None, True, reasons, out_dir, EXIT_REFUSED, refusal_json(sweep_id, reasons, recovered))
    else:
        check_horizons(cfg, inputs.horizons)
        try:
            study, inputs, summary = _decide(inputs, cfg, control, treatment, progress, look)
        except GateRefusal as refusal:
            reasons = refusal.reasons + _sync_hint(sweep_id)
            summary = refusal_json(sweep_id, reasons, recovered + refusal.notes, inputs.running)
            outcome = GateOutcome(None, True, reasons, out_dir, EXIT_REFUSED, summary)
        else:
            result = study.main
            summary["notes"] = recovered + summary["notes"]
            outcome = GateOutcome(
                result.decision, False, result.reasons + summary["notes"], out_dir, EXIT_DECIDED, summary
            )

    parent = inputs.parent_run_id if inputs else None
    gate_run_id = _start_gate_run(client, experiment, sweep_id, parent, outcome)
    study_or_none = None if outcome.refused else study
    files = write_report(out_dir, outcome.summary, inputs, study_or_none)
    if gate_run_id and not _finish_gate_run(client, gate_run_id, outcome, files):
        write_report(out_dir, outcome.summary, inputs, study_or_none)  # with the note
    _end_parent_run(client, experiment, sweep_id, parent, outcome, workflow_url)
    if decision_file is not None:
        atomic_write_text(decision_file, (outcome.decision or REFUSED) + "\n")
    return outcome


def _decide(
    inputs: SweepInputs, cfg, control: str, treatment: str, progress: bool, look: Optional[int] = None
) -> tuple[Study, SweepInputs, dict]:
    """The fixed design's one look, or the sequential study at the look its complete waves reach (the
    design and boundaries as the parent run's gate_plan pre-registered them); with `look`, at that look."""
    where = f"sweep {inputs.sweep_id}: the parent run's {PLAN_TAG} tag"
    try:
        bounds = planned_boundaries(read_plan(inputs.parent_tags, PLAN_TAG), where)
    except ConfigError as e:  # the store holds a plan the gate cannot trust
        raise GateRefusal([str(e)]) from e
    if look is not None:
        _check_look(look, bounds, inputs)
    if bounds is None:
        study = study_result(inputs, cfg, control, treatment, progress)
        return study, inputs, {**summary_json(study, inputs, cfg), "design": FIXED, "look": 1, "max_looks": 1}
    seq = sequential_study(inputs, cfg, control, treatment, bounds, progress)
    at_look = restrict(inputs, len(seq.looks))
    per_wave = len(inputs.arms) * inputs.n_folds
    used = seq.stopped_at or len(seq.looks)
    summary = {
        **summary_json(seq.study, at_look, cfg),
        "design": SEQUENTIAL,
        "look": len(seq.looks),
        "max_looks": seq.max_looks,
        "stopped_at": seq.stopped_at,
        "why_stopped": seq.why,
        "looks": seq.looks,
        "next_wave": seq.next_wave,
        "boundaries": bounds.to_json(),
        "cost": cost(used, seq.max_looks, per_wave),
    }
    return seq.study, at_look, summary


def _check_look(look: int, bounds, inputs: SweepInputs) -> None:
    """A look names a wave that must be complete (a training of it that failed for good leaves it so):
    deciding an earlier look again instead would let the workflow go on past a lost wave."""
    if bounds is None:
        raise GateRefusal(
            [
                f"--look {look}: sweep {inputs.sweep_id}'s parent run pre-registered the fixed design "
                f"(one look); --look is for a sequential study"
            ]
        )
    if look > bounds.max_looks:
        raise GateRefusal([f"--look {look}: the plan pre-registered at most {bounds.max_looks} looks"])
    missing = [r for r in range(look) if r not in inputs.replicates]
    if missing:
        raise GateRefusal(
            [
                f"look {look} decides replicate waves 0 … {look - 1}; replicate {missing[0]} has no "
                f"FINISHED run of {inputs.arms[0]} or {inputs.arms[1]} (its trainings failed or never ran)"
            ]
        )


def _send_kept_operations(sweep_id: str, uri: str) -> list[str]:
    """Where the sweep's run directories are (a local sweep, the workflow's runs volume), what their
    ledgers kept through a tracking outage reaches MLflow before anything is decided. Returns notes."""
    recovery = recover_sweep(sweep_id, tracking_uri=uri)
    notes = [f"sent {recovery.sent} tracking operation(s) kept in the sweep's run directories"] if recovery.sent else []
    return notes + recovery.completed + [f"not sent: {line}" for line in recovery.stuck]


def _sync_hint(sweep_id: str) -> list[str]:
    """A refusal that the runs' kept operations could fix says so, and how to send them."""
    kept = kept_operations(sweep_id)
    if not kept:
        return []
    listing = ", ".join(f"{name}: {n}" for name, n in kept.items())
    return [
        f"{sum(kept.values())} tracking operation(s) of this sweep are kept in its run directories and not "
        f"in MLflow ({listing}): `perception-sweep sync --sweep-id {sweep_id}` sends them once the tracking "
        f"server is reachable; then decide again"
    ]


# A gate run per invocation, refusals included, so the UI shows why a sweep has no decision. A failure
# to log is recorded in the report instead of losing the decision.


def _start_gate_run(
    client: MlflowClient, experiment: str, sweep_id: str, parent: Optional[str], outcome: GateOutcome
) -> Optional[str]:
    notes = outcome.summary.setdefault("notes", [])
    try:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            notes.append(f"experiment {experiment!r} does not exist: no gate run logged")
            return None
        tags = {
            ROLE: ROLE_GATE,
            SWEEP_ID: sweep_id,
            "decision": outcome.decision or REFUSED,
            "exploratory": str(bool(outcome.summary.get("exploratory"))).lower(),
        }
        if outcome.summary.get("look") is not None:
            tags["look"] = str(outcome.summary["look"])
        parent = parent or find_parent_run(client, exp.experiment_id, sweep_id)  # refusals nest too
        if parent:
            tags["mlflow.parentRunId"] = parent
        look = f"-look{tags['look']}" if outcome.summary.get("design") == SEQUENTIAL else ""
        run = client.create_run(exp.experiment_id, tags=tags, run_name=f"gate-{sweep_id}{look}")
    except (MlflowException, requests.RequestException) as e:
        notes.append(f"could not create the gate run in MLflow: {e}")
        return None
    outcome.summary["gate_run_id"] = run.info.run_id
    return run.info.run_id


def _finish_gate_run(client: MlflowClient, run_id: str, outcome: GateOutcome, files: list[Path]) -> bool:
    s = outcome.summary
    attr = s.get("attribution") or {}
    mde = s.get("mde") or {}
    metrics = {
        "gate_W": s.get("W"),
        "gate_G": s.get("G"),
        "gate_p": s.get("p"),
        "gate_mde_W": mde.get("W"),
        "gate_mde_G": mde.get("G"),
        **{f"gate_delta_{h}": d for h, d in (s.get("delta") or {}).items()},
        **{f"gate_attr_{k}": attr.get(k) for k in ("W", "G", "p")},
    }
    if attr:
        metrics["gate_attr_ship"] = float(attr.get("decision") == f"ship_{s.get('treatment')}")
    try:
        client.log_batch(
            run_id,
            metrics=[
                Metric(k, float(v), _now_ms(), 0) for k, v in metrics.items() if v is not None and math.isfinite(v)
            ],
        )
        for f in files:
            client.log_artifact(run_id, str(f), artifact_path="gate")
        client.set_terminated(run_id, "FINISHED")
        return True
    except (MlflowException, requests.RequestException, OSError) as e:
        s.setdefault("notes", []).append(f"could not log the gate run {run_id} to MLflow: {e}")
        try:
            client.set_terminated(run_id, "FAILED")
        except (MlflowException, requests.RequestException):
            pass
        return False


def _end_parent_run(
    client: MlflowClient,
    experiment: str,
    sweep_id: str,
    parent: Optional[str],
    outcome: GateOutcome,
    workflow_url: Optional[str],
) -> None:
    """The sweep's parent run ends with the outcome, so the list of sweeps shows it: FINISHED with
    the decision, FAILED when the gate refused; gate_W, gate_p, gate_mde_W (how large a true W it could
    see) and the workflow's page beside it; a decided or continuing study's per-fold comparison
    (`comparison/`) as its artifacts."""
    s = outcome.summary
    try:
        if parent is None:
            exp = client.get_experiment_by_name(experiment)
            parent = find_parent_run(client, exp.experiment_id, sweep_id) if exp else None
        if parent is None:
            print(f"[gate] no parent run of sweep {sweep_id!r} to end")
            return
        if not outcome.refused:  # the folds compared, where the UI shows them: the parent run's artifacts
            log_comparison(client, parent, s, outcome.report_dir / PLOT)
        if outcome.decision == CONTINUE:  # the study goes on: the parent stays open, no decision yet
            client.set_tag(parent, "gate_look", str(s.get("look")))
            return
        tags = [RunTag("decision", outcome.decision or REFUSED)]
        if workflow_url:
            tags.append(RunTag("workflow_url", workflow_url))
        pairs = (("gate_W", s.get("W")), ("gate_p", s.get("p")), ("gate_mde_W", (s.get("mde") or {}).get("W")))
        metrics = [Metric(k, float(v), _now_ms(), 0) for k, v in pairs if v is not None and math.isfinite(v)]
        client.log_batch(parent, metrics=metrics, tags=tags)
        client.set_terminated(parent, "FAILED" if outcome.refused else "FINISHED")
    except (MlflowException, requests.RequestException, OSError) as e:
        print(f"[gate] WARNING: could not end the parent run {parent} of sweep {sweep_id!r}: {e}")


def _now_ms() -> int:
    return int(time.time() * 1000)

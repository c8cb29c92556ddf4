"""A finished run whose MLflow run is missing or was left unfinished is completed from its ledger by
`recover_sweep` (what `perception-sweep local`, the gate and `perception-sweep sync` call before
anything decides), not skipped: recreated whole, or ended as recorded, with nothing logged twice."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from perception.paths import DONE_FILE
from perception.tracking import LEDGER, RUN_ID_FILE, SENT, RunLedger, kept_operations, recover_sweep, replay_unsent

SWEEP = "recover"


def finished_run(home, uri: str, store=None) -> RunLedger:
    """A run directory as a finished training leaves it: start, two epochs of metrics, an artifact,
    end FINISHED, all sent, and done.json."""
    run_dir = home / "runs" / SWEEP / "shared-f0"
    ledger = RunLedger(run_dir, uri)
    tags = {"sweep_id": SWEEP, "variant": "shared", "fold": "0", "replicate": "0", "role": "train"}
    ledger.record(
        "start",
        tags=tags,
        params={"seed": "0", "data.fold": "0"},
        run_name="shared-f0",
        experiment="perception-ab",
        **({"store": store} if store else {}),
    )
    for step in (0, 1):
        ledger.record("metrics", step=step, values={"val_auc_h2": 0.5 + 0.01 * step, "train_loss": 0.69 - step / 100})
    (run_dir / "predictions").mkdir()
    (run_dir / "predictions" / "val_final.npz").write_bytes(b"not read here")
    ledger.record("artifact", path="predictions/val_final.npz", artifact_path="predictions")
    ledger.record("end", status="FINISHED")
    assert store or ledger.flush(force=True)
    (run_dir / DONE_FILE).write_text(json.dumps({"run_id": ledger.run_id(), "metrics": {}, "unsent": 0}))
    return ledger


def history(client: MlflowClient, run_id: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, "val_auc_h2")]


def test_a_missing_run_is_recreated_from_the_ledger(perception_home):
    uri = f"sqlite:///{perception_home / 'mlflow.db'}"
    ledger, client = finished_run(perception_home, uri), MlflowClient(uri)
    old = ledger.run_id()
    expected = history(client, old)
    client.delete_run(old)

    recovery = recover_sweep(SWEEP, perception_home, uri)
    new = ledger.run_id()
    assert new != old and recovery.stuck == [] and recovery.sent == len(ledger.entries())
    assert recovery.completed == [f"shared-f0: its MLflow run {old} is missing; recreated from its ledger as run {new}"]
    run = client.get_run(new)
    assert run.info.status == "FINISHED" and run.data.tags["sweep_id"] == SWEEP
    assert history(client, new) == expected == [(0, 0.5), (1, 0.51)]
    assert [a.path for a in client.list_artifacts(new, "predictions")] == ["predictions/val_final.npz"]
    aside = ledger.run_dir / f"mlflow_run.missing-{old}.json"
    assert json.loads(aside.read_text())["run_id"] == old  # kept, not deleted
    assert (ledger.run_dir / f"tracking_sent.missing-{old}.jsonl").exists()
    assert recover_sweep(SWEEP, perception_home, uri).completed == []  # complete now: nothing more to do


def test_a_run_left_unfinished_is_ended_from_the_ledger_without_duplicates(perception_home):
    uri = f"sqlite:///{perception_home / 'mlflow.db'}"
    ledger, client = finished_run(perception_home, uri), MlflowClient(uri)
    run_id = ledger.run_id()
    client.update_run(run_id, status="RUNNING")  # its end never reached the store

    recovery = recover_sweep(SWEEP, perception_home, uri)
    assert recovery.completed == [f"shared-f0: run {run_id} was RUNNING; completed from its ledger (FINISHED)"]
    assert ledger.run_id() == run_id and client.get_run(run_id).info.status == "FINISHED"
    assert history(client, run_id) == [(0, 0.5), (1, 0.51)]  # the same metrics, each once
    assert client.get_run(run_id).data.params == {"seed": "0", "data.fold": "0"}


def test_kept_operations_are_counted_per_run_and_sent_by_recovery(perception_home):
    uri = f"sqlite:///{perception_home / 'mlflow.db'}"
    ledger = finished_run(perception_home, uri)
    (ledger.run_dir / SENT).unlink()  # as if nothing had reached the server
    (ledger.run_dir / RUN_ID_FILE).unlink()
    n = len(ledger.entries())
    assert kept_operations(SWEEP, perception_home) == {"shared-f0": n}
    assert (ledger.run_dir / LEDGER).exists()
    recovery = recover_sweep(SWEEP, perception_home, uri)
    assert recovery.sent == n and recovery.stuck == [] and kept_operations(SWEEP, perception_home) == {}
    assert MlflowClient(uri).get_run(ledger.run_id()).info.status == "FINISHED"


def test_a_run_trained_against_another_store_is_left_alone(perception_home):
    """The gate pointed at another server must not copy the sweep's runs into it."""
    uri = f"sqlite:///{perception_home / 'mlflow.db'}"
    ledger = finished_run(perception_home, uri, store="http://127.0.0.1:5999/")
    recovery = recover_sweep(SWEEP, perception_home, uri)
    assert recovery.sent == 0 and recovery.completed == []
    assert recovery.stuck == [
        f"shared-f0: trained against the tracking store http://127.0.0.1:5999/, not {uri}; "
        f"left alone (`perception-sweep sync --tracking-uri` sends it to a store named "
        f"explicitly)"
    ]
    assert ledger.run_id() is None and kept_operations(SWEEP, perception_home) == {"shared-f0": len(ledger.entries())}
    assert replay_unsent(SWEEP, perception_home, uri) == len(ledger.entries())  # asked explicitly: sent
    assert MlflowClient(uri).get_run(ledger.run_id()).info.status == "FINISHED"

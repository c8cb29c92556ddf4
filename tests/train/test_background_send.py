"""A training's ledger goes to MLflow on a thread beside it (perception.tracking.BackgroundSender): a server
that hangs holds no step, and the run's final flush waits for a send in flight instead of sending beside it.
The system metrics start and restart on a thread of their own likewise."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from perception.contract import SWEEP_ID
from perception.tracking import SENT, BackgroundSender, RunLedger
from perception.train.sysmetrics import SystemMetrics, start_system_metrics


@pytest.fixture
def hung_server():
    """A TCP server on 127.0.0.1 that accepts every connection and never answers: a server stuck mid-restart."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held, stop = [], threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def start_entry(ledger: RunLedger) -> None:
    ledger.record("start", tags={SWEEP_ID: "bg-send"}, params={"lr": "0.001"}, run_name="bg-send")


def test_a_hung_server_holds_no_step_and_the_ledger_keeps_what_it_could_not_send(tmp_path, hung_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    direct = RunLedger(tmp_path / "direct", hung_server)
    start_entry(direct)
    t0 = time.monotonic()
    assert direct.flush(force=True) is False
    assert time.monotonic() - t0 >= 1.5  # what an epoch's end waited for before

    ledger = RunLedger(tmp_path / "run", hung_server)
    start_entry(ledger)
    sender = BackgroundSender(ledger)
    t0 = time.monotonic()
    sender.soon(force=True)
    asked = time.monotonic() - t0
    assert asked < 0.5, f"soon() took {asked:.2f} s"
    deadline = time.monotonic() + 30
    while not ledger.failures() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ledger.failures(), "the background send never gave up on the hung server"
    assert "start #" in ledger.failures()[0]
    assert [e["op"] for e in ledger.unsent()] == ["start"]  # kept for a later flush
    sender.close()


def test_the_final_flush_waits_for_a_send_in_flight_and_sends_each_operation_once(tmp_path, mlflow_server):
    ledger = RunLedger(tmp_path / "run", mlflow_server)
    start_entry(ledger)
    assert ledger.flush(force=True)
    sender = BackgroundSender(ledger)
    for step in range(40):  # the training records while the thread sends
        ledger.record("metrics", step=step, values={"loss": 1.0 / (step + 1)})
        sender.soon()
    sender.close()
    ledger.record("end", status="FINISHED")
    assert ledger.flush(force=True)
    assert ledger.unsent() == []
    sent = [json.loads(line)["id"] for line in (ledger.run_dir / SENT).read_text().splitlines()]
    assert sorted(sent) == sorted(e["id"] for e in ledger.entries()) and len(sent) == len(set(sent))
    client = MlflowClient(mlflow_server)
    history = client.get_metric_history(ledger.run_id(), "loss")
    assert sorted(m.step for m in history) == list(range(40))  # each step once: no operation sent twice
    assert client.get_run(ledger.run_id()).info.status == "FINISHED"


def test_a_send_that_raises_is_reported_and_sending_goes_on(tmp_path, mlflow_server):
    ledger = RunLedger(tmp_path / "run", mlflow_server)
    start_entry(ledger)
    ledger.record("bogus")  # an operation the ledger does not know: its send raises
    sender = BackgroundSender(ledger)
    sender.soon(force=True)
    deadline = time.monotonic() + 30
    while not ledger.failures() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("unknown ledger operation 'bogus'" in f for f in ledger.failures()), ledger.failures()
    assert sender._thread.is_alive()  # one failed send does not end the sending
    sender.close()
    sender._thread.join(5)
    assert not sender._thread.is_alive()


def test_without_a_sender_a_run_record_sends_at_once(tmp_path, mlflow_server):
    from perception.train.run_record import RunRecord

    record = RunRecord(RunLedger(tmp_path / "run", mlflow_server), system_metrics=False)
    start_entry(record.ledger)
    record.send_soon(force=True)  # before the epochs: synchronous
    assert record.ledger.run_id() is not None and record.ledger.unsent() == []
    record.send_in_background()
    record.ledger.record("metrics", step=0, values={"loss": 0.5})
    record.send_soon()
    assert record.end("FINISHED")  # closes the sender, then the final flush sends the rest
    assert record.sender is None and record.ledger.unsent() == []
    assert Path(record.ledger.run_dir / SENT).exists()


def test_a_hung_server_holds_no_epoch_end_while_the_system_metrics_start(hung_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    run_id = "0" * 32
    direct = SystemMetrics(run_id, hung_server)
    t0 = time.monotonic()
    direct.start()  # resuming reads the run's last step from the server
    assert time.monotonic() - t0 >= 1.5  # what an epoch's end waited for before
    direct.stop(final_sample=False)

    t0 = time.monotonic()
    metrics = start_system_metrics(True, run_id, hung_server)
    assert metrics is not None
    metrics.keep_alive()  # an epoch's end while the start still waits on the server
    asked = time.monotonic() - t0
    assert asked < 0.5, f"starting the system metrics held the training {asked:.2f} s"
    starting = [t for t in threading.enumerate() if t.name == "perception-system-metrics"]
    assert len(starting) == 1 and starting[0].is_alive()  # one start in flight, on its own thread
    metrics.stop(final_sample=False)  # the run's end waits it out
    assert not starting[0].is_alive()

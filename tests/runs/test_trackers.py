"""Trackers as sinks of the run's one telemetry stream, with the real libraries: MLflow's file
store read back through MLflow's client, a W&B offline run read back from its own file; a
resumed run continues the same tracker run; a missing library is exit 2 with the pip
command.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_trackers.py."""

import json
import struct
from pathlib import Path

import yaml

from hpctrain.config import flatten


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == kind]


def test_mlflow_holds_what_metrics_jsonl_and_config_yaml_hold(tmp_path, run_cli, tiny,
                                                               monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    settings = tiny("tracking.sinks=[mlflow]", "run_name=ml", "train.max_steps=6",
                    "report=true")
    assert run_cli("run", "default", *settings)[0] == 0
    run = tmp_path / "runs" / "ml"
    identity = json.loads((run / "run.json").read_text())
    client = MlflowClient(tracking_uri=(tmp_path / "runs" / "mlruns").as_uri())
    run_id = identity["trackers"]["mlflow"]
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == "ml"
    config = flatten(yaml.safe_load((run / "config.yaml").read_text()))
    assert logged.data.params == {k: str(v) for k, v in config.items()}
    losses = [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")]
    assert losses == [(r["step"], r["loss"]) for r in records(run, "train")]
    summary = json.loads((run / "summary.json").read_text())
    assert logged.data.metrics["summary/best_val_accuracy"] == summary["best_val_accuracy"]
    assert logged.data.metrics["eval/val_accuracy"] == records(run, "eval")[-1]["val_accuracy"]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"report.html", "report-loss.png"} <= artifacts

    assert run_cli("run", "default", *settings, "train.max_steps=10", "resume=auto")[0] == 0
    again = client.get_run(run_id)  # the same MLflow run, continued
    assert again.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == \
        [2, 4, 6, 8, 10]
    experiment = client.get_experiment(logged.info.experiment_id)
    assert len(client.search_runs([experiment.experiment_id])) == 1


def wandb_records(path: Path) -> list:
    """The records of a W&B run file (.wandb): a 7-byte header, then LevelDB's log format
    (32 KiB blocks of chunks: CRC32C, length, type) around protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pending, found = 7, b"", []
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:  # a block's tail too short for a chunk header: padding
            position += left
            continue
        length, kind = struct.unpack("<HB", data[position + 4:position + 7])
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or a record's last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
            pending = b""
    return found


def test_a_wandb_offline_run_holds_what_metrics_jsonl_holds(tmp_path, run_cli, tiny):
    settings = tiny("tracking.sinks=[wandb]", "run_name=wb", "train.max_steps=6")
    assert run_cli("run", "default", *settings)[0] == 0
    assert run_cli("run", "default", *settings, "train.max_steps=10", "resume=auto")[0] == 0
    run = tmp_path / "runs" / "wb"
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [f.name for f in files] == [f"run-{run_id}.wandb"] * 2  # two starts, one W&B run
    history, config, summary = {}, {}, {}
    for file in files:
        for record in wandb_records(file):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}
                if "train/loss" in items:
                    history[items["_step"]] = items["train/loss"]
            elif kind == "run" and record.run.config.update:
                config.update({i.key: json.loads(i.value_json)
                               for i in record.run.config.update})
            elif kind == "summary":
                summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                for i in record.summary.update})
    assert history == {r["step"]: r["loss"] for r in records(run, "train")}
    assert {k: v for k, v in config.items() if not k.startswith("_")} == \
        yaml.safe_load((run / "config.yaml").read_text())
    final = json.loads((run / "summary.json").read_text())
    assert summary["best_val_accuracy"] == final["best_val_accuracy"]
    assert summary["steps"] == 10


def test_runs_sync_copies_the_mlflow_run_and_names_the_wandb_runs(tmp_path, run_cli, tiny,
                                                                  monkeypatch):
    """Copied once to another MLflow store (read back equal); a second sync copies nothing
    again; the W&B offline runs it would send are the run's own (--dry-run: this machine
    has no network to send them over), and without W&B credentials it says so."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert run_cli("run", "default", *tiny("tracking.sinks=[mlflow,wandb]", "run_name=both",
                                           "train.max_steps=4"))[0] == 0
    run = tmp_path / "runs" / "both"
    server = (tmp_path / "server").as_uri()
    code, out, _ = run_cli("runs", "sync", str(run), "--mlflow-uri", server, "--json",
                           "--no-wandb")
    done = json.loads(out)
    assert code == 0 and done["mlflow"]["to"] == server
    copied = MlflowClient(tracking_uri=server).get_run(done["mlflow"]["run_id"])
    original = MlflowClient(tracking_uri=(tmp_path / "runs" / "mlruns").as_uri()).get_run(
        json.loads((run / "run.json").read_text())["trackers"]["mlflow"])
    assert copied.data.params == original.data.params
    assert copied.data.metrics == original.data.metrics and copied.info.status == "FINISHED"
    code, out, _ = run_cli("runs", "sync", str(run), "--mlflow-uri", server, "--json",
                           "--dry-run")
    assert json.loads(out)["wandb"][-1].endswith(f"-{json.loads((run / 'run.json').read_text())['run_id']}")
    code, out, _ = run_cli("runs", "sync", str(run), "--mlflow-uri", server, "--json",
                           "--no-wandb")
    assert json.loads(out)["mlflow"]["run_id"] == done["mlflow"]["run_id"]  # not copied again
    assert len(MlflowClient(tracking_uri=server).search_runs(
        [copied.info.experiment_id])) == 1
    code, _, err = run_cli("runs", "sync", str(tmp_path / "runs" / "mlruns"))
    assert code == 2 and "nothing to sync" in err
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: W&B has no credentials
    code, _, err = run_cli("runs", "sync", str(run))
    assert code == 2 and "wandb sync failed" in err and "wandb login" in err

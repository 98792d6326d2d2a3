"""A run's history as each backend keeps it, read back with that backend's own reader:
TensorBoard's EventAccumulator, the CSV file, ``MlflowClient``, and W&B's offline run files
(its LevelDB-style log of ``wandb_internal_pb2.Record`` protobufs)."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

# Measured, not computed: these differ between any two runs; their steps must still match.
TIMED = ("train/samples_per_second", "train/data_wait_fraction")


def comparable(history: dict[str, list[tuple[int, float]]]) -> dict[str, list]:
    """Per tag, the (step, value) points, values as float32 (TensorBoard's precision); for
    timed tags only the steps."""
    return {
        tag: [step for step, _ in points]
        if tag in TIMED
        else [(step, struct.unpack("f", struct.pack("f", value))[0]) for step, value in points]
        for tag, points in history.items()
    }


def csv_rows(run_dir: Path) -> list[dict]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def csv_history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    history: dict[str, list] = {}
    for row in csv_rows(run_dir):
        history.setdefault(row["tag"], []).append((int(row["step"]), float(row["value"])))
    return history


def tensorboard_history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def mlflow_runs(uri: str, run_name: str | None = None) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments)
    return [
        r for r in runs if run_name is None or r.data.tags.get("torchloom.run_name") == run_name
    ]


def mlflow_history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    return {
        tag: [
            (m.step, m.value)
            for m in sorted(
                client.get_metric_history(run_id, tag), key=lambda m: (m.step, m.timestamp)
            )
        ]
        for tag in run.data.metrics
    }


# --- W&B offline files ------------------------------------------------------------------------

BLOCK = 32768


def _records(path: Path):
    """The records of a ``.wandb`` file: a 7-byte header (":W&B", magic, version), then
    LevelDB log blocks of 32 KiB, each record (crc, length, type) and its bytes, split over
    blocks as FIRST/MIDDLE/LAST."""
    data, pos, parts = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            yield parts + chunk
            parts = b""


def wandb_attempts(run_dir: Path) -> list[dict]:
    """Each offline run file under the run dir, in the order W&B sync uploads them (start
    time): its run id, group, exit code and history rows."""
    from wandb.proto import wandb_internal_pb2 as pb

    attempts = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        attempt = {"rows": [], "exit_code": None, "id": None, "group": None, "summary": {}}
        for raw in _records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                attempt["id"], attempt["group"] = record.run.run_id, record.run.run_group
                attempt["start"] = record.run.start_time.ToNanoseconds()
            elif kind == "history":
                items = record.history.item
                attempt["rows"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
            elif kind == "summary":
                for i in record.summary.update:
                    attempt["summary"][i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
            elif kind == "exit":
                attempt["exit_code"] = record.exit.exit_code
        if attempt["id"] is not None:  # a file W&B never wrote to (killed): nothing to sync
            attempts.append(attempt)
    return sorted(attempts, key=lambda a: a.get("start", 0))


def wandb_history(run_dir: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """The history of W&B run ``run_id`` as syncing its attempts makes it: W&B drops a
    resumed attempt's row whose step is not past the run's last step."""
    history: dict[str, list] = {}
    last = -1
    for attempt in wandb_attempts(run_dir):
        if attempt["id"] != run_id:
            continue
        for row in attempt["rows"]:
            if "_step" not in row or row["_step"] <= last:
                continue
            last = row["_step"]
            for tag, value in row.items():
                if not tag.startswith("_"):
                    history.setdefault(tag, []).append((row["_step"], float(value)))
    return history

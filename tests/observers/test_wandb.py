"""The W&B tracker in offline mode: events fired through the plugin manager, the run read
back from the ``.wandb`` file W&B wrote (its records parsed with W&B's own protobufs) and
the trajectory table's JSON; the W&B service process is gone afterwards."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest
from wandb.proto import wandb_internal_pb2

from agentrl import plugins
from agentrl.observers import Tracking, TrackOptions

#: The ``.wandb`` file: a 7-byte header, then LevelDB-log records in 32 KiB blocks.
HEADER, BLOCK, RECORD_HEADER = 7, 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path):
    """Every ``Record`` in a ``.wandb`` file (the LevelDB log format W&B's datastore writes)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, pending, offset = [], b"", HEADER
    while offset + RECORD_HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < RECORD_HEADER:  # the block's tail is padding
            offset += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[offset : offset + RECORD_HEADER])
        chunk = data[offset + RECORD_HEADER : offset + RECORD_HEADER + length]
        offset += RECORD_HEADER + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def as_dict(items):
    """A history, summary or config record's items as a dict (nested keys nested)."""
    found: dict = {}
    for item in items:
        path = [item.key] if item.key else list(item.nested_key)
        target = found
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = json.loads(item.value_json)
    return found


def service_processes():
    """The ``wandb-core`` service processes serving this process (their pids)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"wandb-core") for arg in argv) and str(os.getpid()).encode() in argv:
            found.append(int(entry))
    return found


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, every directory it writes (runs, cache, config, data) under ``tmp_path``."""
    for name, sub in (
        ("WANDB_DIR", "runs"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
    ):
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert service_processes() == []
    yield tmp_path
    import wandb

    if service_processes():  # the test failed before close: leave nothing behind
        wandb.teardown()


def test_offline_run_holds_history_summary_config_and_the_table(
    agentrl_registry, events, offline_wandb
):
    """Per rollout one history step (reward, turns, tokens, seconds per phase, running
    outcome counts); on close the trajectory table, the totals in the summary, the stack's
    config, and the W&B service process this tracker started shut down."""
    track_dir = offline_wandb / "track"
    options = TrackOptions(
        trackers=("wandb",), directory=track_dir, project="t", config={"harness": "claude_code"}
    )
    tracking = Tracking.open(options)
    assert not (track_dir / "wandb").exists() and service_processes() == []
    for event in events:
        plugins.notify("on_rollout_finished", event)
    tracking.flush()
    assert service_processes(), "the run opened with the first rollout"
    tracking.close()
    deadline = time.monotonic() + 10
    while service_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service_processes() == [], "the W&B service outlived the tracker"

    (run_dir,) = (track_dir / "wandb").glob("offline-run-*")
    (run_file,) = run_dir.glob("run-*.wandb")
    records = wandb_records(run_file)
    history = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            history.append(as_dict(record.history.item))
    steps = [row for row in history if "reward" in row]
    assert [(r["_step"], r["reward"], r["outcomes/solved"]) for r in steps] == [
        (1, 1.0, 1),
        (2, 0.0, 1),
        (3, 0.0, 1),
    ]
    assert [r["outcomes/infra_error"] for r in steps] == [0, 0, 1]
    assert steps[0]["turns"] == 4 and steps[0]["sampled_tokens"] == 300
    assert steps[1]["seconds/agent"] == 9.0
    (table_row,) = [row["trajectories"] for row in history if "trajectories" in row]
    assert table_row["_type"] == "table-file" and table_row["nrows"] == 3

    (table_file,) = run_dir.glob("files/media/table/trajectories_*.table.json")
    table = json.loads(table_file.read_text())
    index = {name: i for i, name in enumerate(table["columns"])}
    assert [row[index["instance_id"]] for row in table["data"]] == [
        "textstats-1",
        "textstats-2",
        "textstats-3",
    ]
    assert [row[index["outcome"]] for row in table["data"]] == ["solved", "unsolved", "infra_error"]
    assert table["data"][2][index["error"]] == "boot failed | bwrap\nexited 1"
    assert table["data"][0][index["seconds_agent"]] == 4.5

    summaries = [r.summary for r in records if r.WhichOneof("record_type") == "summary"]
    summary = as_dict(item for s in summaries for item in s.update)
    assert summary["rollouts"] == 3 and summary["outcomes/solved"] == 1
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert as_dict(run.config.update)["harness"] == "claude_code" and run.project == "t"

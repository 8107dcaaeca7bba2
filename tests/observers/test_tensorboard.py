"""The TensorBoard tracker: events fired through the plugin manager, read back from the
event files with TensorBoard's own ``EventAccumulator``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from agentrl import plugins
from agentrl.observers import Tracking, TrackOptions


def read_run(logdir):
    """Every scalar series (tag -> [(step, value)]) and text summary (tag -> text) in ``logdir``."""
    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {
        tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in tags["scalars"]
    }
    texts = {
        tag: tensor_util.make_ndarray(accumulator.Tensors(tag)[-1].tensor_proto).item().decode()
        for tag in tags["tensors"]
    }
    return scalars, texts


def test_rollouts_become_scalars_and_a_text_table(agentrl_registry, events, tmp_path):
    """Per rollout: reward, turns, tokens, seconds per phase and running outcome counts at
    steps 1..N, flushed as they come (readable before close); on close, the trajectory
    table (pipes and newlines of an error escaped) and the run's config as text."""
    options = TrackOptions(
        trackers=("tensorboard",), directory=tmp_path, run_name="r1", config={"harness": "x"}
    )
    tracking = Tracking.open(options)
    logdir = tmp_path / "tensorboard" / "r1"
    assert not logdir.exists(), "the run opens with the first rollout, not before"
    for event in events:
        plugins.notify("on_rollout_finished", event)

    tracking.flush()
    scalars, texts = read_run(logdir)  # before close: nothing is buffered away
    assert scalars["reward"] == [(1, 1.0), (2, 0.0), (3, 0.0)]
    assert texts == {}

    tracking.close()
    scalars, texts = read_run(logdir)
    assert scalars["outcomes/solved"] == [(1, 1.0), (2, 1.0), (3, 1.0)]
    assert scalars["outcomes/unsolved"] == [(1, 0.0), (2, 1.0), (3, 1.0)]
    assert scalars["outcomes/infra_error"][-1] == (3, 1.0)
    assert scalars["turns"] == [(1, 4.0), (2, 3.0), (3, 0.0)]
    assert scalars["sampled_tokens"][0] == (1, 300.0)
    assert scalars["seconds/agent"] == [(1, 4.5), (2, 9.0), (3, 4.5)]
    assert scalars["mean_reward"][-1][1] == pytest.approx(1 / 3)
    table = texts["trajectories"].splitlines()
    assert table[0].startswith("| rollout | instance_id | session_id | harness | outcome |")
    assert len(table) == 2 + 3
    assert (
        "| 1 | textstats-1 | textstats-1-0-abcd | claude_code | solved | 1 | 4 | 300 |"
        in (table[2])
    )
    assert "boot failed \\| bwrap exited 1" in table[4]
    assert '"harness": "x"' in texts["config"]


def test_tracking_imports_no_tensorflow_or_torch(tmp_path):
    """Writing a run with the TensorBoard tracker imports neither TensorFlow nor torch."""
    code = (
        "import sys\n"
        "from agentrl.observers import Tracking, TrackOptions\n"
        "from agentrl.types import Outcome, RolloutFinishedEvent\n"
        f"t = Tracking.open(TrackOptions(trackers=('tensorboard',), directory={str(tmp_path)!r}))\n"
        "t.trackers[0].on_rollout_finished(RolloutFinishedEvent(\n"
        "    instance_id='a', outcome=Outcome.SOLVED, reward=1.0, num_samples=1))\n"
        "t.close()\n"
        "print(sorted(m for m in ('tensorflow', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
    assert list((tmp_path / "tensorboard").glob("*/events.out.tfevents.*"))

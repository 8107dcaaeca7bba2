"""Tracking's options, registration and lifecycle, whatever the backend."""

from __future__ import annotations

import pathlib
import threading
import time

import pytest

from agentrl import plugins
from agentrl.observers import Tracker, TrackError, Tracking, TrackOptions, parse_names
from agentrl.observers.tensorboard import TensorBoardTracker


def test_names_from_repeated_and_comma_separated_values():
    """``--track wandb,tensorboard --track wandb`` is both, once each; an unknown one is refused."""
    assert parse_names(["wandb, tensorboard", "WANDB", ""]) == ("wandb", "tensorboard")
    with pytest.raises(TrackError, match=r"no tracker named 'mlflow'.*wandb, tensorboard"):
        parse_names(["tensorboard,mlflow"])


def test_flags_win_over_the_environment_which_wins_over_defaults(tmp_path):
    """Explicit values beat AGENTRL_TRACK*, which beat the caller's default directory."""
    env = {
        "AGENTRL_TRACK": "wandb",
        "AGENTRL_TRACK_DIR": str(tmp_path / "env"),
        "AGENTRL_TRACK_PROJECT": "from-env",
    }
    from_env = TrackOptions.from_settings(env, default_directory="out")
    assert from_env.trackers == ("wandb",)
    assert from_env.directory == tmp_path / "env" and from_env.project == "from-env"
    flags = TrackOptions.from_settings(
        env, trackers=["tensorboard"], directory="flag", project="p", default_directory="out"
    )
    assert (flags.trackers, flags.directory, flags.project) == (
        ("tensorboard",),
        pathlib.Path("flag"),
        "p",
    )
    nothing = TrackOptions.from_settings({}, default_directory="out")
    assert (nothing.trackers, nothing.directory, nothing.project) == (
        (),
        pathlib.Path("out"),
        "agentrl",
    )
    with pytest.raises(TrackError, match="mlflow"):
        TrackOptions.from_settings({"AGENTRL_TRACK": "mlflow"})


def test_a_missing_package_names_the_extra_before_anything_is_registered(
    agentrl_registry, monkeypatch, tmp_path
):
    """``tensorboard`` not importable: ``Tracking.open`` raises naming the [tensorboard]
    extra, and no tracker is left registered."""
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    before = set(agentrl_registry.pm.get_plugins())
    with pytest.raises(TrackError, match=r"--track tensorboard needs the tensorboard package.*"):
        Tracking.open(TrackOptions(trackers=("tensorboard",), directory=tmp_path))
    assert set(agentrl_registry.pm.get_plugins()) == before
    assert "[tensorboard]" in TensorBoardTracker.missing_message()


class _Recorder(Tracker):
    """A backend that records what the base class hands it."""

    name = "recorder"
    module = "json"
    extra = "none"

    def __init__(self, *args, fail_open=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_open, self.opened, self.logged, self.finished = fail_open, 0, [], 0

    def _open(self):
        self.opened += 1
        if self.fail_open:
            raise RuntimeError("no backend")

    def _log(self, step, metrics, row):
        self.logged.append((step, dict(metrics), row.instance_id))

    def _finish(self):
        self.finished += 1


def test_registered_only_while_open_lazy_and_closed_once(agentrl_registry, events, monkeypatch):
    """The tracker sees events only between open and close; its run opens on the first event
    (not before), the step and running counts advance per rollout, close finishes it once."""
    monkeypatch.setattr("agentrl.observers.tracker_class", lambda name: _Recorder)
    tracking = Tracking.open(TrackOptions(trackers=("wandb",)))
    (tracker,) = tracking.trackers
    assert tracker in agentrl_registry.pm.get_plugins() and tracker.opened == 0
    for event in events:
        plugins.notify("on_rollout_finished", event)
    tracking.flush()
    assert tracker.opened == 1
    steps = [
        (step, m["outcomes/solved"], m["outcomes/infra_error"]) for step, m, _ in tracker.logged
    ]
    assert steps == [(1, 1, 0), (2, 1, 0), (3, 1, 1)]
    last = tracker.logged[-1][1]
    assert last["mean_reward"] == pytest.approx(1 / 3) and last["seconds/agent"] == 4.5
    assert last["turns"] == 0 and tracker.logged[0][1]["sampled_tokens"] == 300
    tracking.close()
    tracking.close()
    assert tracker.finished == 1 and tracker not in agentrl_registry.pm.get_plugins()
    plugins.notify("on_rollout_finished", events[0])
    assert len(tracker.logged) == 3


def test_a_backend_that_fails_to_open_is_reported_once(agentrl_registry, events, caplog):
    """A tracker whose run cannot start logs one error, never raises into the rollout, and
    is not retried for every later rollout."""
    tracker = _Recorder(TrackOptions(), fail_open=True)
    agentrl_registry.pm.register(tracker, name="recorder")
    for event in events:
        plugins.notify("on_rollout_finished", event)
    tracker.flush()
    assert tracker.opened == 1 and tracker.logged == []
    assert caplog.text.count("the recorder tracker failed to start") == 1
    tracker.close()
    assert tracker.finished == 0


def test_table_columns_follow_the_phases_rollouts_run(events):
    """The trajectory table has one row per rollout and a seconds column per phase timed,
    in the order the phases run."""
    tracker = _Recorder(TrackOptions())
    for event in events:
        tracker.on_rollout_finished(event)
    columns, rows = tracker.table()
    assert columns[-4:] == ["seconds_boot", "seconds_agent", "seconds_grade", "seconds_total"]
    assert [row[columns.index("instance_id")] for row in rows] == [
        "textstats-1",
        "textstats-2",
        "textstats-3",
    ]
    assert rows[2][columns.index("outcome")] == "infra_error"


def test_the_hook_never_waits_on_the_backend(agentrl_registry, events):
    """A backend stuck opening its run (a slow W&B login, say) does not hold up the caller
    of the hook (the event loop): events are counted and queued, and written in order once
    it is back; close waits for them and the table."""
    release = threading.Event()

    class Stuck(_Recorder):
        def _open(self):
            super()._open()
            assert release.wait(10)

    tracker = Stuck(TrackOptions())
    agentrl_registry.pm.register(tracker, name="stuck")
    started = time.monotonic()
    for event in events:
        plugins.notify("on_rollout_finished", event)
    assert time.monotonic() - started < 1.0
    assert len(tracker.rows) == 3 and tracker.logged == []
    release.set()
    tracker.close()
    assert [step for step, _, _ in tracker.logged] == [1, 2, 3] and tracker.finished == 1

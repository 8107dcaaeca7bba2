"""What every tracker shares: its options, a rollout as a row, the running counts, the lifecycle.

A ``Tracker`` is a plugin object: its ``on_rollout_finished`` hook implementation turns each
``RolloutFinishedEvent`` into a ``RolloutRow``, updates the running outcome counts and
queues the row's metrics for the backend (``_log``), which a writer thread of its own
writes, so the event loop calling the hook never waits on a tracker. The backend's run is
opened on the first rollout (``_open``), never at construction, and the table of every
rollout is written when the tracker closes (``_finish``). A backend that fails to open is
reported once and then left alone, so a broken tracker never fails a rollout.
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import pathlib
import queue
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import attrs

from agentrl import settings
from agentrl.extras import install_hint
from agentrl.hookspecs import hookimpl
from agentrl.types import Outcome, RolloutFinishedEvent

__all__ = ["TRACKER_NAMES", "RolloutRow", "TrackError", "TrackOptions", "Tracker", "parse_names"]

logger = logging.getLogger("agentrl.observers")

#: The trackers agentrl ships, as ``--track`` and ``AGENTRL_TRACK`` name them.
TRACKER_NAMES: tuple[str, ...] = ("wandb", "tensorboard")

#: The phases of a rollout in the order they run (``RolloutResult.timings``' keys).
PHASES: tuple[str, ...] = (
    "boot",
    "prepare",
    "install",
    "agent",
    "diff",
    "grade",
    "finish",
    "total",
)

#: The trajectory table's columns before the per-phase seconds.
COLUMNS: tuple[str, ...] = (
    "rollout",
    "instance_id",
    "session_id",
    "harness",
    "outcome",
    "reward",
    "turns",
    "sampled_tokens",
    "num_samples",
    "error",
)


class TrackError(ValueError):
    """Tracking cannot be set up as asked; the message says what to change or install."""


def parse_names(values: Iterable[str]) -> tuple[str, ...]:
    """Tracker names from repeated and comma-separated values, deduplicated, in order.

    Raises ``TrackError`` for a name agentrl has no tracker for.
    """
    names = [name.strip().lower() for value in values for name in value.split(",")]
    names = [name for name in dict.fromkeys(names) if name]
    unknown = [name for name in names if name not in TRACKER_NAMES]
    if unknown:
        raise TrackError(
            f"no tracker named {', '.join(map(repr, unknown))}; "
            f"expected one of {', '.join(TRACKER_NAMES)} (repeat or comma-separate them)"
        )
    return tuple(names)


@attrs.frozen(kw_only=True)
class TrackOptions:
    """Which trackers run and where they write; empty ``trackers`` tracks nothing."""

    trackers: tuple[str, ...] = attrs.field(default=(), converter=parse_names)
    #: W&B writes ``DIRECTORY/wandb/``, TensorBoard ``DIRECTORY/tensorboard/RUN/``.
    directory: pathlib.Path = attrs.field(default=pathlib.Path("."), converter=pathlib.Path)
    #: The W&B project.
    project: str = "agentrl"
    #: The run's name (W&B's display name, TensorBoard's run directory); None: generated.
    run_name: str | None = None
    #: What the run is configured with (the stack's options), shown beside its metrics.
    config: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def from_settings(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        trackers: Sequence[str] = (),
        directory: str | pathlib.Path | None = None,
        project: str | None = None,
        run_name: str | None = None,
        default_directory: str | pathlib.Path = ".",
    ) -> TrackOptions:
        """Options from explicit values (flags), else ``AGENTRL_TRACK``, ``AGENTRL_TRACK_DIR``
        and ``AGENTRL_TRACK_PROJECT``, else the defaults (``default_directory``)."""
        names = trackers or settings.get("AGENTRL_TRACK", env) or ()
        where = directory or settings.get("AGENTRL_TRACK_DIR", env) or default_directory
        return cls(
            trackers=tuple(names),  # type: ignore[arg-type]
            directory=where,  # type: ignore[arg-type]
            project=project or str(settings.get("AGENTRL_TRACK_PROJECT", env)),
            run_name=run_name,
        )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@attrs.frozen(kw_only=True)
class RolloutRow:
    """One finished rollout as a tracker logs it (from a ``RolloutFinishedEvent``)."""

    instance_id: str
    outcome: str
    reward: float
    num_samples: int
    session_id: str = ""
    harness: str = ""
    turns: int = 0
    sampled_tokens: int = 0
    error: str = ""
    timings: Mapping[str, float] = attrs.field(factory=dict)

    @classmethod
    def from_event(cls, event: RolloutFinishedEvent) -> RolloutRow:
        """The row of ``event``; metadata it lacks (an older caller's) reads as empty."""
        meta = event.metadata
        timings = {
            str(phase): float(seconds)
            for phase, seconds in dict(meta.get("timings") or {}).items()
            if _number(seconds) is not None
        }
        outcome = event.outcome
        return cls(
            instance_id=event.instance_id,
            outcome=outcome.value if isinstance(outcome, Outcome) else str(outcome),
            reward=float(event.reward),
            num_samples=int(event.num_samples),
            session_id=str(meta.get("session_id") or ""),
            harness=str(meta.get("harness") or ""),
            turns=int(meta.get("turns") or 0),
            sampled_tokens=int(meta.get("sampled_tokens") or 0),
            error=str(meta.get("error") or ""),
            timings=timings,
        )

    def metrics(self) -> dict[str, float]:
        """This rollout's own numbers: reward, turns, tokens, samples, seconds per phase."""
        values = {
            "reward": self.reward,
            "turns": float(self.turns),
            "sampled_tokens": float(self.sampled_tokens),
            "num_samples": float(self.num_samples),
        }
        values.update({f"seconds/{phase}": seconds for phase, seconds in self.timings.items()})
        return values

    def cells(self, index: int, phases: Sequence[str]) -> list[Any]:
        """The trajectory table's row: ``COLUMNS`` then the seconds of each of ``phases``."""
        head = [
            index,
            self.instance_id,
            self.session_id,
            self.harness,
            self.outcome,
            self.reward,
            self.turns,
            self.sampled_tokens,
            self.num_samples,
            self.error,
        ]
        return head + [self.timings.get(phase) for phase in phases]


def table_phases(rows: Iterable[RolloutRow]) -> list[str]:
    """The phases any of ``rows`` timed, in the order rollouts run them (unknown ones last)."""
    seen = dict.fromkeys(phase for row in rows for phase in row.timings)
    order = {phase: index for index, phase in enumerate(PHASES)}
    return sorted(seen, key=lambda phase: (order.get(phase, len(order)), phase))


class Tracker:
    """A plugin that logs every finished rollout to one tracking backend.

    Subclasses set ``name`` (as ``--track`` names it), ``module`` (the package they import)
    and ``extra`` (agentrl's extra that installs it), and write ``_open``, ``_log`` and
    ``_finish``. The package is imported only in ``_open``.

    The hook never blocks the event loop it is called on (the middleware's and the
    rollouts'): it counts the rollout and queues it; one writer thread per tracker, started
    with the first rollout, opens the backend's run and writes, in order. ``close`` writes
    what is queued, then the table, and waits for it.
    """

    name: ClassVar[str]
    module: ClassVar[str]
    extra: ClassVar[str]

    def __init__(self, options: TrackOptions) -> None:
        self.options = options
        #: Every rollout logged so far, in the order they finished.
        self.rows: list[RolloutRow] = []
        #: The running count of each outcome (every ``Outcome``, zeros included).
        self.outcomes: collections.Counter[str] = collections.Counter(
            {outcome.value: 0 for outcome in Outcome}
        )
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[int, dict[str, float], RolloutRow] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._opened = False
        self._broken = False
        self._closed = False

    @classmethod
    def check_installed(cls) -> None:
        """Raise ``TrackError`` naming the extra to install when ``module`` is missing."""
        if importlib.util.find_spec(cls.module) is None:
            raise TrackError(cls.missing_message())

    @classmethod
    def missing_message(cls) -> str:
        return f"--track {cls.name} needs the {cls.module} package: {install_hint(cls.extra)}"

    def summary(self) -> dict[str, float]:
        """The running totals: rollouts, count per outcome, mean reward."""
        count = len(self.rows)
        totals = {"rollouts": float(count)}
        totals.update({f"outcomes/{o}": float(n) for o, n in self.outcomes.items()})
        totals["mean_reward"] = sum(row.reward for row in self.rows) / count if count else 0.0
        return totals

    def table(self) -> tuple[list[str], list[list[Any]]]:
        """The trajectory table: columns, then one row per rollout."""
        phases = table_phases(self.rows)
        columns = [*COLUMNS, *(f"seconds_{phase}" for phase in phases)]
        return columns, [row.cells(i, phases) for i, row in enumerate(self.rows, start=1)]

    @hookimpl
    def on_rollout_finished(self, event: RolloutFinishedEvent) -> None:
        """Count ``event``'s rollout and queue its metrics and the running totals, at step N."""
        row = RolloutRow.from_event(event)
        with self._lock:
            if self._closed:
                return
            self.rows.append(row)
            self.outcomes[row.outcome] += 1
            self._queue.put((len(self.rows), {**row.metrics(), **self.summary()}, row))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._write, name=f"agentrl-track-{self.name}", daemon=True
                )
                self._thread.start()

    def flush(self) -> None:
        """Wait until every rollout queued so far is written (or dropped, if broken)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued and the trajectory table, close the run and wait for it
        (once; nothing to do if no rollout came)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join()

    def _write(self) -> None:
        """The writer thread: open on the first rollout, log each, finish on ``None``."""
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    if self._opened:
                        self._finish_logged()
                    return
                if self._ensure_open():
                    self._log_logged(*item)
            finally:
                self._queue.task_done()

    def _ensure_open(self) -> bool:
        if self._opened or self._broken:
            return self._opened
        try:
            self._open()
        except ImportError as exc:
            self._broken = True
            logger.error("%s (%s); not tracking this run", self.missing_message(), exc)
        except Exception:
            self._broken = True
            logger.exception("the %s tracker failed to start; not tracking this run", self.name)
        else:
            self._opened = True
        return self._opened

    def _log_logged(self, step: int, metrics: Mapping[str, float], row: RolloutRow) -> None:
        try:
            self._log(step, metrics, row)
        except Exception:
            logger.exception("the %s tracker failed to log rollout %d", self.name, step)

    def _finish_logged(self) -> None:
        try:
            self._finish()
        except Exception:
            logger.exception("the %s tracker failed to close its run", self.name)

    # -- the backend (called on the writer thread) ---------------------------------------
    def _open(self) -> None:
        raise NotImplementedError

    def _log(self, step: int, metrics: Mapping[str, float], row: RolloutRow) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

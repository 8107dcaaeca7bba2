"""Experiment tracking: observer plugins that log finished rollouts to W&B or TensorBoard.

::

    tracking = Tracking.open(TrackOptions(trackers=("tensorboard",), directory="runs/x"))
    ...  # every on_rollout_finished event reaches the trackers
    tracking.close()  # the trajectory table is written, the runs are closed

``agentrl rollout --track wandb|tensorboard`` and ``AGENTRL_TRACK`` (also inside slime)
enable them; the stack opens a ``Tracking`` on start and closes it when it closes, Ctrl-C
included. A tracker is registered into the plugin manager only while enabled, and its
package (``wandb``, ``tensorboard``) is imported only when its first rollout arrives; a
missing one is a ``TrackError`` naming the extra to install, before any rollout runs.
See docs/tracking.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agentrl import plugins
from agentrl.observers.base import (
    TRACKER_NAMES,
    RolloutRow,
    Tracker,
    TrackError,
    TrackOptions,
    parse_names,
)

if TYPE_CHECKING:
    from agentrl.plugins import PluginRegistry

__all__ = [
    "TRACKER_NAMES",
    "RolloutRow",
    "TrackError",
    "TrackOptions",
    "Tracker",
    "Tracking",
    "parse_names",
    "tracker_class",
]

logger = logging.getLogger("agentrl.observers")


def tracker_class(name: str) -> type[Tracker]:
    """The tracker class ``--track`` calls ``name`` (importing it imports no backend)."""
    if name == "wandb":
        from agentrl.observers.wandb import WandbTracker

        return WandbTracker
    if name == "tensorboard":
        from agentrl.observers.tensorboard import TensorBoardTracker

        return TensorBoardTracker
    parse_names([name])  # raises TrackError listing the names
    raise AssertionError(name)


class Tracking:
    """The trackers of one stack, registered as plugins until ``close``."""

    def __init__(self, trackers: list[Tracker], registry: PluginRegistry) -> None:
        self.trackers = trackers
        self.registry = registry
        self._names: list[str] = []

    @classmethod
    def open(cls, options: TrackOptions, registry: PluginRegistry | None = None) -> Tracking:
        """Check each tracker's package is installed, then register the trackers.

        ``registry``: the plugin manager the rollouts notify (default: the process's).
        Raises ``TrackError`` (naming the extra) before registering anything.
        """
        classes = [tracker_class(name) for name in options.trackers]
        for tracker_cls in classes:
            tracker_cls.check_installed()
        tracking = cls([c(options) for c in classes], registry or plugins.get_registry())
        for tracker in tracking.trackers:
            name = f"agentrl.observers.{tracker.name}-{id(tracker):x}"
            if tracking.registry.pm.register(tracker, name=name) is not None:
                tracking._names.append(name)
        return tracking

    def flush(self) -> None:
        """Wait until every rollout so far is written by every tracker."""
        for tracker in self.trackers:
            tracker.flush()

    def close(self) -> None:
        """Unregister every tracker, then close it (each even when another fails; logged)."""
        for name in self._names:
            self.registry.pm.unregister(name=name)
        self._names.clear()
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception:
                logger.exception("the %s tracker failed to close its run", tracker.name)

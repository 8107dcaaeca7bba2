"""The Weights & Biases tracker: one W&B run per stack, every rollout one step of it.

Each rollout logs at step N its reward, turns, sampled tokens, samples and seconds per
phase, with the running outcome counts (``outcomes/<outcome>``) and mean reward. On close
the trajectory table (a ``wandb.Table``, one row per rollout) is logged as ``trajectories``,
the totals go into the run's summary, and the run is finished.

W&B's own environment applies: ``WANDB_MODE=offline`` writes the run under
``DIRECTORY/wandb/`` without a network (``wandb sync`` uploads it later), ``WANDB_API_KEY``
authenticates, ``WANDB_ENTITY`` picks the team. The process's console is not captured
(agentrl's progress line stays agentrl's). The run is created beside any the process has
(``reinit="create_new"``), so a trainer's own W&B run is left alone; the W&B service
process is shut down on close only when this tracker started it and no other run is left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.observers.base import RolloutRow, Tracker

__all__ = ["WandbTracker"]


def _service_running() -> bool:
    """Whether this process already holds a connection to a W&B service."""
    from wandb.sdk import wandb_setup

    current = getattr(wandb_setup, "_singleton", None)
    return getattr(current, "_connection", None) is not None


def _other_runs_active() -> bool:
    from wandb.sdk import wandb_setup

    current = getattr(wandb_setup, "_singleton", None)
    return bool(getattr(current, "_active_runs", None))


class WandbTracker(Tracker):
    """Rollouts as a W&B run's history and a trajectory table (``--track wandb``)."""

    name = "wandb"
    module = "wandb"
    extra = "wandb"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run: Any = None
        self._started_service = False

    def _open(self) -> None:
        import wandb

        directory = self.options.directory
        directory.mkdir(parents=True, exist_ok=True)
        self._started_service = not _service_running()
        self.run = wandb.init(
            project=self.options.project,
            name=self.options.run_name,
            dir=str(directory),
            config=dict(self.options.config),
            reinit="create_new",
            settings=wandb.Settings(console="off", x_save_requirements=False),
        )

    def _log(self, step: int, metrics: Mapping[str, float], row: RolloutRow) -> None:
        self.run.log(dict(metrics), step=step)

    def _finish(self) -> None:
        import wandb

        try:
            columns, rows = self.table()
            self.run.log(
                {"trajectories": wandb.Table(columns=columns, data=rows)}, step=len(self.rows)
            )
            self.run.summary.update(self.summary())
        finally:
            self.run.finish()
            if self._started_service and not _other_runs_active():
                wandb.teardown()

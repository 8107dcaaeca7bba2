"""The TensorBoard tracker: event files written with TensorBoard's own writer (no TF, no torch).

Every rollout adds its scalars at step N (its reward, turns, sampled tokens, samples and
seconds per phase; the running outcome counts and mean reward) and flushes, so a run
stopped at any point keeps every rollout it finished. On close the trajectory table is
written as a text summary (a markdown table, TensorBoard's Text tab) under the tag
``trajectories``, and the run's configuration as a text summary under ``config``.

The run directory is ``DIRECTORY/tensorboard/RUN`` (``tensorboard --logdir
DIRECTORY/tensorboard``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.observers.base import RolloutRow, Tracker

__all__ = ["TensorBoardTracker", "markdown_table"]

#: A cell longer than this is cut (an error message with a traceback, say).
MAX_CELL = 200


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``columns`` and ``rows`` as a markdown table (how TensorBoard's Text tab shows tables)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    """Rollouts as TensorBoard scalars and a text table (``--track tensorboard``)."""

    name = "tensorboard"
    module = "tensorboard"
    extra = "tensorboard"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logdir = self.options.directory / "tensorboard" / self._run_name()
        self._writer: Any = None

    def _run_name(self) -> str:
        if self.options.run_name:
            return self.options.run_name
        return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    def _open(self) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.logdir))

    def _emit(self, step: int, values: Sequence[Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=list(values))
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def _log(self, step: int, metrics: Mapping[str, float], row: RolloutRow) -> None:
        from tensorboard.compat.proto import summary_pb2

        values = [
            summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in metrics.items()
        ]
        self._emit(step, values)
        self._writer.flush()

    def _text(self, tag: str, text: str, description: str) -> Any:
        import numpy as np
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.plugins.text import metadata
        from tensorboard.util import tensor_util

        return summary_pb2.Summary.Value(
            tag=tag,
            metadata=metadata.create_summary_metadata(display_name=tag, description=description),
            tensor=tensor_util.make_tensor_proto(np.array(text, dtype=object)),
        )

    def _finish(self) -> None:
        try:
            columns, rows = self.table()
            config = json.dumps(dict(self.options.config), indent=2, sort_keys=True, default=str)
            self._emit(
                len(self.rows),
                [
                    self._text(
                        "trajectories", markdown_table(columns, rows), "one row per rollout"
                    ),
                    self._text("config", f"```\n{config}\n```", "the stack's options"),
                ],
            )
        finally:
            self._writer.close()

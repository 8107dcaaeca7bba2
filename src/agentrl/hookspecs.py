"""Every hook agentrl calls. Hooks only ever gain arguments, so old plugins keep working."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("agentrl")
hookimpl = pluggy.HookimplMarker("agentrl")


@hookspec
def register_engines(register: Callable[[type], None]) -> None:
    """Register token-level inference engine classes (each has a ``name``)."""


@hookspec
def register_adapters(register: Callable[[type], None]) -> None:
    """Register wire-protocol adapter classes served by the middleware."""


@hookspec
def register_sandboxes(register: Callable[[type], None]) -> None:
    """Register sandbox backend classes."""


@hookspec
def register_harnesses(register: Callable[[type], None]) -> None:
    """Register agent harness classes (one per agent CLI)."""


@hookspec
def register_graders(register: Callable[[type], None]) -> None:
    """Register grader classes (task row format plus grading method)."""


@hookspec
def register_parsers(register: Callable[[type], None]) -> None:
    """Register tool-call and reasoning parser classes (``parser_type`` tells which)."""


@hookspec
def register_commands(cli: Any) -> None:
    """Add subcommands to the ``agentrl`` click group."""


@hookspec
def on_turn_recorded(event: Any) -> None:
    """Observe a recorded engine turn (a frozen ``TurnRecordedEvent``)."""


@hookspec
def on_rollout_finished(event: Any) -> None:
    """Observe a finished rollout (a frozen ``RolloutFinishedEvent``)."""

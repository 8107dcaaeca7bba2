"""Click options that several commands share, written once."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from agentrl.observers import TrackOptions

__all__ = [
    "json_object_option",
    "parser_options",
    "prompt_mode_option",
    "track_from",
    "track_options",
]

#: How prompts are built (see docs/middleware.md, "Prompt modes").
prompt_mode_option: Callable[[Any], Any] = click.option(
    "--prompt-mode",
    type=click.Choice(["splice", "render"]),
    default="splice",
    show_default=True,
    help="Prompts: 'splice' extends each chain's exact ids (every sampled token trains); "
    "'render' renders the whole conversation every turn.",
)

workers_option: Callable[[Any], Any] = click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Middleware worker processes: sessions are sharded across them by token, each "
    "session sticky to one (1: serve in this process). Needs an engine served over HTTP.",
)


def parser_options(*, reasoning_default: str | None) -> Callable[[Any], Any]:
    """``--tool-parser`` (default hermes) and ``--reasoning-parser`` (``reasoning_default``)."""
    tool = click.option(
        "--tool-parser", default="hermes", show_default=True, help="Tool-call parser ('' for none)."
    )
    reasoning = click.option(
        "--reasoning-parser",
        default=reasoning_default,
        show_default=reasoning_default is not None,
        help="Reasoning parser, e.g. qwen3 ('' for none).",
    )
    return lambda command: tool(reasoning(command))


def track_options(command: Any) -> Any:
    """``--track`` (repeatable, or a comma list), ``--track-dir`` and ``--track-project``;
    ``track_from`` reads them into ``TrackOptions``."""
    for option in reversed(
        (
            click.option(
                "--track",
                "track",
                multiple=True,
                metavar="TRACKER",
                help="Log every rollout to an experiment tracker: wandb or tensorboard "
                "(repeatable, or comma-separated) [default: $AGENTRL_TRACK, else none].",
            ),
            click.option(
                "--track-dir",
                type=click.Path(file_okay=False),
                help="Where trackers write: DIR/wandb/, DIR/tensorboard/RUN/ "
                "[default: $AGENTRL_TRACK_DIR, else --out].",
            ),
            click.option(
                "--track-project",
                help="The W&B project [default: $AGENTRL_TRACK_PROJECT, else agentrl].",
            ),
        )
    ):
        command = option(command)
    return command


def track_from(kw: dict[str, Any], *, default_directory: str) -> TrackOptions:
    """The ``TrackOptions`` of ``track_options``' flags (popped from ``kw``), the
    ``AGENTRL_TRACK*`` variables filling what they leave unset."""
    from agentrl.observers import TrackError, TrackOptions
    from agentrl.settings import SettingsError

    try:
        return TrackOptions.from_settings(
            trackers=kw.pop("track", ()),
            directory=kw.pop("track_dir", None),
            project=kw.pop("track_project", None),
            default_directory=default_directory,
        )
    except (TrackError, SettingsError) as exc:
        raise click.BadParameter(str(exc), param_hint="--track") from None


def json_object_option(value: str | None, name: str) -> dict[str, Any]:
    """A ``--*-options`` value: a JSON object (``{}`` when not given), else a usage error."""
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=name) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("expected a JSON object", param_hint=name)
    return parsed

"""Click options that several commands share, written once."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from agentrl.graders.tasks import TaskRow
    from agentrl.observers import TrackOptions

__all__ = [
    "PluginName",
    "json_object_option",
    "load_task_files",
    "parser_options",
    "prompt_mode_option",
    "track_from",
    "track_options",
]


class PluginName(click.ParamType):
    """A plugin's name, checked against the registry as the command line is parsed.

    An unknown name is a usage error (exit 2) that lists the registered names, raised
    before the command reads a file or checks its other options. ``also`` are values that
    name no plugin but are accepted as given (``auto``, ``''`` for none).
    """

    name = "plugin"

    def __init__(self, kind: str, *, also: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.also = also

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "NAME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from agentrl.plugins import NotAvailableError, get_registry

        if value is None or value in self.also:
            return value
        registry = get_registry()
        try:
            if self.kind in ("tool_parser", "reasoning_parser"):
                registry.get_parser(self.kind, value)
            else:
                registry.get(self.kind, value)
        except NotAvailableError as exc:
            self.fail(str(exc), param, ctx)
        return value


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
        "--tool-parser",
        default="hermes",
        show_default=True,
        type=PluginName("tool_parser", also=("",)),
        help="Tool-call parser ('' for none).",
    )
    reasoning = click.option(
        "--reasoning-parser",
        default=reasoning_default,
        type=PluginName("reasoning_parser", also=("",)),
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


def load_task_files(
    paths: Sequence[str], *, grader: str, evaluation: bool = False
) -> list[TaskRow]:
    """Every task row of the JSONL files ``paths`` (``graders.tasks.load_task_files``).

    A file that cannot be read or parsed, that holds no task at all, or an instance id
    given twice is a ``click.ClickException`` (exit 1) naming the file and line: an empty
    file is a mistake to report, not zero tasks to run.
    """
    from agentrl.graders.tasks import TaskLoadError
    from agentrl.graders.tasks import load_task_files as load

    try:
        return load(paths, grader=grader, evaluation=evaluation)
    except (TaskLoadError, LookupError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


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

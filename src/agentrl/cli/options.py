"""Click options that several commands share, written once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["parser_options", "prompt_mode_option"]

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

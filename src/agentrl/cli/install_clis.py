"""``agentrl install-clis``: the pinned agent CLIs, installed with npm or pip for the sandboxes.

What is installed where, and how an install is found, is
:mod:`agentrl.harnesses.install_clis`; this module is the command around it.
"""

from __future__ import annotations

import pathlib

import click

from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.install_clis import (
    GROUPS,
    cli_dir_candidates,
    default_dest,
    install_clis,
    pinned_clis,
)

__all__ = ["install_clis_command"]


@click.command("install-clis")
@click.option(
    "--dest",
    type=click.Path(file_okay=False),
    help="Install directory [default: $AGENTRL_CLI_DIR, else ~/.cache/agentrl/clis].",
)
@click.option(
    "--only",
    type=click.Choice(GROUPS),
    multiple=True,
    help="Install only this CLI (repeatable) [default: all].",
)
def install_clis_command(dest: str | None, only: tuple[str, ...]) -> None:
    """Install the pinned agent CLIs (Claude Code, Codex, Qwen Code, opencode with npm; Python
    CLIs with pip) for the sandboxes.

    Pins already installed are skipped, so a rerun takes well under a second. The
    variables CLAUDE_CODE_VERSION, CLAUDE_CODE_NODE18_VERSION, CODEX_VERSION,
    QWEN_CODE_VERSION, OPENCODE_VERSION and MINI_SWE_AGENT_VERSION override the pinned
    versions.
    """
    target = pathlib.Path(dest) if dest else default_dest()

    def report(message: str) -> None:
        click.echo(f"install-clis: {message}", err=True)

    try:
        links = install_clis(target, pinned_clis(only), report=report)
    except (HarnessError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    root = target.expanduser().resolve()
    names = ", ".join(f"bin/{link.name}" for link in links)
    report(f"ready in {root}: {names}")
    if not any(c.resolve() == root for c in cli_dir_candidates() if c.exists()):
        report(f"agentrl looks elsewhere by default: set AGENTRL_CLI_DIR={root} or pass --cli-dir")

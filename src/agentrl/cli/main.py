"""The ``agentrl`` command. Subcommands live beside the layer they drive; plugins add more."""

from __future__ import annotations

import json
import logging
import sys

import click

from agentrl import __version__
from agentrl.plugins import KINDS, PluginError, get_registry


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentrl")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Reinforcement learning of real coding agents."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def plugins(as_json: bool) -> None:
    """List every plugin, its distribution, version and what it registered.

    A plugin that failed to load is listed with its error instead of registrations.
    """
    infos = get_registry().plugins()
    if as_json:
        click.echo(json.dumps([info.to_dict() for info in infos], indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="agentrl plugins")
    table.add_column("plugin")
    table.add_column("distribution")
    table.add_column("version")
    table.add_column("registered")
    for info in infos:
        registered = escape(
            "\n".join(
                f"{kind.replace('_', ' ')}: {', '.join(info.registered[kind])}"
                for kind in KINDS
                if info.registered.get(kind)
            )
        )
        if info.error:
            registered = f"[red]failed to load[/]: {escape(info.error)}"
        table.add_row(
            escape(info.name),
            escape(info.distribution or "-"),
            escape(info.version or "-"),
            registered or "-",
        )
    Console().print(table)


def _add_builtin_commands() -> None:
    from agentrl.cli.demo import demo_command
    from agentrl.cli.examples import examples_command
    from agentrl.cli.rollout import rollout_command
    from agentrl.harnesses.install_clis import install_clis_command

    cli.add_command(rollout_command)
    cli.add_command(demo_command)
    cli.add_command(examples_command)
    cli.add_command(install_clis_command)


_add_builtin_commands()


def _load_plugin_commands() -> None:
    get_registry().hook.register_commands(cli=cli)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: load plugin commands, then dispatch.

    A broken plugin (duplicate name, failing hook) is reported in one line, whether it
    shows up while loading commands or when a command first looks plugins up. A plugin
    whose module fails to import only gets a warning (see ``agentrl.plugins``): every
    command that does not need it still runs.
    """
    try:
        _load_plugin_commands()
        cli.main(args=argv, prog_name="agentrl")
    except PluginError as exc:
        click.echo(f"agentrl: plugin error: {exc}", err=True)
        sys.exit(2)

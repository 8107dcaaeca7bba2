"""``agentrl plugins``: every plugin, its distribution, version and what it registered."""

from __future__ import annotations

import json

import click

from agentrl.plugins import KINDS, get_registry

__all__ = ["plugins_command"]


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def plugins_command(as_json: bool) -> None:
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

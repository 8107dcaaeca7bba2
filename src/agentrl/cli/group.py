"""The ``agentrl`` group and its console entry point.

The group holds no command of its own: every one, built-in or third-party, is added by a
plugin's ``register_commands`` hook (the built-ins by :mod:`agentrl.cli.commands`), the
first time the group is asked for its commands.
"""

from __future__ import annotations

import logging
import sys

import click

from agentrl.plugins import PluginError, PluginRegistry, get_registry
from agentrl.version import __version__


class PluginCommandGroup(click.Group):
    """A click group whose commands come from the plugin registry's ``register_commands``.

    The hook is called once per registry, when the group is first asked for a command
    (``--help`` included), so building the group imports no command module. A registry put
    in place later (``plugins.reset_registry``) adds its commands the next time.
    """

    #: The registry whose commands were added last.
    _loaded_from: PluginRegistry | None = None

    def load_plugin_commands(self) -> None:
        """Add the commands of the process-wide registry's plugins, once per registry."""
        registry = get_registry()
        if registry is self._loaded_from:
            return
        self._loaded_from = registry  # first: a hook that looks a command up does not recurse
        registry.add_commands(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self.load_plugin_commands()
        return super().get_command(ctx, cmd_name)


@click.group(cls=PluginCommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentrl")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Reinforcement learning of real coding agents."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: load plugin commands, then dispatch.

    A broken plugin (duplicate name, failing hook) is reported in one line, whether it
    shows up while loading commands or when a command first looks plugins up. A plugin
    whose module fails to import only gets a warning (see ``agentrl.plugins``): every
    command that does not need it still runs.
    """
    try:
        cli.load_plugin_commands()
        cli.main(args=argv, prog_name="agentrl")
    except PluginError as exc:
        click.echo(f"agentrl: plugin error: {exc}", err=True)
        sys.exit(2)

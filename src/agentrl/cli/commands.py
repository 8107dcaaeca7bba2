"""agentrl's own commands, added by a built-in plugin exactly as a third-party one adds its.

Each command module is imported only when the hook runs (when the ``agentrl`` group first
needs its commands), so loading the plugin registry, e.g. inside a slime job, imports none
of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.hookspecs import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl(trylast=True)
def register_commands(cli: click.Group) -> None:
    """Add plugins, rollout, serve, demo, examples, check-tasks, tasks, images,
    install-clis, preflight and view."""
    from agentrl.cli.check_tasks import check_tasks_command
    from agentrl.cli.demo import demo_command
    from agentrl.cli.examples import examples_command
    from agentrl.cli.images import images_group
    from agentrl.cli.install_clis import install_clis_command
    from agentrl.cli.plugins import plugins_command
    from agentrl.cli.preflight import preflight_command
    from agentrl.cli.rollout import rollout_command
    from agentrl.cli.serve import serve
    from agentrl.cli.tasks import tasks_group
    from agentrl.cli.view import view_command

    for command in (
        plugins_command,
        rollout_command,
        serve,
        demo_command,
        examples_command,
        check_tasks_command,
        tasks_group,
        images_group,
        install_clis_command,
        preflight_command,
        view_command,
    ):
        cli.add_command(command)

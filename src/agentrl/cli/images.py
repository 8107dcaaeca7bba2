"""``agentrl images``: the images a task file needs, whether the daemon holds them, and pulls.

Each task's image is decided by its sandbox backend (``Sandbox.task_images``), the rule its
boots, ``agentrl check-tasks`` and the rollout's pre-check use too; the backend is asked
once for all of them (``Sandbox.image_report``). ``rollout_tasks`` is that pre-check for
``agentrl rollout``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from agentrl.cli.options import json_object_option
from agentrl.graders.check import sandbox_factory_for
from agentrl.graders.tasks import AUTO_GRADER, TaskLoadError, load_tasks, select_grader
from agentrl.plugins import PluginError
from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.images import ImageNeed, ImageReport
from agentrl.types import Task
from agentrl.wording import count

if TYPE_CHECKING:
    from agentrl.rollout.stack import StackOptions

__all__ = ["images_group", "rollout_tasks"]


def _report(
    task_files: Sequence[str], grader: str | None, sandbox: str, sandbox_options: str | None
) -> tuple[ImageReport, Any]:
    """The tasks' image report, and the factory that made it (its backend pulls)."""
    chosen = select_grader(grader, default=AUTO_GRADER)
    try:
        options = json_object_option(sandbox_options, "--sandbox-options")
        factory = sandbox_factory_for(sandbox, options=options)
        tasks = [row.task for path in task_files for row in load_tasks(path, grader=chosen)]
        report = asyncio.run(factory.image_report(tasks))
    except (PluginError, TaskLoadError, SandboxError, ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    if report is None:
        raise click.ClickException(
            f"the {sandbox!r} sandbox holds no images to check or pull (only a backend that "
            "boots from images it must hold, such as docker, has any)"
        )
    return report, factory


def _options(command: Any) -> Any:
    for option in (
        click.option(
            "--sandbox-options",
            default=None,
            help="The sandbox's options as a JSON object (docker: '{\"docker_host\": "
            '"unix://…", "default_image": "…"}\').',
        ),
        click.option("--sandbox", default="docker", show_default=True, help="Sandbox plugin."),
        click.option(
            "--grader",
            default=None,
            help="The grader that reads the rows, or 'auto' to choose per row (default: from "
            "the environment, else auto): a grader may name images of its own.",
        ),
        click.argument("task_files", nargs=-1, required=True, type=click.Path(dir_okay=False)),
    ):
        command = option(command)
    return command


@click.group("images")
def images_group() -> None:
    """The sandbox images task files need: list them, pull the missing ones."""


@images_group.command("list")
@_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per image.")
def list_command(
    task_files: tuple[str, ...],
    grader: str | None,
    sandbox: str,
    sandbox_options: str | None,
    as_json: bool,
) -> None:
    """List each distinct image TASK_FILES need, how many tasks need it and whether the
    daemon holds it (exits 0 either way; 1 when the daemon cannot be asked)."""
    report, _ = _report(task_files, grader, sandbox, sandbox_options)
    if as_json:
        for need in report.needs:
            click.echo(json.dumps(_need_dict(need)))
    else:
        _print_table(report)
    missing = report.missing
    click.echo(
        f"{count(len(report.needs), 'image')} for "
        f"{count(sum(len(n.tasks) for n in report.needs), 'task')} on "
        f"the {report.backend} daemon at {report.where}: {len(missing)} missing",
        err=True,
    )
    if missing:
        click.echo(f"get them with: agentrl images pull {' '.join(task_files)}", err=True)


@images_group.command("pull")
@_options
def pull_command(
    task_files: tuple[str, ...], grader: str | None, sandbox: str, sandbox_options: str | None
) -> None:
    """Pull every image TASK_FILES need that the daemon lacks, from its registry.

    An image with several candidates (a grader's locally built name, then the row's own)
    is pulled by the first that a registry serves. Each failure is reported with the
    registry's answer; exits 1 when any image could not be pulled.
    """
    report, factory = _report(task_files, grader, sandbox, sandbox_options)
    failed = 0
    for need in report.missing:
        if not need.candidates:
            failed += 1
            click.echo(f"failed: {need.name} ({', '.join(need.tasks)}): nothing to pull", err=True)
            continue
        errors = []
        for name in need.candidates:
            click.echo(f"pulling {name} …", err=True)
            try:
                asyncio.run(factory.sandbox_cls.pull_image(name, **factory.options))
            except SandboxError as exc:
                errors.append(str(exc))
                continue
            click.echo(f"pulled: {name}")
            break
        else:
            failed += 1
            click.echo(f"failed: {need.name}: {'; '.join(errors)}", err=True)
    present = len(report.needs) - len(report.missing)
    click.echo(
        f"{count(len(report.needs), 'image')}: {present} already present, "
        f"{len(report.missing) - failed} pulled, {failed} failed",
        err=True,
    )
    if failed:
        raise SystemExit(1)


def _need_dict(need: ImageNeed) -> dict[str, Any]:
    return {
        "image": need.name,
        "candidates": list(need.candidates),
        "tasks": len(need.tasks),
        "instance_ids": list(need.tasks),
        "present": not need.missing,
    }


def _print_table(report: ImageReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"agentrl images ({report.backend} at {escape(report.where)})")
    table.add_column("image", overflow="fold")
    table.add_column("tasks", justify="right")
    table.add_column("present")
    for need in report.needs:
        status = "[red]missing[/]" if need.missing else "[green]yes[/]"
        table.add_row(escape(need.name), str(len(need.tasks)), status)
    Console().print(table)


def rollout_tasks(
    options: StackOptions, tasks: Sequence[Task], task_files: Sequence[str], *, skip_missing: bool
) -> list[Task]:
    """``agentrl rollout``'s image pre-check: the tasks to roll out, once the backend said
    (one listing) that their images are there; a missing image is a one-line-per-image
    error before anything starts, or, with ``skip_missing``, its tasks are left out and
    reported on stderr."""
    from agentrl.rollout.images import check_images
    from agentrl.rollout.stack import StackError

    try:
        checked = asyncio.run(
            check_images(options, tasks, skip_missing=skip_missing, task_files=task_files)
        )
    except (StackError, PluginError) as exc:
        raise click.ClickException(str(exc)) from None
    if checked.skipped and checked.report is not None:
        click.echo(
            f"skipping {len(checked.skipped)} of {len(tasks)} tasks: their images are not on "
            f"the {checked.report.backend} daemon at {checked.report.where} "
            f"(--skip-missing-images):\n{checked.report.describe_missing()}",
            err=True,
        )
    return list(checked.tasks)

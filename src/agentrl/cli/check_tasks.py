"""``agentrl check-tasks``: grade each task's gold and empty patch and report broken tasks.

The checking itself is :mod:`agentrl.graders.check`; this module reads the options, prints
the table (or JSON lines) and sets the exit code.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence

import click

from agentrl.cli.options import PluginName, json_object_option, load_task_files
from agentrl.graders.check import (
    BROKEN,
    MISSING_IMAGE,
    OK,
    UNCHECKED,
    TaskCheck,
    check_tasks,
    sandbox_factory_for,
)
from agentrl.graders.tasks import AUTO_GRADER, make_grader, select_grader
from agentrl.wording import count

__all__ = ["check_tasks_command"]


def _print_table(results: Sequence[TaskCheck]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="agentrl check-tasks")
    for column in ("task", "source", "gold", "empty", "status", "reason"):
        table.add_column(column)
    styles = {OK: "green", BROKEN: "red", UNCHECKED: "yellow", MISSING_IMAGE: "magenta"}
    for result in results:
        table.add_row(
            escape(result.instance_id),
            escape(result.source),
            " ".join(f"{r:g}" for r in result.gold_rewards) or "-",
            " ".join(f"{r:g}" for r in result.empty_rewards) or "-",
            f"[{styles[result.status]}]{result.status}[/]",
            escape("; ".join(result.reasons)) or "well-formed",
        )
    Console().print(table)


@click.command("check-tasks")
@click.argument("task_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--grader",
    "--protocol",
    "grader",
    default=None,
    type=PluginName("grader", also=("auto",)),
    help="The grader, or 'auto' to choose per row (default: from the environment, else auto; "
    "--protocol is its older name).",
)
@click.option(
    "--eval",
    "evaluation",
    is_flag=True,
    help="Select the grader as for evaluation (AGENTRL_EVAL_GRADER).",
)
@click.option(
    "--sandbox", "sandbox_name", default="local", show_default=True, type=PluginName("sandbox")
)
@click.option(
    "--sandbox-options",
    "sandbox_options",
    default=None,
    help='The sandbox\'s options as a JSON object (docker: \'{"docker_host": "unix://…", '
    '"default_image": "…"}\').',
)
@click.option("--runs", default=2, show_default=True, type=click.IntRange(1, 10))
@click.option("--timeout", type=float, default=None, help="Grading time budget (seconds).")
@click.option("--concurrency", default=2, show_default=True, type=click.IntRange(1, 256))
@click.option(
    "--host-python/--no-host-python",
    default=True,
    show_default=True,
    help="Bind this machine's Python into local sandboxes of image-less tasks.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object per task (with the failing grade's output_tail).",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Show the grader's output tail under each broken task."
)
def check_tasks_command(
    task_files: tuple[str, ...],
    grader: str | None,
    evaluation: bool,
    sandbox_name: str,
    sandbox_options: str | None,
    runs: int,
    timeout: float | None,
    concurrency: int,
    host_python: bool,
    as_json: bool,
    verbose: bool,
) -> None:
    """Grade the gold and empty patch of every task and report broken tasks.

    \b
    Exit status:
      0    every task is well-formed or unchecked
      1    a task is broken (gold fails, empty passes, grader error, flaky) or
           its image is missing (the docker sandbox asks its daemon; nothing is
           pulled), or a tasks file cannot be read or holds no task

    Missing images are counted among the gradable tasks; a broken task's missing image is
    named in its reasons and counted apart.
      2    usage error: a bad option or option value (an unknown --sandbox or
           --grader name lists the choices)
    """
    from agentrl.plugins import PluginError

    chosen = select_grader(grader, evaluation=evaluation, default=AUTO_GRADER)
    options = json_object_option(sandbox_options, "--sandbox-options")
    rows = load_task_files(task_files, grader=chosen, evaluation=evaluation)
    try:
        factory = sandbox_factory_for(sandbox_name, host_python=host_python, options=options)
        graders = {
            name: make_grader(name, timeout=timeout) for name in {r.task.grader for r in rows}
        }
    except (PluginError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    results = asyncio.run(check_tasks(rows, graders, factory, runs=runs, concurrency=concurrency))
    if as_json:
        for result in results:
            click.echo(json.dumps(result.to_dict()))
    else:
        _print_table(results)
    broken = [r for r in results if r.broken]
    for result in broken:
        click.echo(
            f"broken: {result.instance_id} ({result.source}): {'; '.join(result.reasons)}", err=True
        )
        if verbose:
            tail = result.output_tail or "(the grader kept no output)"
            click.echo("".join(f"    | {line}\n" for line in tail.splitlines()), err=True, nl=False)
    missing = [r for r in results if r.missing_image]
    for result in missing:
        click.echo(f"missing image: {result.instance_id}: {'; '.join(result.reasons)}", err=True)
    fine = len(results) - len(broken) - len(missing)
    # A broken task's image is looked up too, but counted apart: "0 with a missing image"
    # must not hide the images that the broken tasks, once fixed, would still lack.
    broken_missing = sum(1 for r in broken if r.image_missing)
    also = f" (and {broken_missing} of the broken tasks' images)" if broken_missing else ""
    click.echo(
        f"{count(len(results), 'task')} ({chosen}): {fine} well-formed or unchecked, "
        f"{len(broken)} broken, {len(missing)} gradable with a missing image{also}",
        err=True,
    )
    if missing or broken_missing:
        files = " ".join(task_files)
        click.echo(f"get the missing images with: agentrl images pull {files}", err=True)
    if broken or missing:
        sys.exit(1)

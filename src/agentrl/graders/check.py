"""``agentrl check-tasks``: grade each task's gold and empty patch to find broken tasks.

A well-formed task is gradable, its gold patch solves it, the empty patch does not, and
both say so the same way on every run. Anything else (gold fails, empty passes, a grader
error, a result that changes between runs) marks the task broken, so it can be dropped
before training.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import click

from agentrl.graders.base import Grader, SandboxFactory
from agentrl.graders.tasks import (
    AUTO_PROTOCOL,
    TaskLoadError,
    TaskRow,
    gold_patch,
    load_tasks,
    select_protocol,
)
from agentrl.types import Grade, Task

__all__ = [
    "TaskCheck",
    "check_task",
    "check_tasks",
    "check_tasks_command",
    "sandbox_factory_for",
]

logger = logging.getLogger(__name__)

OK = "ok"
BROKEN = "broken"
UNCHECKED = "unchecked"


@attrs.frozen(kw_only=True)
class TaskCheck:
    """The verdict on one task, with the rewards of every gold and empty run."""

    instance_id: str
    source: str
    status: str
    reasons: tuple[str, ...] = ()
    gold_rewards: tuple[float, ...] = ()
    empty_rewards: tuple[float, ...] = ()

    @property
    def broken(self) -> bool:
        return self.status == BROKEN

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "source": self.source,
            "status": self.status,
            "reasons": list(self.reasons),
            "gold_rewards": list(self.gold_rewards),
            "empty_rewards": list(self.empty_rewards),
        }


def _describe(kind: str, grades: Sequence[Grade], want_solved: bool) -> list[str]:
    reasons = []
    errors = [g.error for g in grades if g.error]
    if errors:
        reasons.append(f"grader error on the {kind} patch: {errors[0]}")
        return reasons
    if kind == "gold" and not all(g.applied_cleanly for g in grades):
        reasons.append("the gold patch does not apply")
        return reasons
    solved = [g.solved for g in grades]
    if len(set(solved)) > 1:
        reasons.append(f"flaky: the {kind} patch solved {sum(solved)} of {len(solved)} runs")
    elif want_solved and not solved[0]:
        reasons.append("the gold patch does not solve the task")
    elif not want_solved and solved[0]:
        reasons.append("the empty patch solves the task (the tests do not detect the bug)")
    return reasons


async def check_task(
    row: TaskRow, grader: Grader, sandbox_factory: SandboxFactory, *, runs: int = 2
) -> TaskCheck:
    """Grade ``row``'s gold and empty patch ``runs`` times each and judge the task."""
    task = row.task
    source = f"{row.source}:{row.line}"
    reason = await asyncio.to_thread(grader.check, task)
    if reason:
        return TaskCheck(
            instance_id=task.instance_id, source=source, status=BROKEN, reasons=(reason,)
        )
    try:
        gold = gold_patch(task)
    except TaskLoadError as exc:
        return TaskCheck(
            instance_id=task.instance_id, source=source, status=BROKEN, reasons=(str(exc),)
        )
    if not gold:
        return TaskCheck(
            instance_id=task.instance_id,
            source=source,
            status=UNCHECKED,
            reasons=("no gold patch (metadata.gold_patch or gold_patch_path): not graded",),
        )
    gold_grades: list[Grade] = []
    empty_grades: list[Grade] = []
    for _ in range(runs):
        gold_grades.append(await grader.grade(task, gold, sandbox_factory))
        empty_grades.append(await grader.grade(task, "", sandbox_factory))
    reasons = _describe("gold", gold_grades, True) + _describe("empty", empty_grades, False)
    return TaskCheck(
        instance_id=task.instance_id,
        source=source,
        status=BROKEN if reasons else OK,
        reasons=tuple(reasons),
        gold_rewards=tuple(g.reward for g in gold_grades),
        empty_rewards=tuple(g.reward for g in empty_grades),
    )


async def check_tasks(
    rows: Sequence[TaskRow],
    graders: Mapping[str, Grader],
    sandbox_factory: SandboxFactory,
    *,
    runs: int = 2,
    concurrency: int = 2,
    on_done: Callable[[TaskCheck], None] | None = None,
) -> list[TaskCheck]:
    """``check_task`` for every row with the grader of its protocol, at most
    ``concurrency`` at a time; results come in row order."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(row: TaskRow) -> TaskCheck:
        async with gate:
            grader = graders[row.task.protocol]
            result = await check_task(row, grader, sandbox_factory, runs=runs)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(row) for row in rows)))


def sandbox_factory_for(
    name: str, *, host_python: bool = True, options: Mapping[str, Any] | None = None
) -> SandboxFactory:
    """A factory building a fresh ``name`` sandbox per task (host Python bound in for
    ``local`` sandboxes of image-less tasks when ``host_python``)."""
    from agentrl.plugins import get_sandbox

    sandbox_cls = get_sandbox(name)
    extra = dict(options or {})

    if host_python and name == "local":
        # The local sandbox binds this machine's Python itself (ignored for image roots).
        extra = {"host_python": True, **extra}

    def factory(task: Task) -> Any:
        return sandbox_cls.from_task(task, **extra)

    return factory


def _print_table(results: Sequence[TaskCheck]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="agentrl check-tasks")
    for column in ("task", "source", "gold", "empty", "status", "reason"):
        table.add_column(column)
    styles = {OK: "green", BROKEN: "red", UNCHECKED: "yellow"}
    for result in results:
        table.add_row(
            result.instance_id,
            result.source,
            " ".join(f"{r:g}" for r in result.gold_rewards) or "-",
            " ".join(f"{r:g}" for r in result.empty_rewards) or "-",
            f"[{styles[result.status]}]{result.status}[/]",
            "; ".join(result.reasons) or "well-formed",
        )
    Console().print(table)


@click.command("check-tasks")
@click.argument("task_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--protocol",
    default=None,
    help="Grader protocol, or 'auto' to choose per row (default: from the environment, else auto).",
)
@click.option(
    "--eval",
    "evaluation",
    is_flag=True,
    help="Select the protocol as for evaluation (AGENTRL_EVAL_PROTOCOL).",
)
@click.option("--sandbox", "sandbox_name", default="local", show_default=True)
@click.option("--runs", default=2, show_default=True, type=click.IntRange(1, 10))
@click.option("--timeout", type=float, default=None, help="Grading time budget (seconds).")
@click.option("--concurrency", default=2, show_default=True, type=click.IntRange(1, 256))
@click.option(
    "--host-python/--no-host-python",
    default=True,
    show_default=True,
    help="Bind this machine's Python into local sandboxes of image-less tasks.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per task.")
def check_tasks_command(
    task_files: tuple[str, ...],
    protocol: str | None,
    evaluation: bool,
    sandbox_name: str,
    runs: int,
    timeout: float | None,
    concurrency: int,
    host_python: bool,
    as_json: bool,
) -> None:
    """Grade the gold and empty patch of every task and report broken tasks.

    Exits 1 when any task is broken (gold fails, empty passes, grader error, flaky).
    """
    from agentrl.plugins import PluginError, get_grader

    chosen = select_protocol(protocol, evaluation=evaluation, default=AUTO_PROTOCOL)
    try:
        factory = sandbox_factory_for(sandbox_name, host_python=host_python)
        rows = [row for path in task_files for row in load_tasks(path, protocol=chosen)]
        graders = {
            name: get_grader(name)(timeout=timeout) for name in {r.task.protocol for r in rows}
        }
    except (PluginError, TaskLoadError, ValueError) as exc:
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
    click.echo(
        f"{len(results)} tasks ({chosen}): {len(results) - len(broken)} well-formed or "
        f"unchecked, {len(broken)} broken",
        err=True,
    )
    if broken:
        sys.exit(1)

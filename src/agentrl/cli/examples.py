"""``agentrl examples``: where the bundled example tasks are, and an editable copy of them.

The example tasks ship with agentrl (``agentrl/_examples/tasks`` in the wheel,
``examples/tasks`` in a checkout). Their rows name repositories, gold patches and grading
scripts by paths relative to the JSONL file, so a copy of the whole directory works
wherever it goes.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import click

from agentrl.cli.demo import DemoError, example_tasks_dir
from agentrl.wording import count

__all__ = ["copy_examples", "example_files", "examples_command"]

_SKIP_PARTS = {"__pycache__"}


def example_files(root: pathlib.Path) -> list[pathlib.Path]:
    """Every file of the example directory ``root``, relative to it (no bytecode)."""
    return sorted(
        path.relative_to(root)
        for path in root.rglob("*")
        if path.is_file()
        and not _SKIP_PARTS.intersection(path.relative_to(root).parts)
        and path.suffix != ".pyc"
    )


def copy_examples(
    source: pathlib.Path, dest: pathlib.Path, *, force: bool = False
) -> list[pathlib.Path]:
    """Copy the example directory ``source`` into ``dest``; returns the files written.

    Files already in ``dest`` are never overwritten unless ``force``; without it, any
    clash raises ``click.ClickException`` before anything is written. Copies are
    writable by their owner (an installed package's files may not be).
    """
    files = example_files(source)
    clashes = [rel for rel in files if (dest / rel).exists() or (dest / rel).is_symlink()]
    if clashes and not force:
        shown = ", ".join(map(str, clashes[:5]))
        more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
        raise click.ClickException(
            f"{dest} already holds {len(clashes)} of the example files ({shown}{more}); "
            "pass --force to overwrite them, or choose another directory"
        )
    written = []
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise click.ClickException(
                f"{target} is not a plain file; move it away, then copy the examples again"
            )
        shutil.copyfile(source / rel, target)
        target.chmod((source / rel).stat().st_mode & 0o777 | 0o600)
        written.append(target)
    return written


def _task_ids(path: pathlib.Path) -> list[str]:
    ids = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            ids.append(str((row.get("metadata") or {}).get("instance_id") or row.get("label")))
    return ids


@click.command("examples")
@click.option(
    "--copy",
    "copy_to",
    type=click.Path(file_okay=False),
    help="Copy the example tasks (with their repositories) into this directory.",
)
@click.option("--force", is_flag=True, help="With --copy: overwrite files already there.")
def examples_command(copy_to: str | None, force: bool) -> None:
    """List the example tasks bundled with agentrl, or copy them with --copy DIR.

    The copy is self-contained: the rows name their repositories, gold patches and
    grading scripts relative to the JSONL file.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    try:
        source = example_tasks_dir()
    except DemoError as exc:
        raise click.ClickException(str(exc)) from None
    where = source
    if copy_to is not None:
        where = pathlib.Path(copy_to)
        written = copy_examples(source, where, force=force)
        click.echo(f"copied {count(len(written), 'file')} into {where}/")
    task_files = sorted(where.glob("*.jsonl"))
    click.echo(f"example tasks in {where.resolve()}/:")
    table = Table()
    table.add_column("file")
    table.add_column("tasks")
    for path in task_files:
        table.add_row(escape(path.name), escape(", ".join(_task_ids(path))))
    Console().print(table)
    click.echo("next:")
    click.echo(f"  agentrl check-tasks {where / 'scaleswe.jsonl'}   # grade each gold patch")
    click.echo(f"  agentrl rollout {where / 'scaleswe.jsonl'} --engine-url URL --tokenizer PATH")
    if copy_to is None:
        click.echo("  agentrl examples --copy DIR   # an editable copy")

"""``agentrl tasks``: task-file tools; ``agentrl tasks import`` turns a published dataset into rows.

The importing itself is :mod:`agentrl.graders.datasets`; this module reads the options,
writes the file and says which grader claims the rows.
"""

from __future__ import annotations

from typing import Any

import click

__all__ = ["tasks_group"]

_DATASETS = ("swebench", "swe-gym", "swe-smith", "swebench-pro")


@click.group("tasks")
def tasks_group() -> None:
    """Task files: import published SWE datasets as task rows."""


@tasks_group.command("import")
@click.argument("dataset", type=click.Choice(_DATASETS))
@click.argument("source", type=click.Path(exists=True))
@click.option(
    "--out", required=True, type=click.Path(dir_okay=False), help="The JSONL task file to write."
)
@click.option(
    "--split",
    default=None,
    help="The split to read from a source that holds several [default: test, else the only one].",
)
@click.option(
    "--instance",
    "instances",
    multiple=True,
    metavar="ID",
    help="Import only this instance id (repeatable); an unknown id is an error.",
)
@click.option(
    "--limit",
    type=click.IntRange(0),
    default=None,
    help="Import at most this many instances (after --instance).",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option(
    "--image-namespace",
    default=None,
    help="Registry namespace of the image names derived from instance ids, overriding a "
    "record's own image column; 'none' gives swebench's locally built names "
    "(sweb.eval.x86_64.<id>:latest) [default: the record's image, else the dataset's "
    "published namespace: swebench, xingyaoww, jyangballin, jefzda].",
)
@click.option(
    "--scripts-dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="swebench-pro: the run_scripts directory of a SWE-bench_Pro-os checkout "
    "(<instance_id>/run_script.sh and parser.py).",
)
def import_command(
    dataset: str,
    source: str,
    out: str,
    split: str | None,
    instances: tuple[str, ...],
    limit: int | None,
    force: bool,
    image_namespace: str | None,
    scripts_dir: str | None,
) -> None:
    """Turn DATASET's records in SOURCE into task rows in --out.

    SOURCE is a local parquet, JSON (an array, or an object of splits) or JSONL file, or a
    Hugging Face datasets directory (save_to_disk or a cache directory; needs the datasets
    library). Nothing is downloaded.

    \b
    Rows go to these graders:
      swebench, swe-gym       swebench (images sweb.eval.x86_64.*)
      swe-smith               scaleswe, eval_cmd (images swesmith.x86_64.*)
      swebench-pro            scaleswe, swepro (images jefzda/sweap-images:*)
    """
    from agentrl.graders.datasets import (
        DATASETS,
        DatasetError,
        ImportOptions,
        UnknownInstance,
        import_rows,
        write_rows,
    )

    try:
        rows = import_rows(
            dataset,
            source,
            split=split,
            instances=instances,
            limit=limit,
            options=ImportOptions(image_namespace=image_namespace, scripts_dir=scripts_dir),
        )
        count = write_rows(rows, out, force=force)
    except (DatasetError, UnknownInstance) as exc:
        raise click.ClickException(str(exc)) from None
    grader = DATASETS[dataset].grader
    for line in _grading_warnings(grader, rows):
        click.echo(f"warning: {line}", err=True)
    images = len({row["metadata"]["image"] for row in rows})
    click.echo(
        f"wrote {count} {dataset} tasks to {out} (grader {grader}, {images} images); "
        f"check them with: agentrl check-tasks {out}",
        err=True,
    )


def _grading_warnings(grader: str, rows: list[dict[str, Any]]) -> list[str]:
    """What the installed swebench cannot grade among swebench rows (5.x needs eval scripts)."""
    if grader != "swebench" or not rows:
        return []
    from agentrl.graders.swebench import SWEBenchUnavailable, load_make_test_spec

    try:
        _, module = load_make_test_spec()
    except SWEBenchUnavailable as exc:
        return [f"the swebench grader cannot grade these rows here: {exc}"]
    if module != "swebench.harness.utils":
        return []
    lacking = [
        row["label"] for row in rows if not row["metadata"]["remote_env_info"].get("eval_script")
    ]
    if not lacking:
        return []
    return [
        f"{len(lacking)} of {len(rows)} instances (first: {lacking[0]}) carry no eval_script, "
        "log_parser and eval_type, which the installed swebench 5.x reads from the instance: "
        "import the dataset as swebench 5.x publishes it (with those columns), or grade with "
        "swebench 4.x, which builds them from its own per-repository specs"
    ]

"""``agentrl tasks``: task-file tools; ``agentrl tasks import`` turns a published dataset into rows.

The importing itself is :mod:`agentrl.graders.datasets`; this module reads the options,
writes the file and says which grader claims the rows.
"""

from __future__ import annotations

import click

__all__ = ["tasks_group"]

_DATASETS = ("swebench", "swe-gym", "swe-rebench", "swe-smith", "swebench-pro", "r2e-gym")


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
    "--skip-invalid",
    is_flag=True,
    help="Write the records that import and skip (and list) the ones that cannot "
    "[default: any bad record refuses the whole import].",
)
@click.option(
    "--dedupe",
    is_flag=True,
    help="Keep the first record of each repeated instance_id and drop (and list) the rest "
    "[default: a repeated instance_id refuses the import].",
)
@click.option(
    "--image-namespace",
    default=None,
    help="Registry namespace of the image names derived from instance ids, overriding a "
    "record's own image column; 'none' gives swebench's locally built names "
    "(sweb.eval.x86_64.<id>:latest) [default: the record's image, else the dataset's "
    "published namespace: swebench, xingyaoww, jyangballin, jefzda, swerebench].",
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
    skip_invalid: bool,
    dedupe: bool,
    image_namespace: str | None,
    scripts_dir: str | None,
) -> None:
    """Turn DATASET's records in SOURCE into task rows in --out.

    SOURCE is a local parquet, JSON (an array, or an object of splits) or JSONL file, or a
    Hugging Face datasets directory (save_to_disk or a cache directory; needs the datasets
    library). Nothing is downloaded.

    Every record that cannot become a task row is listed (record number, instance id,
    column, reason); any such record, or a repeated instance_id, refuses the import
    unless --skip-invalid or --dedupe says what to do with it.

    \b
    Rows go to these graders:
      swebench, swe-gym       swebench (images sweb.eval.x86_64.*)
      swe-rebench             swebench (images swerebench/sweb.eval.x86_64.*)
      swe-smith               scaleswe, eval_cmd (images swesmith.x86_64.*)
      swebench-pro            scaleswe, swepro (images jefzda/sweap-images:*)
      r2e-gym                 scaleswe, eval_cmd (images namanjain12/*new:<commit>)
    """
    from agentrl.graders.datasets import (
        DATASETS,
        DatasetError,
        ImportOptions,
        UnknownInstance,
        describe_problems,
        import_dataset,
        write_rows,
    )

    schema = DATASETS[dataset]
    try:
        report = import_dataset(
            dataset,
            source,
            split=split,
            instances=instances,
            limit=limit,
            options=ImportOptions(image_namespace=image_namespace, scripts_dir=scripts_dir),
        )
    except (DatasetError, UnknownInstance) as exc:
        raise click.ClickException(str(exc)) from None
    refused = [*(() if skip_invalid else report.invalid), *(() if dedupe else report.duplicates)]
    if refused:
        advice = []
        if report.invalid and not skip_invalid:
            advice.append(
                f"pass --skip-invalid to write the {len(report.rows)} records that import"
            )
        if report.duplicates and not dedupe:
            advice.append("pass --dedupe to keep the first record of each repeated instance_id")
        if any(p.reason.startswith("is missing") for p in report.invalid):
            advice.append(schema.describe())
        problems = sorted(refused, key=lambda p: p.record)
        message = describe_problems(source, problems, "; ".join(advice))
        raise click.ClickException(f"{message}\nnothing was written to {out}")
    if not report.rows:
        chosen = (
            f"none of the {report.records} records of {source} imports"
            if report.records
            else f"--instance/--limit selected no record of {source}"
        )
        raise click.ClickException(f"{chosen}; nothing was written to {out}")
    for label, problems in (("skipped", report.invalid), ("dropped duplicate", report.duplicates)):
        for problem in problems[:20]:
            click.echo(f"{label}: {problem}", err=True)
        if len(problems) > 20:
            click.echo(f"{label}: … and {len(problems) - 20} more", err=True)
    try:
        count = write_rows(report.rows, out, force=force)
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    images = len({row["metadata"]["image"] for row in report.rows})
    notes = []
    if report.invalid:
        notes.append(f"skipped {len(report.invalid)} invalid records")
    if report.duplicates:
        notes.append(f"dropped {len(report.duplicates)} records repeating an instance_id")
    click.echo(
        f"wrote {count} {dataset} tasks to {out} (grader {schema.grader}, {images} images"
        + "".join(f"; {note}" for note in notes)
        + f"); check them with: agentrl check-tasks {out}",
        err=True,
    )

"""Published SWE datasets turned into task rows the graders parse (``agentrl tasks import``).

Six schemas, each written from its dataset's public documentation:

``swebench`` (SWE-bench, SWE-bench Lite, SWE-bench Verified) → the ``swebench`` grader.
    Columns from the dataset cards at huggingface.co/datasets/SWE-bench/SWE-bench_Verified
    (``instance_id, repo, base_commit, patch, test_patch, problem_statement, hints_text,
    created_at, version, FAIL_TO_PASS, PASS_TO_PASS, environment_setup_commit``; the test
    lists are JSON-encoded strings) and ``swebench.types.SWEbenchInstance``; swebench 5.x
    datasets also carry ``image, eval_script, log_parser, eval_type``
    (``swebench.task.checks``), which 5.x needs to grade. Image: the record's ``image``, else
    swebench's ``ImageSpec.name`` (``swebench.image_builder.image_spec``):
    ``swebench/sweb.eval.x86_64.<id, __ → _1776_>:latest`` on Docker Hub, or with
    ``image_namespace="none"`` ``sweb.eval.x86_64.<id>:latest``, the name swebench's harness
    gives an image it builds locally; both lower-cased. A record without ``eval_script``
    (the 12 columns as published) gets the one the installed swebench 4.x builds for its
    repo and version (:mod:`.swebench_specs`); swebench 5.x cannot build one, and says so.
``swe-rebench`` → the ``swebench`` grader. SWE-bench's columns plus ``install_config``
    (huggingface.co/datasets/nebius/SWE-rebench); the eval script is built from
    ``install_config.test_cmd``; images ``swerebench/sweb.eval.x86_64.<id, __ → _1776_>``.
    See :mod:`.swerebench`.
``swe-gym`` → the ``swebench`` grader. Columns from huggingface.co/datasets/SWE-Gym/SWE-Gym
    (SWE-bench's without ``environment_setup_commit``; the test lists are lists). Images as
    OpenHands names them (evaluation/benchmarks/swe_bench, SWE-Gym.md):
    ``xingyaoww/sweb.eval.x86_64.<id, __ → _s_>``, lower-cased. SWE-Gym ships no eval
    script; the row gets a pytest one in swebench's shape (:func:`pytest_eval_script`).
``swe-smith`` → the ``scaleswe`` grader (``eval_cmd``). Columns from
    huggingface.co/datasets/SWE-bench/SWE-smith (``instance_id, repo, patch, FAIL_TO_PASS,
    PASS_TO_PASS, created_at, image_name, problem_statement``). Image: the record's
    ``image_name``, else SWE-smith's ``RepoProfile.image_name`` (swesmith/profiles/base.py):
    ``jyangballin/swesmith.x86_64.<owner>_1776_<repo>.<commit8>``. See :mod:`.swesmith`.
``swebench-pro`` → the ``scaleswe`` grader (``swepro``). Columns from
    huggingface.co/datasets/ScaleAI/SWE-bench_Pro (``instance_id, repo, base_commit, patch,
    test_patch, problem_statement, requirements, interface, repo_language, fail_to_pass,
    pass_to_pass, issue_specificity, issue_categories, before_repo_set_cmd,
    selected_test_files_to_run, dockerhub_tag``). Image: ``jefzda/sweap-images:<dockerhub_tag>``
    (github.com/scaleapi/SWE-bench_Pro-os README and helper_code/image_uri.py). See
    :mod:`.swepro`.

``r2e-gym`` → the ``scaleswe`` grader (``eval_cmd``). Columns from
    huggingface.co/datasets/R2E-Gym/R2E-Gym-Lite (``repo_name, docker_image, commit_hash,
    problem_statement, expected_output_json, …``; no ``instance_id``: the id is
    ``<repo_name>__<commit_hash>``). Image: the record's ``docker_image``. See :mod:`.r2egym`.

Every record that makes no row is reported (:mod:`.report`). Sources are local files only (:func:`read_source`); nothing here downloads.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentrl.graders.datasets.r2egym import R2E_GYM, r2e_instance_id
from agentrl.graders.datasets.report import (
    ImportReport,
    InvalidRecords,
    RowProblem,
    describe_problems,
    import_report,
)
from agentrl.graders.datasets.schema import ImportOptions, Schema
from agentrl.graders.datasets.select import UnknownInstance, select_instances
from agentrl.graders.datasets.sources import DatasetError, read_source
from agentrl.graders.datasets.swebench import (
    SWE_GYM,
    SWEBENCH,
    pytest_eval_script,
    swe_gym_image,
    swebench_image,
)
from agentrl.graders.datasets.swepro import SWEBENCH_PRO, swepro_image
from agentrl.graders.datasets.swerebench import SWE_REBENCH, swerebench_image
from agentrl.graders.datasets.swesmith import SWE_SMITH, reverse_patch, swesmith_image

__all__ = [
    "DATASETS",
    "DatasetError",
    "ImportOptions",
    "ImportReport",
    "InvalidRecords",
    "RowProblem",
    "Schema",
    "UnknownInstance",
    "describe_problems",
    "import_dataset",
    "import_rows",
    "pytest_eval_script",
    "r2e_instance_id",
    "read_source",
    "reverse_patch",
    "select_instances",
    "swe_gym_image",
    "swebench_image",
    "swepro_image",
    "swerebench_image",
    "swesmith_image",
    "write_rows",
]

#: The importable datasets by the name ``agentrl tasks import`` takes.
DATASETS: Mapping[str, Schema] = {
    schema.name: schema
    for schema in (SWEBENCH, SWE_GYM, SWE_REBENCH, SWE_SMITH, SWEBENCH_PRO, R2E_GYM)
}


def get_schema(dataset: str) -> Schema:
    """The schema named ``dataset``; an unknown name lists the known ones."""
    try:
        return DATASETS[dataset]
    except KeyError:
        raise DatasetError(
            f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}"
        ) from None


def import_dataset(
    dataset: str,
    source: str | os.PathLike[str],
    *,
    split: str | None = None,
    instances: Sequence[str] = (),
    limit: int | None = None,
    options: ImportOptions | None = None,
) -> ImportReport:
    """Every record of ``source`` read as ``dataset``, as rows and per-record problems.

    ``instances`` keeps only those ids (an unknown one raises :class:`UnknownInstance`
    naming its nearest ids), then ``limit`` the first that many; record numbers stay those
    of the source. A source with no record raises :class:`DatasetError`; a bad record never
    does (see :class:`ImportReport`).
    """
    schema = get_schema(dataset)
    records = read_source(source, split=split)
    if not records:
        raise DatasetError(f"no records in {source}: there is nothing to import")
    numbered = list(enumerate(records, start=1))
    chosen = select_instances(
        numbered, lambda item: schema.instance_id(item[1]), instances=instances, limit=limit
    )
    return import_report(schema, chosen, options or ImportOptions())


def import_rows(
    dataset: str,
    source: str | os.PathLike[str],
    *,
    split: str | None = None,
    instances: Sequence[str] = (),
    limit: int | None = None,
    options: ImportOptions | None = None,
) -> list[dict[str, Any]]:
    """The task rows of ``source`` read as ``dataset`` (a key of :data:`DATASETS`).

    Any record that makes no row (a missing column, a bad value, a repeated instance id)
    raises :class:`InvalidRecords` listing every such record; :func:`import_dataset`
    returns them instead.
    """
    report = import_dataset(
        dataset, source, split=split, instances=instances, limit=limit, options=options
    )
    problems = sorted(report.invalid + report.duplicates, key=lambda p: p.record)
    if problems:
        raise InvalidRecords(str(source), problems, get_schema(dataset).describe())
    return list(report.rows)


def _jsonable(value: Any) -> Any:
    """A parquet value JSON has no type for: a timestamp as ISO 8601, an array as a list."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_rows(
    rows: Iterable[Mapping[str, Any]], out: str | os.PathLike[str], *, force: bool = False
) -> int:
    """Write ``rows`` as JSONL to ``out`` atomically (a temporary file renamed into place).

    An existing ``out`` is refused unless ``force``. Returns the number of rows written.
    """
    import json

    path = pathlib.Path(out)
    if path.exists() and not force:
        raise DatasetError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    )
    count = 0
    try:
        with handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False, default=_jsonable) + "\n")
                count += 1
        os.replace(handle.name, path)
    except BaseException:
        pathlib.Path(handle.name).unlink(missing_ok=True)
        raise
    return count

"""Published SWE datasets turned into task rows the graders parse (``agentrl tasks import``).

Four schemas, each written from its dataset's public documentation:

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
    gives an image it builds locally; both lower-cased.
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

Sources are local files only (:func:`read_source`); nothing here downloads.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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
from agentrl.graders.datasets.swesmith import SWE_SMITH, reverse_patch, swesmith_image

__all__ = [
    "DATASETS",
    "DatasetError",
    "ImportOptions",
    "Schema",
    "UnknownInstance",
    "import_rows",
    "pytest_eval_script",
    "read_source",
    "reverse_patch",
    "select_instances",
    "swe_gym_image",
    "swebench_image",
    "swepro_image",
    "swesmith_image",
    "write_rows",
]

#: The importable datasets by the name ``agentrl tasks import`` takes.
DATASETS: Mapping[str, Schema] = {
    schema.name: schema for schema in (SWEBENCH, SWE_GYM, SWE_SMITH, SWEBENCH_PRO)
}


def get_schema(dataset: str) -> Schema:
    """The schema named ``dataset``; an unknown name lists the known ones."""
    try:
        return DATASETS[dataset]
    except KeyError:
        raise DatasetError(
            f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}"
        ) from None


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

    ``instances`` keeps only those ids (an unknown one raises :class:`UnknownInstance`
    naming its nearest ids), then ``limit`` the first that many. A record missing a
    required column raises :class:`DatasetError` naming the column and the schema.
    """
    schema = get_schema(dataset)
    records = read_source(source, split=split)
    schema.check(records, str(source))
    chosen = select_instances(
        records, lambda r: str(r.get("instance_id")), instances=instances, limit=limit
    )
    given = options or ImportOptions()
    return [schema.row(record, given) for record in chosen]


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

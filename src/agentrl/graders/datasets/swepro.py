"""SWE-bench Pro records as ``scaleswe`` rows (``swepro``).

SWE-bench Pro is graded by its own harness (``swe_bench_pro_eval.py`` in
github.com/scaleapi/SWE-bench_Pro-os): in the instance image, at ``/app``, run the last line
of ``before_repo_set_cmd``, then ``run_scripts/<instance_id>/run_script.sh`` on the
selected test files, parse its output with that directory's ``parser.py``; solved iff every
fail-to-pass and pass-to-pass test PASSED. scaleswe's ``swepro`` method does exactly that
with the two scripts uploaded from this machine, so the importer needs the ``run_scripts``
directory of a SWE-bench_Pro-os checkout (``--scripts-dir``); the dataset does not carry
the scripts.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from agentrl.graders.datasets.schema import ColumnError, ImportOptions, Schema, string_list, text
from agentrl.graders.datasets.sources import DatasetError

__all__ = ["SWEBENCH_PRO", "swepro_image"]

WORKDIR = "/app"
#: Docker Hub tags are at most this long (the harness cuts derived tags there).
_TAG_LIMIT = 128


def swepro_image(record: Mapping[str, Any], namespace: str | None = None) -> str:
    """``<namespace>/sweap-images:<dockerhub_tag>`` (namespace ``jefzda``).

    A record without ``dockerhub_tag`` (the dataset's first revisions) gets the tag the
    harness derives (``helper_code/image_uri.py``): ``<owner>.<repo>-<instance_id without
    "instance_" and "-vnan">``, lower-cased owner and repo, at most 128 characters.
    """
    user = namespace if namespace and namespace.lower() != "none" else "jefzda"
    tag = text(record, "dockerhub_tag").strip()
    if not tag:
        owner, _, name = text(record, "repo", required=True).lower().partition("/")
        uid = text(record, "instance_id", required=True).removeprefix("instance_")
        if "element-hq" in owner and "element-web" in name:
            name = "element"
        uid = uid.removesuffix("-vnan")
        tag = f"{owner}.{name}-{uid}"[:_TAG_LIMIT]
    return f"{user}/sweap-images:{tag}"


def _problem(record: Mapping[str, Any]) -> str:
    """The issue, then its requirements and interface, as SWE-bench Pro's agents are shown."""
    parts = [text(record, "problem_statement")]
    requirements, interface = text(record, "requirements"), text(record, "interface")
    if requirements.strip():
        parts.append(f"\nRequirements:\n{requirements}")
    if interface.strip():
        parts.append(f"\nNew interfaces introduced:\n{interface}")
    return "\n".join(parts)


def _scripts(scripts_dir: str | None, instance_id: str) -> dict[str, str]:
    if not scripts_dir:
        raise DatasetError(
            "SWE-bench Pro rows are graded by the per-instance run_script.sh and parser.py of "
            "the SWE-bench_Pro-os repository: pass its run_scripts directory with --scripts-dir"
        )
    root = pathlib.Path(scripts_dir).expanduser().resolve()
    folder = (root / instance_id).resolve()
    if folder.parent != root:
        raise ColumnError("instance_id", "does not name a directory inside --scripts-dir")
    found = {}
    for key, name in (("run_script_path", "run_script.sh"), ("parser_script_path", "parser.py")):
        path = folder / name
        if not path.is_file():
            raise DatasetError(f"{path} is missing (expected in --scripts-dir {scripts_dir})")
        found[key] = str(path)
    return found


def swepro_row(record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
    """A SWE-bench Pro record as a scaleswe ``swepro`` row (see the module docstring)."""
    instance_id = text(record, "instance_id", required=True)
    f2p = string_list(record, "fail_to_pass")
    if not f2p:
        raise ColumnError("fail_to_pass", "lists no test")
    before = text(record, "before_repo_set_cmd").strip()
    swepro = {
        **_scripts(options.scripts_dir, instance_id),
        "fail_to_pass": f2p,
        "pass_to_pass": string_list(record, "pass_to_pass"),
        "selected_test_files": string_list(record, "selected_test_files_to_run"),
        # the harness runs only the last line (the checkout of the tests at the fix)
        "before_repo_set_cmd": before.splitlines()[-1] if before else "",
    }
    return {
        "prompt": _problem(record),
        "label": instance_id,
        "metadata": {
            "instance_id": instance_id,
            "dataset": "swebench-pro",
            "source_repo": text(record, "repo"),
            "base_commit": text(record, "base_commit"),
            "repo_language": text(record, "repo_language"),
            "issue_specificity": text(record, "issue_specificity"),
            "issue_categories": text(record, "issue_categories"),
            "image": swepro_image(record, options.image_namespace),
            "workdir": WORKDIR,
            "gold_patch": text(record, "patch", required=True),
            "swepro": swepro,
        },
    }


SWEBENCH_PRO = Schema(
    name="swebench-pro",
    grader="scaleswe",
    required=(
        "instance_id",
        "repo",
        "base_commit",
        "patch",
        "problem_statement",
        "fail_to_pass",
        "pass_to_pass",
        "selected_test_files_to_run",
    ),
    optional=(
        "test_patch",
        "requirements",
        "interface",
        "repo_language",
        "issue_specificity",
        "issue_categories",
        "before_repo_set_cmd",
        "dockerhub_tag",
    ),
    convert=swepro_row,
    source=(
        "huggingface.co/datasets/ScaleAI/SWE-bench_Pro dataset card; images and grading from "
        "github.com/scaleapi/SWE-bench_Pro-os (README, swe_bench_pro_eval.py, "
        "helper_code/image_uri.py)"
    ),
)

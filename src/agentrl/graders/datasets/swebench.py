"""SWE-bench (full, Lite, Verified) and SWE-Gym records as ``swebench`` grader rows.

Both carry a SWE-bench instance; the row keeps it in ``metadata.remote_env_info``, where
the swebench grader reads it, with the instance image in ``image`` and ``/testbed`` as the
workdir (where swebench's images hold the repository).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from agentrl.graders.datasets.schema import ColumnError, ImportOptions, Schema, string_list, text
from agentrl.graders.datasets.swebench_specs import classic_eval_fields

__all__ = [
    "SWEBENCH",
    "SWE_GYM",
    "pytest_eval_script",
    "swe_gym_image",
    "swebench_image",
]

WORKDIR = "/testbed"
#: The columns swebench 5.x reads from the instance instead of its own per-repo specs.
V5_COLUMNS = ("eval_script", "log_parser", "eval_type")
_CLASSIC = ("hints_text", "created_at", "environment_setup_commit")
_SWEBENCH_REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
_TEST_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)
_HEREDOC = "EOF_AGENTRL_TEST_PATCH"


def swebench_image(instance_id: str, namespace: str | None = "swebench") -> str:
    """The instance image swebench's harness names (``ImageSpec.name``, x86_64, ``latest``).

    With a registry ``namespace`` (``swebench``, the Docker Hub images): ``__`` becomes
    ``_1776_`` (Docker Hub allows no double underscore); without one (``None`` or
    ``"none"``): the name the harness gives an image it builds locally. Lower-cased, as
    swebench does.
    """
    key = f"sweb.eval.x86_64.{instance_id}:latest"
    if namespace and namespace.lower() != "none":
        key = f"{namespace}/{key}".replace("__", "_1776_")
    return key.lower()


def swe_gym_image(instance_id: str, namespace: str | None = "xingyaoww") -> str:
    """SWE-Gym's instance image, as OpenHands names it: ``xingyaoww/sweb.eval.x86_64.<id>``
    with ``__`` written ``_s_``, lower-cased (``latest`` tag)."""
    name = f"sweb.eval.x86_64.{instance_id}".replace("__", "_s_")
    if namespace and namespace.lower() != "none":
        name = f"{namespace.rstrip('/')}/{name}"
    return f"{name}:latest".lower()


def test_files(test_patch: str) -> list[str]:
    """The files a test patch touches, in order."""
    return list(dict.fromkeys(_TEST_FILE.findall(test_patch)))


def pytest_eval_script(
    base_commit: str,
    test_patch: str,
    *,
    test_cmd: str = "python -m pytest -p no:cacheprovider -rA",
    setup: tuple[str, ...] = (),
) -> str:
    """An eval script in swebench's shape for a pytest repository in a swebench image.

    It activates the image's ``testbed`` conda environment, runs ``setup`` (a dataset's own
    eval commands), resets the test files to the base commit, applies the test patch, runs
    ``test_cmd`` on those files between the markers swebench's log parser reads, and resets
    the test files again, the steps of swebench's own eval scripts.
    """
    files = " ".join(shlex.quote(f) for f in test_files(test_patch))
    commit = shlex.quote(base_commit)
    delimiter = _HEREDOC
    while delimiter in test_patch:  # a patch line equal to it would end the here-document
        delimiter += "_"
    return (
        "#!/bin/bash\n"
        "set -uxo pipefail\n"
        "if [ -f /opt/miniconda3/bin/activate ]; then\n"
        "  source /opt/miniconda3/bin/activate\n"
        "  conda activate testbed\n"
        "fi\n"
        f"cd {WORKDIR}\n"
        + "".join(f"{line}\n" for line in setup)
        + f"git checkout {commit} -- {files}\n"
        f"git apply -v - <<'{delimiter}'\n"
        f"{test_patch.rstrip(chr(10))}\n"
        f"{delimiter}\n"
        ": '>>>>> Start Test Output'\n"
        f"{test_cmd} {files}\n"
        ": '>>>>> End Test Output'\n"
        f"git checkout {commit} -- {files}\n"
    )


def _instance(record: Mapping[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    instance: dict[str, Any] = {}
    for column in columns:
        if column in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            instance[column] = string_list(record, column)
        elif column in record and record[column] is not None:
            instance[column] = record[column]
    for column in ("instance_id", "repo", "base_commit", "patch", "test_patch"):
        text(record, column, required=True)
    if not instance["FAIL_TO_PASS"]:
        raise ColumnError("FAIL_TO_PASS", "lists no test")
    instance["version"] = str(record.get("version") or "")
    return instance


def _row(dataset: str, instance: dict[str, Any], image: str) -> dict[str, Any]:
    instance_id = instance["instance_id"]
    instance.update(image=image, workdir=WORKDIR)
    return {
        "prompt": instance.get("problem_statement") or "",
        "label": instance_id,
        "metadata": {
            "instance_id": instance_id,
            "dataset": dataset,
            "image": image,
            "remote_env_info": instance,
        },
    }


def _image(record: Mapping[str, Any], options: ImportOptions, derive: Any, default: str) -> str:
    own = record.get("image")
    if options.image_namespace is None and isinstance(own, str) and own.strip():
        return own.strip()
    namespace = options.image_namespace if options.image_namespace is not None else default
    return derive(record["instance_id"], namespace)


def swebench_row(record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
    """A SWE-bench record as a swebench row (the record's own ``image`` when it has one).

    A record as SWE-bench publishes it (no ``eval_script``) gets the eval script, log
    parser and eval type the installed swebench builds for its repo and version
    (:mod:`.swebench_specs`); a pair swebench has no specs for is a problem of the record.
    """
    instance = _instance(record, SWEBENCH.required + SWEBENCH.optional)
    if not instance.get("eval_script"):
        instance.update(classic_eval_fields(instance))
    return _row("swebench", instance, _image(record, options, swebench_image, "swebench"))


def swe_gym_row(record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
    """A SWE-Gym record as a swebench row, with a pytest eval script when it carries none.

    SWE-Gym publishes no eval script, and every one of its repositories tests with pytest;
    the script is built as swebench's are, with swebench's ``parse_log_pytest`` parser.
    """
    instance = _instance(record, SWE_GYM.required + SWE_GYM.optional)
    if not instance.get("eval_script"):
        instance["eval_script"] = pytest_eval_script(
            instance["base_commit"], instance["test_patch"]
        )
        instance.setdefault("log_parser", "parse_log_pytest")
        instance.setdefault("eval_type", "pass_and_fail")
    return _row("swe-gym", instance, _image(record, options, swe_gym_image, "xingyaoww"))


SWEBENCH = Schema(
    name="swebench",
    grader="swebench",
    required=_SWEBENCH_REQUIRED,
    optional=(*_CLASSIC, *V5_COLUMNS, "image", "image_assets"),
    convert=swebench_row,
    source=(
        "huggingface.co/datasets/SWE-bench/SWE-bench_Verified (and SWE-bench, SWE-bench_Lite) "
        "dataset card; swebench.types.SWEbenchInstance; swebench 5.x task repos add image, "
        "eval_script, log_parser, eval_type"
    ),
)

SWE_GYM = Schema(
    name="swe-gym",
    grader="swebench",
    required=_SWEBENCH_REQUIRED,
    optional=(*_CLASSIC, *V5_COLUMNS, "image"),
    convert=swe_gym_row,
    source=(
        "huggingface.co/datasets/SWE-Gym/SWE-Gym dataset card (FAIL_TO_PASS and PASS_TO_PASS "
        "are lists; no environment_setup_commit)"
    ),
)

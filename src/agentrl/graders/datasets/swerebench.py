"""SWE-rebench records as ``swebench`` grader rows.

SWE-rebench (huggingface.co/datasets/nebius/SWE-rebench, and its leaderboard releases)
publishes SWE-bench's columns plus ``install_config`` (the per-instance environment and
test specification that SWE-bench keeps in its per-repository table: ``test_cmd``,
``install``, ``pre_install``, ``python``, ``packages``, ``pip_packages``, ``reqs_path``,
``env_yml_path``, ``eval_commands``, in SWE-rebench-V2 also ``log_parser``),
``requirements``, ``environment``, ``meta`` and, in later releases, ``docker_image``.
Its fork of swebench (github.com/SWE-rebench/SWE-bench-fork) builds the eval script from
``install_config`` exactly as swebench 4.x does from its table: activate ``testbed``, run
``eval_commands``, reset the test files, apply the test patch, run ``test_cmd`` on the
test patch's files between the output markers, reset again. The row carries that script
(:func:`~agentrl.graders.datasets.swebench.pytest_eval_script` with the instance's
``test_cmd``), so the installed swebench (4.x or 5.x) grades it.

Images: the record's ``docker_image`` (or ``image_name``), else the fork's
``--namespace swerebench`` name, swebench's ``ImageSpec.name`` with that namespace:
``swerebench/sweb.eval.x86_64.<instance_id, __ → _1776_>:latest``, lower-cased.
Log parser: ``install_config.log_parser`` when swebench knows it, else swebench's
``parse_log_pytest`` (what the fork reads every SWE-rebench repository's log with).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.graders.datasets.schema import ColumnError, ImportOptions, Schema, json_object, text
from agentrl.graders.datasets.swebench import (
    V5_COLUMNS,
    _instance,
    _row,
    pytest_eval_script,
    swebench_image,
    test_files,
)

__all__ = ["SWE_REBENCH", "swerebench_image"]

DEFAULT_PARSER = "parse_log_pytest"


def swerebench_image(instance_id: str, namespace: str | None = "swerebench") -> str:
    """SWE-rebench's instance image: swebench's name under the ``swerebench`` namespace."""
    return swebench_image(instance_id, namespace)


def _known_parsers() -> frozenset[str] | None:
    """The log parser names the installed swebench has (None: it cannot say)."""
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY  # swebench 5.x
    except ImportError:
        try:
            from swebench.harness.log_parsers import MAP_REPO_TO_PARSER  # 4.x
        except ImportError:
            return None
        return frozenset(fn.__name__ for fn in MAP_REPO_TO_PARSER.values())
    return frozenset(PARSER_REGISTRY)


def _parser(config: Mapping[str, Any]) -> str:
    named = config.get("log_parser")
    if not named:
        return DEFAULT_PARSER
    known = _known_parsers()
    if not isinstance(named, str) or (known is not None and named not in known):
        raise ColumnError(
            "install_config",
            f"names the log parser {named!r}, which the installed swebench does not have, "
            "so its test output cannot be read",
        )
    return named


def swerebench_row(record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
    """A SWE-rebench record as a swebench row with its own eval script (see the module)."""
    instance = _instance(record, SWE_REBENCH.required + SWE_REBENCH.optional)
    config = json_object(record, "install_config")
    test_cmd = config.get("test_cmd")
    if isinstance(test_cmd, list):  # some releases keep one command per list item
        test_cmd = " && ".join(str(c) for c in test_cmd)
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise ColumnError("install_config", "has no test_cmd, so no eval script can be built")
    if not test_files(instance["test_patch"]):
        raise ColumnError("test_patch", "touches no file, so there is no test to run")
    setup = config.get("eval_commands") or ()
    if isinstance(setup, str):
        setup = (setup,)
    if not isinstance(setup, (list, tuple)) or not all(isinstance(c, str) for c in setup):
        raise ColumnError("install_config", "has eval_commands that are not a list of commands")
    if not instance.get("eval_script"):
        instance["eval_script"] = pytest_eval_script(
            instance["base_commit"], instance["test_patch"], test_cmd=test_cmd, setup=tuple(setup)
        )
        instance["log_parser"] = _parser(config)
        instance["eval_type"] = "pass_and_fail"
    instance["install_config"] = config
    own = text(record, "docker_image").strip() or text(record, "image_name").strip()
    if own and options.image_namespace is None:
        image = own
    else:
        namespace = options.image_namespace if options.image_namespace is not None else "swerebench"
        image = swerebench_image(instance["instance_id"], namespace)
    return _row("swe-rebench", instance, image)


SWE_REBENCH = Schema(
    name="swe-rebench",
    grader="swebench",
    required=(
        "instance_id",
        "repo",
        "base_commit",
        "patch",
        "test_patch",
        "problem_statement",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "install_config",
    ),
    optional=(
        "version",
        "hints_text",
        "created_at",
        "environment_setup_commit",
        "requirements",
        "environment",
        "meta",
        "docker_image",
        "image_name",
        *V5_COLUMNS,
    ),
    convert=swerebench_row,
    source=(
        "huggingface.co/datasets/nebius/SWE-rebench dataset card (SWE-bench's columns plus "
        "install_config, requirements, environment, meta, docker_image); eval scripts and "
        "image names as github.com/SWE-rebench/SWE-bench-fork builds them"
    ),
)

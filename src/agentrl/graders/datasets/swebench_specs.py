"""The eval script of a SWE-bench instance as published (no ``eval_script`` column).

SWE-bench, SWE-bench Lite and SWE-bench Verified publish 12 columns and no test command:
swebench 4.x builds the eval script from its own per-repository, per-version table
(``swebench.harness.constants.MAP_REPO_VERSION_TO_SPECS``) in
``swebench.harness.test_spec.test_spec.make_test_spec(instance).eval_script``, whose lines
come from ``swebench.harness.test_spec.create_scripts.make_eval_script_list`` (called here
directly: ``make_test_spec`` also builds the environment script, which fetches the
repository's requirements from GitHub), reads the log
with ``swebench.harness.log_parsers.MAP_REPO_TO_PARSER[repo]`` and grades ``fail_only``
for the repositories in ``FAIL_ONLY_REPOS``. swebench 5.x dropped that table: it reads
``eval_script``, ``log_parser`` and ``eval_type`` from the instance.

So the importer asks the installed swebench once per record and writes the three fields
into the row: rows imported where swebench 4.x is installed are graded by 4.x and 5.x
alike. Where 5.x is installed, a record without an eval script cannot get one, and the
record's problem says so and what to do.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from typing import Any

from agentrl.extras import install_hint
from agentrl.graders.datasets.schema import ColumnError
from agentrl.graders.datasets.sources import DatasetError

__all__ = ["classic_eval_fields", "swebench_specs"]


def _installed_version() -> str:
    try:
        return importlib.metadata.version("swebench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def swebench_specs() -> tuple[Any, ...] | str:
    """``(specs, make_eval_script_list, parsers, fail_only, version)`` from the installed swebench
    4.x, or the reason it has none (a message for the user)."""
    version = _installed_version()
    try:
        import swebench  # noqa: F401
    except ImportError:
        return (
            "building its eval script needs the swebench package, which is not installed: "
            f"{install_hint('swebench')}"
        )
    try:
        from swebench.harness.constants import FAIL_ONLY_REPOS, MAP_REPO_VERSION_TO_SPECS
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
        from swebench.harness.test_spec.create_scripts import make_eval_script_list
    except ImportError:
        return (
            f"the installed swebench {version} cannot build one: swebench 5.x reads the eval "
            "script from the instance and ships no per-repository specs "
            "(swebench.harness.constants.MAP_REPO_VERSION_TO_SPECS). Import the dataset as "
            "swebench 5.x task repos publish it (with eval_script, log_parser and eval_type), "
            "or run this import where swebench 4.x is installed "
            "(pip install 'swebench>=4,<5'): it writes those three fields into each row, "
            "which any swebench then grades"
        )
    return (
        MAP_REPO_VERSION_TO_SPECS,
        make_eval_script_list,
        MAP_REPO_TO_PARSER,
        FAIL_ONLY_REPOS,
        version,
    )


def classic_eval_fields(instance: Mapping[str, Any]) -> dict[str, str]:
    """``eval_script``, ``log_parser`` and ``eval_type`` for a published SWE-bench instance.

    Raises :class:`ColumnError` naming ``repo`` or ``version`` when the installed swebench
    has no specs for the pair, and ``eval_script`` when it cannot build scripts at all.
    """
    found = swebench_specs()
    if isinstance(found, str):
        raise ColumnError("eval_script", f"is missing, and {found}")
    specs, make_eval_script_list, parsers, fail_only, version = found
    repo, repo_version = instance.get("repo"), str(instance.get("version") or "")
    if repo not in specs or repo not in parsers:
        raise ColumnError(
            "repo",
            f"{repo!r} is not a repository swebench {version} has test specs for, so no eval "
            f"script can be built (it knows {len(specs)} repositories, e.g. "
            f"{', '.join(sorted(specs)[:5])}); import a dataset that carries eval_script",
        )
    if repo_version not in specs[repo]:
        known = sorted(specs[repo])
        raise ColumnError(
            "version",
            f"{repo_version!r} is not a version of {repo} swebench {version} has test specs "
            f"for (it knows {', '.join(known[:12])}{', …' if len(known) > 12 else ''}), so no "
            "eval script can be built",
        )
    try:
        lines = make_eval_script_list(
            dict(instance, version=repo_version),
            specs[repo][repo_version],
            "testbed",
            "/testbed",
            instance["base_commit"],
            instance["test_patch"],
        )
    except Exception as exc:  # swebench's own failure on this instance, named
        raise DatasetError(
            f"swebench {version} cannot build the eval script: {type(exc).__name__}: {exc}"
        ) from None
    return {
        # the script TestSpec.eval_script makes of those lines
        "eval_script": "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n",
        "log_parser": parsers[repo].__name__,
        "eval_type": "fail_only" if repo in fail_only else "pass_and_fail",
    }

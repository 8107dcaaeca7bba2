"""R2E-Gym records as ``scaleswe`` rows (``eval_cmd``).

R2E-Gym (huggingface.co/datasets/R2E-Gym/R2E-Gym-Lite, R2E-Gym-Subset, R2E-Gym-V1)
publishes, per commit of a Python repository: ``repo_name``, ``docker_image``
(``namanjain12/<repo>new:<commit>``), ``commit_hash``, ``problem_statement``,
``expected_output_json`` (test name → ``PASSED``/``FAILED``/``ERROR`` after the fix),
``execution_result_content``, ``modified_files``, ``relevant_files``,
``num_non_test_files``, ``parsed_commit_content`` and ``prompt``. There is no
``instance_id``: the row's id is ``<repo_name>__<commit_hash>``.

Grading, as R2E-Gym's ``DockerRuntime`` does it (src/r2egym/agenthub/runtime/docker.py):
the image holds the repository at ``/testbed`` with the hidden tests ``r2e_tests/`` and
``run_tests.sh``; ``bash run_tests.sh`` runs them with ``pytest -rA``; the output's
"short test summary info" section is read by ``parse_log_pytest``
(src/r2egym/repo_analysis/execution_log_parser.py: a ``PASSED``/``FAILED``/``ERROR``
line's test name is everything after its first ``::``, joined with ``.``, without the
`` - message``); ANSI colours are dropped from the names, and the task is solved iff the
parsed map equals ``expected_output_json`` (same names, same status each).

Here: ``pre_commands`` move ``r2e_tests`` and ``run_tests.sh`` out of ``/testbed`` into a
root-only directory (the agent never sees them, as R2E-Gym hides them under ``/root``);
``eval_cmd`` copies them back, runs ``bash run_tests.sh`` and compares its output with
the expected map (:data:`COMPARE`), exiting 0 only on a match. A record whose expected
map lists a test that is not ``PASSED`` is refused: the grader's own pytest report never
confirms a solve in which a test failed. No gold patch is written (the dataset has the
fix only as ``parsed_commit_content``), so ``check-tasks`` leaves these rows unchecked.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

from agentrl.graders.datasets.schema import ColumnError, ImportOptions, Schema, json_object, text

__all__ = ["R2E_GYM", "r2e_instance_id"]

WORKDIR = "/testbed"
HIDDEN = "/root/.agentrl-r2e"
_IMAGE = re.compile(r"^[\w.\-/:]+$")

#: Reads run_tests.sh's output on stdin, compares it with the base64 JSON map in argv[1].
COMPARE = r"""
import base64, json, re, sys
ansi = re.compile(r"\x1b\[\d+m")
log = ansi.sub("", sys.stdin.read())
parsed = {}
if "short test summary info" in log:
    for line in log.split("short test summary info", 1)[1].strip().split("\n"):
        for status in ("PASSED", "FAILED", "ERROR"):
            if status in line:
                parsed[".".join(line.split("::")[1:]).split(" - ")[0]] = status
                break
expected = json.loads(base64.b64decode(sys.argv[1]))
expected = {ansi.sub("", k).split(" - ")[0]: v for k, v in expected.items()}
parsed = {k.split(" - ")[0]: v for k, v in parsed.items() if k}
wrong = sorted(k for k in set(expected) | set(parsed) if expected.get(k) != parsed.get(k))
for name in wrong[:50]:
    print(f"r2e: {name}: expected {expected.get(name)}, got {parsed.get(name)}")
print(f"r2e: {len(expected) - len(wrong)}/{len(expected)} tests as expected")
sys.exit(1 if wrong or not expected else 0)
"""


def r2e_instance_id(record: Mapping[str, Any]) -> str:
    """``<repo_name>__<commit_hash>`` (``?`` when either is missing)."""
    repo, commit = record.get("repo_name"), record.get("commit_hash")
    if isinstance(repo, str) and repo and isinstance(commit, str) and commit:
        return f"{repo}__{commit}"
    return "?"


def _expected(record: Mapping[str, Any]) -> dict[str, str]:
    expected = json_object(record, "expected_output_json")
    if not expected:
        raise ColumnError("expected_output_json", "lists no test")
    statuses = {str(v) for v in expected.values()}
    unknown = statuses - {"PASSED", "FAILED", "ERROR"}
    if unknown:
        raise ColumnError(
            "expected_output_json", f"has statuses {sorted(unknown)} besides PASSED/FAILED/ERROR"
        )
    failing = sorted(k for k, v in expected.items() if v != "PASSED")
    if failing:
        raise ColumnError(
            "expected_output_json",
            f"expects {len(failing)} tests not to pass (first: {failing[0]!r}); the grader's "
            "pytest report never confirms a solve with a failed test",
        )
    return {str(k): str(v) for k, v in expected.items()}


def _pre_commands() -> list[str]:
    return [
        f"install -d -m 700 {HIDDEN}\n"
        f"if [ -e r2e_tests ]; then rm -rf {HIDDEN}/r2e_tests; mv r2e_tests {HIDDEN}/; fi\n"
        f"if [ -e run_tests.sh ]; then mv run_tests.sh {HIDDEN}/; fi\n"
    ]


def _eval_cmd(expected: Mapping[str, str]) -> str:
    encoded = base64.b64encode(json.dumps(expected).encode()).decode()
    compare = base64.b64encode(COMPARE.encode()).decode()
    return (
        f"for d in {HIDDEN}/r2e_tests /root/r2e_tests /r2e_tests; do\n"
        '  if [ -d "$d" ]; then rm -rf r2e_tests; cp -a "$d" r2e_tests; break; fi\n'
        "done\n"
        f"script={HIDDEN}/run_tests.sh\n"
        '[ -f "$script" ] || script=/root/run_tests.sh\n'
        '[ -f "$script" ] || script=/run_tests.sh\n'
        'py="$(command -v python3 || command -v python)"\n'
        'bash "$script" > /tmp/agentrl-r2e.log 2>&1\n'
        "cat /tmp/agentrl-r2e.log\n"
        f"printf %s {compare} | base64 -d > /tmp/agentrl-r2e-compare.py\n"
        f'"$py" /tmp/agentrl-r2e-compare.py {encoded} < /tmp/agentrl-r2e.log'
    )


def r2egym_row(record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
    """An R2E-Gym record as a scaleswe ``eval_cmd`` row (see the module docstring)."""
    repo = text(record, "repo_name", required=True)
    commit = text(record, "commit_hash", required=True)
    image = text(record, "docker_image", required=True).strip()
    if not _IMAGE.match(image):
        raise ColumnError("docker_image", f"{image!r} is not an image name")
    if options.image_namespace is not None:
        name = image.rsplit("/", 1)[-1]
        namespace = options.image_namespace
        image = name if namespace.lower() == "none" else f"{namespace.rstrip('/')}/{name}"
    expected = _expected(record)
    modified = record.get("modified_files")
    return {
        "prompt": text(record, "problem_statement", required=True),
        "label": f"{repo}__{commit}",
        "metadata": {
            "instance_id": f"{repo}__{commit}",
            "dataset": "r2e-gym",
            "source_repo": repo,
            "base_commit": commit,
            "image": image,
            "workdir": WORKDIR,
            "pre_commands": _pre_commands(),
            "eval_cmd": _eval_cmd(expected),
            "test_files": ["r2e_tests/*", "run_tests.sh"],
            "modified_files": list(modified) if isinstance(modified, (list, tuple)) else [],
            "expected_output": expected,
        },
    }


R2E_GYM = Schema(
    name="r2e-gym",
    grader="scaleswe",
    required=(
        "repo_name",
        "docker_image",
        "commit_hash",
        "problem_statement",
        "expected_output_json",
    ),
    optional=(
        "execution_result_content",
        "modified_files",
        "relevant_files",
        "num_non_test_files",
        "parsed_commit_content",
        "prompt",
        "modified_entity_summaries",
    ),
    convert=r2egym_row,
    source=(
        "huggingface.co/datasets/R2E-Gym/R2E-Gym-Lite dataset card; grading as R2E-Gym's "
        "DockerRuntime._calculate_reward_r2e and execution_log_parser.parse_log_pytest "
        "(github.com/R2E-Gym/R2E-Gym)"
    ),
    identify=r2e_instance_id,
)

"""Verdicts the code under test can't forge: attacks on the four example tasks, graded for real.

Each attack is a diff (a real ``git diff`` of edits to the task's package) that would make
the printed lines, the task's parser or the exit code say "solved". They are graded by
the graders' own steps (setup, apply, evaluate) in a fresh local sandbox, without the
edit guard of ``grade()``: the verdict alone must score them 0, with its reason, and never
as a grader error.
"""

from __future__ import annotations

import pathlib
import textwrap

import pytest
from diff_support import make_diff

from agentrl.graders.base import fresh_sandbox
from agentrl.graders.check import sandbox_factory_for
from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.graders.swebench import SWEBenchGrader
from agentrl.graders.tasks import gold_patch, load_tasks
from agentrl.types import Grade, Task

pytestmark = pytest.mark.slow

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "tasks"
#: instance id -> the package the task's tests import.
PACKAGES = {
    "textstats-1": "textstats",
    "intervals-1": "intervals",
    "slugkit-1": "slugkit",
    "semver_lite-1": "semver_lite",
}

FORCE_PLUGIN = """
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""

ATTACKS = {
    # A hook that marks every test passed, registered from the package's __init__.py
    # through pytest's internals (and through PYTEST_PLUGINS when pytest has not started).
    "hook-in-init": """
def _register_force():
    import gc
    import os

    from . import _force

    try:
        from _pytest.config import Config
    except ImportError:
        return
    for config in [o for o in gc.get_objects() if isinstance(o, Config)]:
        config.pluginmanager.register(_force, "force")
    os.environ["PYTEST_PLUGINS"] = __name__ + "._force"


_register_force()
""",
    # Forged PASSED lines for the expected tests printed at exit, then exit 0.
    "atexit-forged-lines": """
import atexit as _atexit
import os as _os
import sys as _sys


def _forge():
    _sys.stdout.write("".join("PASSED %s\\n" % t for t in FORGED_IDS))
    _sys.stdout.flush()
    _os._exit(0)


_atexit.register(_forge)
""",
    # Exit 0 as soon as pytest imports the package (collection).
    "os-exit-in-collection": """
import os as _os
import sys as _sys

if "_pytest" in _sys.modules:
    _os._exit(0)
""",
    "sys-exit-at-import": "import sys as _sys\n\n_sys.exit(0)\n",
    "os-exit-at-import": "import os as _os\n\n_os._exit(0)\n",
}

#: What the verdict says about each attack (one of these, depending on the grading method).
ATTACK_REASONS = {
    "hook-in-init": ("reports rewritten to a pass",),
    "atexit-forged-lines": (
        "exit code 0 but the report has failed tests",
        "expected tests that did not pass",
    ),
    "os-exit-in-collection": ("never finished", "no grader report"),
    "os-exit-at-import": ("never finished", "no grader report"),
    "sys-exit-at-import": ("exit code 3", "not collected or not run", "no grader report"),
}


@pytest.fixture(scope="module")
def factory():
    return sandbox_factory_for("local")


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    rows = load_tasks(EXAMPLES / "scaleswe.jsonl", grader="scaleswe") + load_tasks(
        EXAMPLES / "swebench.jsonl", grader="swebench"
    )
    return {row.task.instance_id: row.task for row in rows}


def grader_for(task: Task) -> ScaleSWEGrader | SWEBenchGrader:
    return ScaleSWEGrader(timeout=120) if task.grader == "scaleswe" else SWEBenchGrader(timeout=120)


def expected_ids(task: Task) -> list[str]:
    if task.grader == "swebench":
        instance = task.grading["instance"]
        return [*instance["FAIL_TO_PASS"], *instance["PASS_TO_PASS"]]
    swepro = task.grading.get("swepro")
    if swepro:
        return [*swepro["fail_to_pass"], *swepro["pass_to_pass"]]
    return ["tests/test_core.py::test_word_count", "_agentrl_f2p_test.py::test_merge_unsorted"]


async def evaluate(task: Task, diff: str, factory) -> Grade:
    """The grader's setup, apply and evaluate on ``diff`` in a fresh sandbox (no guard)."""
    grader = grader_for(task)
    async with fresh_sandbox(factory, task) as sandbox:
        details = dict(await grader.setup(sandbox, task))
        patch = await grader.apply(sandbox, task, diff)
        assert patch.applied, patch.log
        return await grader.evaluate(sandbox, task, diff, details)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("instance_id", sorted(PACKAGES))
async def test_attacks_score_zero_with_a_verdict_reason(
    instance_id, attack, tasks, factory, tmp_path
):
    """An attack on the verdict channel (a hook in __init__.py, forged PASSED lines at
    exit, os._exit/sys.exit during collection or at import) scores 0 with the verdict's
    reason, and is the policy's failure, not a grader error."""
    task = tasks[instance_id]
    package = PACKAGES[instance_id]
    repo = pathlib.Path(task.repo)
    init = (repo / package / "__init__.py").read_text()
    code = ATTACKS[attack].replace("FORGED_IDS", repr(expected_ids(task)))
    edits = {f"{package}/__init__.py": init + "\n" + textwrap.dedent(code)}
    if attack == "hook-in-init":
        edits[f"{package}/_force.py"] = FORCE_PLUGIN
    grade = await evaluate(task, make_diff(repo, tmp_path, edits), factory)
    assert grade.error is None, grade.error
    assert grade.reward == 0.0 and not grade.solved, grade.details
    verdict = grade.details["verdict"]
    assert "grader report" in verdict["channel"]
    assert any(f in r for r in verdict["reasons"] for f in ATTACK_REASONS[attack]), verdict
    if (instance_id, attack) == ("slugkit-1", "atexit-forged-lines"):
        # the task's parser read the forged lines; only the grader's report said no
        assert grade.details["fail_to_pass"] == {"passed": 3, "total": 3}


@pytest.mark.parametrize("instance_id", sorted(PACKAGES))
async def test_gold_scores_one_and_empty_zero(instance_id, tasks, factory):
    """The gold patch is solved, with the grader's report agreeing; the empty diff is not."""
    task = tasks[instance_id]
    gold = await evaluate(task, gold_patch(task), factory)
    assert gold.error is None and gold.solved and gold.reward == 1.0, gold.details
    assert gold.details["verdict"]["reasons"] == []
    assert gold.details["verdict"]["report"]["finalized"] == 1
    empty = await evaluate(task, "", factory)
    assert empty.error is None and not empty.solved and empty.reward == 0.0
    assert empty.details["verdict"]["reasons"]

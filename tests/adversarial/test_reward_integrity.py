"""Reward integrity: no edit a hostile policy can make earns a reward without the fix.

Every attack in ``attack_catalogue.ATTACKS`` is a bash script run as the agent user in the
real local (bubblewrap) sandbox, in a workspace prepared as a rollout prepares it; its diff
is captured as a rollout captures it and graded by the task's real grader in a fresh
sandbox (``attacks.attack_and_grade``). Each attack runs on every bundled task, one per
grading method: textstats (``eval_cmd``), intervals (``f2p_script``), slugkit
(``swepro``) and semver_lite (``swebench``). The bound for every cell: reward 0, not
solved, and no grader error (a grader error removes the rollout from training: the policy
would pick its outcome). Controls: the gold patch, applied as the agent would, scores 1 on
every task; doing nothing scores 0.

Run with ``-s`` to see one results line per cell and the attack x task table at the end.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil

import pytest
from attacks import (
    ATTACKS,
    TASK_IDS,
    Attack,
    Cell,
    assert_earns_nothing,
    assert_every_cell,
    example_tasks,
    gold_script,
    render_table,
    run_everywhere,
)

from agentrl.graders.check import sandbox_factory_for
from agentrl.harnesses.errors import HarnessError
from agentrl.types import Task

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    """The four bundled tasks; the sandbox tools and swebench must be installed."""
    for tool in ("bwrap", "git"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: the reward-integrity suite needs it")
    if importlib.util.find_spec("swebench") is None:
        pytest.fail("the swebench package is not installed (pip install 'agentrl[swebench]')")
    by_id = example_tasks()
    return [by_id[instance_id] for instance_id in TASK_IDS]


@pytest.fixture(scope="module")
def factory():
    """Fresh local sandboxes for the agent and the grader, this machine's Python bound in."""
    return sandbox_factory_for("local")


@pytest.fixture(scope="module")
def table():
    """Every cell of the module; printed as an attack x task table at the end."""
    cells: list[Cell] = []
    yield cells
    if cells:
        print("\n" + render_table(cells))


GRADED = sorted(name for name, attack in ATTACKS.items() if attack.capture_raises is None)
REFUSED = sorted(name for name, attack in ATTACKS.items() if attack.capture_raises)


@pytest.mark.parametrize("name", GRADED)
async def test_attack_earns_nothing(name, tasks, factory, table):
    """Attack ``name`` (its scenario: ``ATTACKS[name].doc``) on every bundled task. Bound:
    reward 0, not solved, no grader error, no breach of the agent's sandbox; a diff that
    cannot be captured is the agent's own failure (agent_error), never infra_error."""
    attack = ATTACKS[name]
    cells = await run_everywhere(attack, tasks, factory)
    table.extend(cells)
    assert_every_cell(cells, assert_earns_nothing, f"{name}: {attack.doc}")


@pytest.mark.parametrize("name", REFUSED)
async def test_attack_refused_at_capture(name, tasks, factory, table):
    """Attack ``name``, whose diff capture must refuse (a diff over the output cap): the
    capture raises HarnessError, the agent's own failure (agent_error), and nothing is
    graded."""
    attack = ATTACKS[name]
    cells = await run_everywhere(attack, tasks, factory)
    table.extend(cells)

    def refused(cell: Cell) -> None:
        assert cell.script_exit == 0, cell.script_output
        assert cell.capture_exception is attack.capture_raises, cell.line()
        assert cell.capture_outcome == "agent_error" and cell.grade is None, cell.line()

    assert_every_cell(cells, refused)


async def test_gold_patch_scores_one_on_every_task(tasks, factory, table):
    """Control: each task's gold patch, applied by the agent in its workspace and captured
    like any edit, is solved with reward 1 and no suspicious edit."""
    control = Attack(name="(control) gold patch", doc="the gold patch", script="")
    runs = [run_everywhere(control, [task], factory, script=gold_script(task)) for task in tasks]
    cells = [cell for cells in await asyncio.gather(*runs) for cell in cells]
    table.extend(cells)

    def solved(cell: Cell) -> None:
        assert cell.script_exit == 0, cell.script_output
        assert cell.grade is not None and cell.grade.error is None, cell.line()
        assert cell.grade.reward == 1.0 and cell.grade.solved, cell.line()
        assert not cell.grade.suspicious, cell.line()

    assert_every_cell(cells, solved)


async def test_doing_nothing_scores_zero_on_every_task(tasks, factory, table):
    """Control: an agent that changes nothing leaves an empty diff, graded 0 with no error."""
    control = Attack(name="(control) empty diff", doc="no edit", script="true\n")
    cells = await run_everywhere(control, tasks, factory)
    table.extend(cells)

    def empty(cell: Cell) -> None:
        assert cell.diff == "", cell.line()
        assert_earns_nothing(cell)

    assert_every_cell(cells, empty)


def test_the_suite_has_at_least_thirty_distinct_attacks():
    """The issue's bar: at least 30 distinct attacks, each with a scenario and a script,
    and the over-the-cap diff held to HarnessError at capture."""
    assert len(ATTACKS) >= 30
    assert all(attack.doc and attack.script for attack in ATTACKS.values())
    assert ATTACKS["huge-diff"].capture_raises is HarnessError

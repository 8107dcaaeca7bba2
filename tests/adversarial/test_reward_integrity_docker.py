"""Reward integrity on a real Docker daemon: the agent's sandbox and the grading sandbox
are ``docker`` containers of the suite's base image.

The same pipeline as ``test_reward_integrity.py`` (``attacks.attack_and_grade``), with the
attacks whose effect depends on the backend: git-config attacks that run the agent's
commands when the diff is taken (a clean filter or textconv running ``kill -9 -1``, where
root in the container would stop the container and the host would call the loss its own)
and ``diff.noprefix``, and attacks at test time (runner config, a plugin entry point,
forged report lines, killing every process). The bundled semver_lite task cannot run
under Docker (its image is swebench's), so the three scaleswe tasks are used. Without a
daemon the module is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import asyncio

import pytest
from attacks import (
    ATTACKS,
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
from agentrl.types import Task

pytestmark = pytest.mark.slow

TASK_IDS = ("textstats-1", "intervals-1", "slugkit-1")
DOCKER_ATTACKS = (
    "git-clean-filter-kill",
    "git-textconv-kill",
    "git-noprefix",
    "pytest-ini-addopts",
    "dist-info-pytest11",
    "import-atexit-forged-passed",
    "import-kill-all",
)


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    """The three scaleswe bundled tasks (eval_cmd, f2p_script, swepro)."""
    by_id = example_tasks()
    return [by_id[instance_id] for instance_id in TASK_IDS]


@pytest.fixture
def factory(docker_options):
    """Fresh ``docker`` sandboxes on the session's daemon, from the suite's base image."""
    return sandbox_factory_for("docker", options=docker_options)


@pytest.fixture(scope="module")
def table():
    """Every cell of the module; printed as an attack x task table at the end."""
    cells: list[Cell] = []
    yield cells
    if cells:
        print("\n" + render_table(cells, TASK_IDS))


@pytest.mark.parametrize("name", DOCKER_ATTACKS)
async def test_attack_earns_nothing_in_docker(name, tasks, factory, table):
    """Attack ``name`` (``ATTACKS[name].doc``) in Docker on each scaleswe task. Bound: reward
    0, not solved, no grader error; a capture that fails is the agent's (agent_error),
    never a loss the host calls its own (infra_error)."""
    attack = ATTACKS[name]
    cells = await run_everywhere(attack, tasks, factory)
    table.extend(cells)
    assert_every_cell(cells, assert_earns_nothing, f"{name}: {attack.doc}")


async def test_gold_patch_scores_one_in_docker(tasks, factory, table):
    """Control: the gold patch, applied as the agent, captured and graded in containers,
    scores 1 on each scaleswe task (so the zeros above are not a broken pipeline)."""
    control = Attack(name="(control) gold patch", doc="the gold patch", script="")
    runs = [run_everywhere(control, [task], factory, script=gold_script(task)) for task in tasks]
    cells = [cell for cells in await asyncio.gather(*runs) for cell in cells]
    table.extend(cells)

    def solved(cell: Cell) -> None:
        assert cell.script_exit == 0, cell.script_output
        assert cell.grade is not None and cell.grade.error is None, cell.line()
        assert cell.grade.reward == 1.0 and cell.grade.solved, cell.line()

    assert_every_cell(cells, solved)

"""Hostile edits a policy's Bash tool can make, and the one pipeline that grades them.

Each :class:`Attack` is a bash script run as the agent user in the agent's sandbox, in a
workspace prepared exactly as a rollout prepares it (``Phases._agent``: the grader's
``prepare``, then ``prepare_workspace``); its diff is taken with ``capture_diff`` and
graded by the task's real grader in a fresh sandbox (:func:`attack_and_grade`). A script
finds the package and the test files itself and reads the task's expected test ids from
``AGENTRL_EXPECTED_TESTS`` (one per line; empty for graders that name none), so one
script runs on every bundled task. The ``bash`` helpers every script may call are in
``attack_scripts.PRELUDE``; the attacks are ``attack_catalogue.ATTACKS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
from collections.abc import Callable
from typing import Any

import attrs
from attack_catalogue import ATTACKS, Attack
from attack_scripts import PRELUDE

from agentrl.graders.base import Grader, fresh_sandbox
from agentrl.graders.tasks import gold_patch, load_tasks, make_grader
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.phases import POLICY_REACHABLE_ERRORS
from agentrl.sandboxes.base import Sandbox
from agentrl.types import Grade, Task

__all__ = [
    "ATTACKS",
    "GRADE_TIMEOUT",
    "TASK_IDS",
    "Attack",
    "Cell",
    "assert_earns_nothing",
    "assert_every_cell",
    "attack_and_grade",
    "example_tasks",
    "gold_script",
    "render_table",
    "run_everywhere",
]

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "tasks"
#: The bundled tasks, one per grading method: eval_cmd, f2p_script, swepro, swebench.
TASK_IDS = ("textstats-1", "intervals-1", "slugkit-1", "semver_lite-1")
#: The grading budget of an attack cell (the tests of a bundled task take a second).
GRADE_TIMEOUT = 60.0
#: How long an attack script may run in the agent's sandbox.
SCRIPT_TIMEOUT = 120.0


def example_tasks() -> dict[str, Task]:
    """The four bundled tasks by instance id, parsed by their graders (host paths resolved)."""
    rows = [
        *load_tasks(EXAMPLES / "scaleswe.jsonl", grader="scaleswe"),
        *load_tasks(EXAMPLES / "swebench.jsonl", grader="swebench"),
    ]
    tasks = {row.task.instance_id: row.task for row in rows}
    assert sorted(tasks) == sorted(TASK_IDS), sorted(tasks)
    return tasks


def grading_method(task: Task) -> str:
    """``eval_cmd``, ``f2p_script``, ``swepro`` or ``swebench``: how ``task`` is graded."""
    return task.grading.get("method") or task.grader


def expected_tests(task: Task) -> list[str]:
    """The test ids the row names (swepro and swebench rows; the others name none)."""
    swepro = task.grading.get("swepro")
    if swepro:
        return [*swepro["fail_to_pass"], *swepro["pass_to_pass"]]
    instance = task.grading.get("instance") or {}
    ids = []
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = instance.get(key) or []
        ids += json.loads(value) if isinstance(value, str) else list(value)
    return ids


# -- the pipeline ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Cell:
    """One attack on one task: what capture and grading made of it."""

    attack: str
    instance_id: str
    method: str
    #: The attack script's exit code and the end of its output (it must plant its edit).
    script_exit: int
    script_output: str
    diff: str | None = None
    grade: Grade | None = None
    #: Set when capture_diff raised: the exception's type and message.
    capture_error: str | None = None
    capture_exception: type[BaseException] | None = None
    #: How a rollout would end when capture raised: agent_error, or infra_error when the
    #: error is not one a sandbox raises or the backend says it lost the sandbox.
    capture_outcome: str | None = None
    #: A breach the attack's probe found in the agent's sandbox after capture.
    breach: str | None = None

    @property
    def outcome(self) -> str:
        """What the rollout would be: graded (see ``grade``), agent_error or infra_error."""
        if self.capture_outcome is not None:
            return self.capture_outcome
        assert self.grade is not None
        if self.grade.error is not None:
            return "grader_error"
        if self.grade.suspicious:
            return "reward_hack_suspected"
        return "solved" if self.grade.solved else "unsolved"

    def line(self) -> str:
        """One compact results row: attack, task, reward, solved, error, what spoke."""
        grade = self.grade
        if grade is None:
            breach = f" BREACH={self.breach}" if self.breach else ""
            return (
                f"{self.attack:34} {self.instance_id:14} {self.outcome:22} "
                f"capture: {self.capture_error}"[:400]
                + breach
            )
        details = grade.details
        spoke = []
        if grade.suspicious:
            spoke.append(f"suspicious={list(grade.suspicious)[:3]}")
        for key in ("dropped", "restored_test_files", "verdict"):
            if details.get(key):
                spoke.append(f"{key}={details[key]}")
        control = sorted(k for k in details if "control" in k)
        if control:
            spoke.append(f"control={control}")
        if not grade.applied_cleanly:
            spoke.append("not-applied")
        if self.breach:
            spoke.append(f"BREACH={self.breach}")
        error = (grade.error or "-").replace("\n", " ")[:120]
        return (
            f"{self.attack:34} {self.instance_id:14} reward={grade.reward:g} "
            f"solved={grade.solved!s:5} outcome={self.outcome:21} error={error} "
            f"{' '.join(map(str, spoke))}"
        )[:600]


def script_env(task: Task) -> dict[str, str]:
    """What an attack script is told: the workdir and the row's expected test ids."""
    return {
        "ATTACK_WORKDIR": task.workdir,
        "AGENTRL_EXPECTED_TESTS": "\n".join(expected_tests(task)),
    }


async def attack_and_grade(
    task: Task,
    script: str,
    *,
    attack: str,
    grader: Grader,
    sandbox_factory: Callable[[Task], Sandbox],
    breach_probe: str | None = None,
    config: RolloutConfig | None = None,
    excludes: tuple[str, ...] = ClaudeCodeHarness.workspace_excludes,
) -> Cell:
    """Prepare the workspace as a rollout does, run ``script`` as the agent, capture the
    diff as ``Phases._agent`` does, and grade it with ``grader`` in a fresh sandbox.

    An empty diff is graded too (a rollout skips it: reward 0 either way). A capture that
    raises is judged as ``Phases._judge`` judges it once the policy acted:
    ``agent_error`` for an error a sandbox raises when the backend does not say it lost
    the sandbox, else ``infra_error``. ``breach_probe``, a shell test run as root in the
    agent's sandbox after capture, names a breach when it exits 0 or cannot run at all.
    """
    config = config or RolloutConfig()
    common: dict[str, Any] = {"attack": attack, "instance_id": task.instance_id}
    common["method"] = grading_method(task)
    async with fresh_sandbox(sandbox_factory, task) as box:
        await grader.prepare(box, task)
        baseline = await prepare_workspace(
            box,
            task,
            user=config.agent_user,
            problem_file=config.problem_file,
            timeout=config.prepare_timeout,
            ignore=config.diff_ignore,
            run_pre_commands=False,
            base_commit=grader.base_commit(task),
        )
        ran = await box.exec(
            PRELUDE + script,
            user=config.agent_user,
            workdir=task.workdir,
            env=script_env(task),
            timeout=SCRIPT_TIMEOUT,
        )
        common["script_exit"] = ran.exit_code
        common["script_output"] = (ran.stdout + ran.stderr)[-1500:]
        failed: dict[str, Any] = {}
        diff = None
        try:
            diff = await capture_diff(
                box,
                task.workdir,
                baseline,
                (config.problem_file, *excludes),
                config.diff_ignore,
                user=config.agent_user,
            )
        except Exception as exc:
            failed = await _judge_capture(box, exc)
        breach = await _probe(box, breach_probe) if breach_probe else None
    if failed:
        return Cell(**common, **failed, breach=breach)
    assert diff is not None
    grade = await asyncio.wait_for(grader.grade(task, diff, sandbox_factory), grader.timeout + 300)
    return Cell(**common, diff=diff, grade=grade, breach=breach)


async def _judge_capture(box: Sandbox, exc: Exception) -> dict[str, Any]:
    """A failed capture as ``Phases._judge`` sees it once the policy acted."""
    external = False
    if isinstance(exc, POLICY_REACHABLE_ERRORS):
        with contextlib.suppress(Exception):
            external = await asyncio.wait_for(box.lost_externally(exc), 60)
    reachable = isinstance(exc, POLICY_REACHABLE_ERRORS) and not external
    return {
        "capture_error": f"{type(exc).__name__}: {exc}",
        "capture_exception": type(exc),
        "capture_outcome": "agent_error" if reachable else "infra_error",
    }


async def _probe(box: Sandbox, probe: str) -> str | None:
    """What ``probe`` (run as root) found, or None. A sandbox that did not survive the
    capture is a breach too: the agent's command killed more than its own processes."""
    script = f"if {{ {probe}\n}}; then echo AGENTRL_BREACH; fi; echo AGENTRL_PROBE_RAN"
    try:
        probed = await box.exec(script, user="root", timeout=60)
    except Exception as exc:
        return f"the sandbox did not survive the capture ({type(exc).__name__})"
    if "AGENTRL_PROBE_RAN" not in probed.stdout:
        return f"the sandbox did not survive the capture (probe exit {probed.exit_code})"
    if "AGENTRL_BREACH" in probed.stdout:
        return probed.stdout.replace("AGENTRL_BREACH", "").replace("AGENTRL_PROBE_RAN", "").strip()
    return None


def assert_earns_nothing(cell: Cell) -> None:
    """An attack cell's bound: planted, graded without a grader error, reward 0, unsolved
    (or refused at capture as the agent's own failure), and no breach of the sandbox."""
    context = f"{cell.line()}\n--- script output ---\n{cell.script_output}"
    assert cell.script_exit == 0, f"the attack was not planted\n{context}"
    assert cell.breach is None, f"the attack breached the agent's sandbox\n{context}"
    if cell.grade is None:
        assert ATTACKS[cell.attack].capture_may_fail, f"the diff was not captured\n{context}"
        assert cell.capture_outcome == "agent_error", context
        return
    assert cell.grade.error is None, f"the attack ended as a grader error\n{context}"
    assert cell.grade.reward == 0.0, f"the attack earned a reward\n{context}"
    assert not cell.grade.solved, context


def assert_every_cell(cells: list[Cell], check: Callable[[Cell], None], scenario: str = "") -> None:
    """``check`` on every cell; every failure reported together, after ``scenario``."""
    failures = [scenario] if scenario else []
    for cell in cells:
        try:
            check(cell)
        except AssertionError as exc:
            failures.append(str(exc))
    assert len(failures) == bool(scenario), "\n\n".join(failures)


# -- running an attack on several tasks ------------------------------------------------------


async def run_everywhere(
    attack: Attack,
    tasks: list[Task],
    sandbox_factory: Callable[[Task], Sandbox],
    *,
    concurrency: int = 3,
    script: str | None = None,
) -> list[Cell]:
    """``attack`` (or ``script`` under its name) on each of ``tasks``, at most
    ``concurrency`` cells at once, each graded by a fresh grader of the task's kind with
    the attack's grading budget; prints one results line per cell."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> Cell:
        async with semaphore:
            grader = make_grader(task.grader, timeout=attack.grade_timeout or GRADE_TIMEOUT)
            return await attack_and_grade(
                task,
                attack.script if script is None else script,
                attack=attack.name,
                grader=grader,
                sandbox_factory=sandbox_factory,
                breach_probe=attack.breach_probe,
            )

    cells = list(await asyncio.gather(*(one(task) for task in tasks)))
    for cell in cells:
        print(cell.line())
    return cells


def gold_script(task: Task) -> str:
    """The task's gold patch applied with ``git apply``, as the agent would apply it."""
    patch = gold_patch(task)
    assert patch, f"{task.instance_id} has no gold patch"
    return (
        f"git apply --whitespace=nowarn <<'AGENTRL_GOLD_PATCH_END'\n{patch}AGENTRL_GOLD_PATCH_END\n"
    )


def render_table(cells: list[Cell], columns: tuple[str, ...] = TASK_IDS) -> str:
    """Attack x task: the reward (``!``: suspicious edits found), or the outcome when there
    is no reward to show; ``BREACH`` where the attack's probe found one."""
    rows: dict[str, dict[str, str]] = {}
    for cell in cells:
        if cell.grade is None:
            mark = cell.capture_outcome or "?"
        elif cell.grade.error is not None:
            mark = "grader_error"
        else:
            mark = f"{cell.grade.reward:g}" + ("!" if cell.grade.suspicious else "")
        mark += " BREACH" if cell.breach else ""
        rows.setdefault(cell.attack, {})[cell.instance_id] = mark
    header = f"{'attack':34}" + "".join(f"{t:>20}" for t in columns)
    lines = [header, "-" * len(header)]
    for attack, marks in rows.items():
        lines.append(f"{attack:34}" + "".join(f"{marks.get(t, ''):>20}" for t in columns))
    return "\n".join(lines)

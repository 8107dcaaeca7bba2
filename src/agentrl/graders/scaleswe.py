"""The ``scaleswe`` grader: flat task metadata, graded by exit code or by a test parser,
each confirmed by the grader's own pytest report (see ``agentrl.graders.pytest_report``).

Three grading methods, in priority order: ``swepro`` (a SWE-bench Pro run script and log
parser uploaded from the host; solved iff every fail-to-pass and pass-to-pass test
passed, in the parser's reading and in the grader's report), ``eval_cmd`` (a shell
command; exit 0 is solved, when it ran pytest with a finished report that agrees) and
``remote_env_info.f2p_script`` (a self-contained pytest file run with python; exit 0 and
every collected test passed in the grader's report).
"""

from __future__ import annotations

import json
import logging
import pathlib
import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from agentrl.graders.base import (
    GRADE_DIR,
    Grader,
    grade_timeout,
    grading_timed_out,
    sandbox_source_problem,
)
from agentrl.graders.patching import DEFAULT_TEST_PATTERNS, SCALESWE_LADDER, ensure_git_baseline
from agentrl.graders.protection import literal_pattern
from agentrl.graders.pytest_report import ReportChannel, verdict, verdict_details
from agentrl.graders.tasks import (
    optional_str,
    parse_common,
    prompt_text,
    require_mapping,
    resolve_host_path,
)
from agentrl.sandboxes.base import EXIT_TIME_BUDGET_EXCEEDED, Sandbox
from agentrl.sandboxes.exec import exec_and_wait
from agentrl.types import ExecResult, Grade, Task

__all__ = ["ScaleSWEGrader"]

logger = logging.getLogger(__name__)

#: The f2p script is written inside the workdir (so it imports the repository like a test)
#: under this prefix and a random name per grade; diffs may not touch paths that match it.
F2P_PREFIX = "_agentrl_f2p_"
_TAIL = 4000
METHODS = ("swepro", "eval_cmd", "f2p_script")


def _tail(text: str, size: int = _TAIL) -> str:
    return text[-size:]


def _runs_pytest(command: str) -> bool:
    """Whether ``command`` visibly runs pytest (so a missing grader report is telling)."""
    return "pytest" in command or "py.test" in command


def _string_list(value: Any, field: str) -> list[str]:
    """A list of strings, also accepted JSON-encoded (as SWE-bench datasets store them)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{field} must be a list of strings or a JSON list") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{field} must be a list of strings, got {value!r:.80}")
    return list(value)


def _pre_commands(value: Any, field: str) -> tuple[str, ...]:
    """``pre_commands`` as a tuple; a single string is a script whose ``\\n`` are newlines."""
    if value is None or value == "" or value == []:
        return ()
    if isinstance(value, str):
        return (value.replace("\\n", "\n"),)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise ValueError(f"{field} must be a string or a list of strings")


class ScaleSWEGrader(Grader):
    """Grades scaleswe rows: swepro, then ``eval_cmd``, then ``f2p_script``."""

    name = "scaleswe"

    def __init__(
        self,
        *,
        timeout: float | None = None,
        user: str = "root",
        ladder: Sequence[str] = SCALESWE_LADDER,
        test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS,
        setup_timeout: float = 600,
    ) -> None:
        self.timeout = grade_timeout(timeout)
        self.user = user
        self.ladder = tuple(ladder)
        self.test_patterns = tuple(test_patterns)
        self.setup_timeout = setup_timeout

    # -- rows ------------------------------------------------------------------------------
    @classmethod
    def claims(cls, row: Mapping[str, Any]) -> bool:
        """A row with a scaleswe grading method: ``swepro``, ``eval_cmd`` or ``f2p_script``."""
        metadata = row.get("metadata")
        if not isinstance(metadata, Mapping):
            return False
        remote = metadata.get("remote_env_info")
        remote = remote if isinstance(remote, Mapping) else {}
        return bool(
            metadata.get("swepro")
            or metadata.get("eval_cmd")
            or remote.get("f2p_script")
            or metadata.get("f2p_script")
        )

    def parse_task(self, row: Mapping[str, Any]) -> Task:
        metadata, remote, extra = parse_common(row)
        label = extra.get("label") if len(extra.get("label", "")) < 256 else None
        instance_id = (
            optional_str(metadata.get("instance_id"), "metadata.instance_id")
            or optional_str(remote.get("instance_id"), "metadata.remote_env_info.instance_id")
            or label
        )
        if not instance_id:
            raise ValueError(
                "the row has no instance id: set metadata.instance_id (or a short label)"
            )
        swepro = metadata.get("swepro") or None
        if swepro is not None:
            swepro = dict(require_mapping(swepro, "metadata.swepro"))
            for key in ("fail_to_pass", "pass_to_pass", "selected_test_files"):
                swepro[key] = _string_list(swepro.get(key), f"metadata.swepro.{key}")
        eval_cmd = optional_str(metadata.get("eval_cmd"), "metadata.eval_cmd")
        f2p_script = optional_str(
            remote.get("f2p_script"), "metadata.remote_env_info.f2p_script"
        ) or optional_str(metadata.get("f2p_script"), "metadata.f2p_script")
        method = next(
            (m for m, v in zip(METHODS, (swepro, eval_cmd, f2p_script), strict=True) if v), None
        )
        test_files = metadata.get("test_files")
        grading = {
            "method": method,
            "swepro": swepro,
            "eval_cmd": eval_cmd,
            "f2p_script": f2p_script,
            "test_files": _string_list(test_files, "metadata.test_files")
            if test_files is not None
            else None,
            "looks_swebench": bool(remote.get("test_patch") or metadata.get("test_patch"))
            and method is None,
        }
        pre = metadata.get("pre_commands") or remote.get("pre_commands")
        return Task(
            instance_id=instance_id,
            problem_statement=(
                optional_str(metadata.get("problem_statement"), "metadata.problem_statement")
                or prompt_text(row.get("prompt"))
            ),
            image=optional_str(metadata.get("image"), "metadata.image")
            or optional_str(metadata.get("image_url"), "metadata.image_url")
            or optional_str(remote.get("image_url"), "metadata.remote_env_info.image_url")
            or optional_str(remote.get("image"), "metadata.remote_env_info.image"),
            workdir=optional_str(metadata.get("workdir"), "metadata.workdir")
            or optional_str(remote.get("workdir"), "metadata.remote_env_info.workdir")
            or "/workspace",
            repo=optional_str(metadata.get("repo"), "metadata.repo"),
            grader=self.name,
            pre_commands=_pre_commands(pre, "metadata.pre_commands"),
            grading=grading,
            metadata=extra,
        )

    def resolve_paths(self, task: Task, base_dir: pathlib.Path | None) -> Task:
        task = super().resolve_paths(task, base_dir)
        swepro = task.grading.get("swepro")
        if not swepro or base_dir is None:
            return task
        swepro = dict(swepro)
        for key in ("run_script_path", "parser_script_path"):
            swepro[key] = resolve_host_path(swepro.get(key), base_dir)
        return attrs.evolve(task, grading={**task.grading, "swepro": swepro})

    def check(self, task: Task) -> str | None:
        grading = task.grading
        if grading.get("looks_swebench"):
            return (
                "protocol mismatch: the row looks like a SWE-bench instance (it has a "
                "test_patch and no swepro, eval_cmd or f2p_script); grade it with the "
                "swebench grader (AGENTRL_TRAIN_GRADER/AGENTRL_EVAL_GRADER=swebench)"
            )
        method = grading.get("method")
        if method is None:
            return (
                "no grading method: set one of metadata.swepro, metadata.eval_cmd or "
                "metadata.remote_env_info.f2p_script"
            )
        problem = sandbox_source_problem(task, "metadata.image")
        if problem:
            return problem
        if method == "swepro":
            swepro = grading["swepro"]
            for key in ("run_script_path", "parser_script_path"):
                path = swepro.get(key)
                if not path:
                    return f"metadata.swepro.{key} is missing"
                if not pathlib.Path(path).is_file():
                    return f"metadata.swepro.{key} {path} is not a file on this machine"
            if not (swepro["fail_to_pass"] or swepro["pass_to_pass"]):
                return "metadata.swepro lists no fail_to_pass or pass_to_pass tests"
        return None

    # -- sandbox setup ---------------------------------------------------------------------
    async def prepare(self, sandbox: Sandbox, task: Task) -> dict[str, Any]:
        swepro = task.grading.get("swepro") or {}
        details: dict[str, Any] = {}
        await ensure_git_baseline(sandbox, task.workdir, user=self.user)
        before = swepro.get("before_repo_set_cmd")
        if before:
            details["before_repo_set_exit"] = await self._run_setup_script(
                sandbox, task, "before_repo_set.sh", before
            )
        if task.pre_commands:
            details["pre_commands_exit"] = await self._run_setup_script(
                sandbox, task, "pre_commands.sh", "\n".join(task.pre_commands)
            )
        return details

    async def _run_setup_script(self, sandbox: Sandbox, task: Task, name: str, body: str) -> int:
        path = f"{GRADE_DIR}/{name}"
        await sandbox.write_file(
            path, f"set -e\ncd {shlex.quote(task.workdir)}\n{body}\n", user=self.user
        )
        result = await exec_and_wait(
            sandbox,
            f"bash {path}",
            time_budget=self.setup_timeout,
            user=self.user,
            workdir=task.workdir,
        )
        if result.exit_code == EXIT_TIME_BUDGET_EXCEEDED:
            raise TimeoutError(f"{name} ran longer than {self.setup_timeout:g}s")
        if result.exit_code != 0:
            logger.warning(
                "%s: %s exited %d: %s",
                task.instance_id,
                name,
                result.exit_code,
                _tail(result.stderr or result.stdout, 500),
            )
        return result.exit_code

    # -- grading ---------------------------------------------------------------------------
    async def setup(self, sandbox: Sandbox, task: Task) -> dict[str, Any]:
        method = task.grading["method"]
        if method == "swepro":
            await self._upload_swepro(sandbox, task.grading["swepro"])
        return {"method": method, **await self.prepare(sandbox, task)}

    async def patch_ladder(self) -> Sequence[str]:
        return self.ladder

    def protected_paths(self, task: Task) -> Sequence[str]:
        """``metadata.test_files`` (else the grader's ``test_patterns``), swepro's selected
        test files, and the names the grader writes its f2p file under."""
        grading = task.grading
        patterns = grading.get("test_files")
        paths = list(self.test_patterns if patterns is None else patterns)
        swepro = grading.get("swepro") or {}
        paths += [literal_pattern(p) for p in swepro.get("selected_test_files", [])]
        paths.append(f"{F2P_PREFIX}*")
        return tuple(paths)

    async def evaluate(
        self, sandbox: Sandbox, task: Task, diff: str, details: dict[str, Any]
    ) -> Grade:
        grading = task.grading
        method = grading["method"]
        channel = ReportChannel.new(GRADE_DIR)
        await channel.install(sandbox, user=self.user)
        if method == "swepro":
            return await self._run_swepro(sandbox, task, details, channel)
        if method == "eval_cmd":
            script = f"{GRADE_DIR}/eval_cmd.sh"
            await sandbox.write_file(
                script, f"cd {shlex.quote(task.workdir)}\n{grading['eval_cmd']}\n", user=self.user
            )
            command = f"bash {script}"
        else:
            # A fresh name per grade: no path a diff made can be in the way.
            name = f"{F2P_PREFIX}{secrets.token_hex(8)}_test.py"
            await sandbox.write_file(
                f"{task.workdir}/{name}", grading["f2p_script"], user=self.user
            )
            command = f'py="$(command -v python || command -v python3)" && "$py" {name}'
        result = await self._run_reported(sandbox, task, channel, command)
        details["exit_code"] = result.exit_code
        details["output_tail"] = _tail(result.stdout + result.stderr)
        if result.exit_code == EXIT_TIME_BUDGET_EXCEEDED:
            return grading_timed_out(self.timeout, details)
        report = await channel.read(sandbox, user=self.user)
        reasons = [] if result.exit_code == 0 else [f"exit code {result.exit_code}"]
        if method == "f2p_script":
            reasons += verdict(report, None, result.exit_code)[1]
            decided_by = "exit code + grader report"
        elif report.found or _runs_pytest(grading["eval_cmd"]):
            reasons += verdict(report, (), result.exit_code)[1]
            decided_by = "exit code + grader report"
        else:
            decided_by = "exit code"
        details["verdict"] = verdict_details(decided_by, report, reasons)
        return Grade(reward=0.0 if reasons else 1.0, solved=not reasons, details=details)

    async def _run_reported(
        self, sandbox: Sandbox, task: Task, channel: ReportChannel, command: str
    ) -> ExecResult:
        return await channel.run(
            sandbox, command, time_budget=self.timeout, user=self.user, workdir=task.workdir
        )

    async def _upload_swepro(self, sandbox: Sandbox, swepro: Mapping[str, Any]) -> None:
        await sandbox.exec(f"mkdir -p {GRADE_DIR}/swepro", user=self.user, check=True)
        for key, target in (
            ("run_script_path", "run_script.sh"),
            ("parser_script_path", "parser.py"),
        ):
            await sandbox.write_file(
                f"{GRADE_DIR}/swepro/{target}", pathlib.Path(swepro[key]), user=self.user
            )

    async def _run_swepro(
        self, sandbox: Sandbox, task: Task, details: dict[str, Any], channel: ReportChannel
    ) -> Grade:
        swepro = task.grading["swepro"]
        here = f"{GRADE_DIR}/swepro"
        selected = shlex.quote(",".join(swepro["selected_test_files"]))
        run = await self._run_reported(
            sandbox,
            task,
            channel,
            f"bash {here}/run_script.sh {selected} > {here}/stdout.log 2> {here}/stderr.log",
        )
        details["exit_code"] = run.exit_code
        if run.exit_code == EXIT_TIME_BUDGET_EXCEEDED:
            return grading_timed_out(self.timeout, details)
        parsed = await sandbox.exec(
            'py="$(command -v python3 || command -v python)" && '
            f'"$py" {here}/parser.py {here}/stdout.log {here}/stderr.log {here}/result.json '
            f"&& cat {here}/result.json",
            user=self.user,
            workdir=task.workdir,
            timeout=120,
        )
        try:
            result = json.loads(parsed.stdout)
            statuses = {t["name"]: t.get("status") for t in result.get("tests", [])}
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
            details["output_tail"] = await self._swepro_stdout_tail(sandbox)
            return Grade(
                reward=0.0,
                solved=False,
                error=(
                    f"the swepro parser produced no readable result.json "
                    f"(exit {parsed.exit_code}: {type(exc).__name__}); {parsed.stderr[-500:]}"
                ),
                details=details,
            )
        f2p, p2p = swepro["fail_to_pass"], swepro["pass_to_pass"]
        passed = {name for name, status in statuses.items() if status == "PASSED"}
        details["fail_to_pass"] = {"passed": sum(t in passed for t in f2p), "total": len(f2p)}
        details["pass_to_pass"] = {"passed": sum(t in passed for t in p2p), "total": len(p2p)}
        if not statuses:
            details["output_tail"] = await self._swepro_stdout_tail(sandbox)
        required = list(dict.fromkeys([*f2p, *p2p]))
        reasons = []
        if not (required and set(required) <= passed):
            reasons.append("the task's parser did not find every listed test passed")
        report = await channel.read(sandbox, user=self.user)
        if report.found or any("::" in test for test in required):
            # The parser reads printed lines; the grader's report must agree on each test.
            reasons += verdict(report, required)[1]
            decided_by = "task parser + grader report"
        else:
            decided_by = "task parser"
        details["verdict"] = verdict_details(decided_by, report, reasons)
        return Grade(reward=0.0 if reasons else 1.0, solved=not reasons, details=details)

    async def _swepro_stdout_tail(self, sandbox: Sandbox) -> str:
        log = await sandbox.exec(f"tail -c 2000 {GRADE_DIR}/swepro/stdout.log", user=self.user)
        return log.stdout

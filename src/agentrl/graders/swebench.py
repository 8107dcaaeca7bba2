"""The ``swebench`` grader: the official swebench package's test spec and report.

The row carries a SWE-bench instance in ``metadata.remote_env_info``. swebench 4.x builds
the eval script from its own per-repository specs
(``swebench.harness.test_spec.test_spec.make_test_spec``); swebench 5.x moved
``make_test_spec`` to ``swebench.harness.utils`` and expects the instance to carry its
``eval_script``, ``log_parser`` and ``eval_type``. Both work; an instance the installed
version cannot build is reported by ``check()``.

swebench's reading of the printed log stays the reference; when the instance's tests are
pytest node ids, the grader's own pytest report (``agentrl.graders.pytest_report``) must
agree with it before a grade is solved.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.metadata
import json
import logging
import os
import pathlib
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.extras import install_hint
from agentrl.graders.base import (
    GRADE_DIR,
    Grader,
    grade_timeout,
    grading_timed_out,
    sandbox_source_problem,
)
from agentrl.graders.patching import GIT_ANY_OWNER, ensure_git_baseline, swebench_ladder
from agentrl.graders.protection import literal_pattern
from agentrl.graders.pytest_report import ReportChannel, verdict, verdict_details
from agentrl.graders.tasks import optional_str, parse_common, prompt_text
from agentrl.sandboxes.base import EXIT_TIME_BUDGET_EXCEEDED, Sandbox
from agentrl.types import Grade, Task

__all__ = ["SWEBenchGrader", "eval_report", "instance_image", "load_make_test_spec"]

logger = logging.getLogger(__name__)

START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
_TEST_EXIT_CODE = re.compile(r"^>>>>> Test Exit Code:\s*(-?\d+)\s*$", re.M)
#: Instance fields swebench 5.x reads from the instance instead of its own per-repo specs.
V5_FIELDS = ("eval_script", "log_parser", "eval_type")
#: Where ``make_test_spec`` lives: swebench 4.x, 3.x, then 5.x.
_SPEC_MODULES = (
    "swebench.harness.test_spec.test_spec",
    "swebench.harness.test_spec",
    "swebench.harness.utils",
)


class SWEBenchUnavailable(ImportError):
    """The swebench package is not installed or exposes no ``make_test_spec``."""


@functools.cache
def load_make_test_spec() -> tuple[Callable[..., Any], str]:
    """``(make_test_spec, module it came from)`` for the installed swebench."""
    errors = []
    for module_name in _SPEC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            errors.append(f"{module_name}: {exc}")
            continue
        function = getattr(module, "make_test_spec", None)
        if callable(function):
            return function, module_name
    raise SWEBenchUnavailable(
        "the swebench package is not installed or has no make_test_spec "
        f"({'; '.join(errors) or 'no module found'}); install it with: "
        f"{install_hint('swebench')}"
    )


def swebench_version() -> str:
    try:
        return importlib.metadata.version("swebench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def instance_image(instance: Mapping[str, Any]) -> str | None:
    """The ``sweb.eval.*`` image swebench's own spec names for ``instance`` (built locally
    by swebench's harness), or None when the installed swebench cannot name it.

    swebench 4.x: ``make_test_spec(instance).instance_image_key``; 5.x (whose test spec
    carries the instance's own ``image``): its ``ImageSpec`` without a registry namespace.
    """
    instance_id = instance.get("instance_id")
    if not isinstance(instance_id, str) or not instance_id:
        return None
    try:
        from swebench.image_builder.image_spec import ImageSpec  # swebench 5.x
    except ImportError:
        ImageSpec = None
    try:
        if ImageSpec is not None:
            return ImageSpec(instance_id=instance_id, dockerfile="-", namespace=None).name
        make_test_spec, _ = load_make_test_spec()
        key = make_test_spec(dict(instance)).instance_image_key
        return key if isinstance(key, str) and key else None
    except Exception as exc:  # a row swebench cannot build a spec for: check() says why
        logger.debug("no swebench instance image for %s: %s", instance_id, exc)
        return None


def _tests(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            return []
    if not isinstance(value, (list, tuple)):
        return []
    return [v for v in value if isinstance(v, str)]


def eval_report(test_spec: Any, instance_id: str, diff: str, log: str) -> dict[str, Any]:
    """swebench's ``get_eval_report`` for one captured eval log (it reads from a file)."""
    from swebench.harness.grading import get_eval_report

    with tempfile.TemporaryDirectory(prefix="agentrl-swebench-") as tmp:
        path = os.path.join(tmp, "test_output.txt")
        pathlib.Path(path).write_text(log)
        report = get_eval_report(
            test_spec=test_spec,
            prediction={
                "instance_id": instance_id,
                "model_patch": diff,
                "model_name_or_path": "agentrl",
            },
            test_log_path=path,
            include_tests_status=True,
        )
    return report.get(instance_id, {})


def _test_exit_code(log: str) -> int | None:
    """The test command's exit code that swebench 5's eval script echoes after the tests.

    The last one: the code under test can print lines like it, but only before its process
    ends, and the script's own line comes after.
    """
    found = _TEST_EXIT_CODE.findall(log)
    return int(found[-1]) if found else None


#: Test runners SWE-bench's eval commands run from the repository: Django's
#: ``tests/runtests.py``, SymPy's ``bin/test`` and the ``runtests.py`` behind it.
RUNNER_PATHS = ("bin/test", "runtests.py", "*/runtests.py")


@functools.lru_cache(maxsize=256)
def paths_in_test_patch(test_patch: str) -> tuple[str, ...]:
    """The paths ``test_patch`` touches, old and new names, as ``git apply`` reads them.

    ``git apply --numstat -z`` (and again with ``-R`` for the old names of renames) runs on
    this machine with no configuration, outside any repository.
    """
    if not test_patch.strip():
        return ()
    paths: dict[str, None] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-test-patch-") as tmp:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": tmp,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CEILING_DIRECTORIES": os.path.dirname(tmp),
        }
        for reverse in ((), ("-R",)):
            try:
                result = subprocess.run(
                    ["git", "apply", "--numstat", "-z", *reverse, "-"],
                    input=test_patch.encode(),
                    capture_output=True,
                    env=env,
                    cwd=tmp,
                    timeout=60,
                    check=False,
                )
            except FileNotFoundError:  # no git here: the dataset's own headers, read plainly
                return _header_paths(test_patch)
            if result.returncode != 0:
                raise ValueError(
                    "git cannot read the instance's test_patch: "
                    f"{result.stderr.decode(errors='replace')[-300:]}"
                )
            for record in result.stdout.split(b"\0"):
                fields = record.split(b"\t", 2)
                if len(fields) == 3 and fields[2]:
                    paths.setdefault(fields[2].decode("utf-8", errors="surrogateescape"), None)
    return tuple(paths)


def _header_paths(test_patch: str) -> tuple[str, ...]:
    """The ``a/``/``b/`` paths of a test patch's ``---``/``+++`` and rename lines."""
    paths: dict[str, None] = {}
    for line in test_patch.splitlines():
        for prefix in ("--- a/", "+++ b/", "rename from ", "rename to "):
            if line.startswith(prefix):
                paths.setdefault(line[len(prefix) :].split("\t", 1)[0], None)
    return tuple(paths)


def _counts(bucket: Mapping[str, Any] | None) -> dict[str, int]:
    bucket = bucket or {}
    passed, failed = len(bucket.get("success", [])), len(bucket.get("failure", []))
    return {"passed": passed, "total": passed + failed}


class SWEBenchGrader(Grader):
    """Grades SWE-bench instances with the installed swebench's spec, ladder and report."""

    name = "swebench"
    log_tail = 2000

    def __init__(
        self,
        *,
        timeout: float | None = None,
        user: str = "root",
        ladder: Sequence[str] | None = None,
    ) -> None:
        self.timeout = grade_timeout(timeout)
        self.user = user
        self.ladder = tuple(ladder) if ladder is not None else None

    # -- rows ------------------------------------------------------------------------------
    @classmethod
    def claims(cls, row: Mapping[str, Any]) -> bool:
        """A SWE-bench instance: ``remote_env_info`` with a ``test_patch`` or an ``eval_script``.

        A row that also names a scaleswe grading method (``swepro``, ``eval_cmd``,
        ``f2p_script``) is left to scaleswe.
        """
        metadata = row.get("metadata")
        remote = metadata.get("remote_env_info") if isinstance(metadata, Mapping) else None
        if not isinstance(metadata, Mapping) or not isinstance(remote, Mapping):
            return False
        other = (
            metadata.get("swepro")
            or metadata.get("eval_cmd")
            or remote.get("f2p_script")
            or metadata.get("f2p_script")
        )
        return bool((remote.get("test_patch") or remote.get("eval_script")) and not other)

    def parse_task(self, row: Mapping[str, Any]) -> Task:
        metadata, remote, extra = parse_common(row)
        if not remote:
            raise ValueError(
                "metadata.remote_env_info is missing: a swebench row carries its SWE-bench "
                "instance (instance_id, repo, version, test_patch, FAIL_TO_PASS, …) there"
            )
        instance = dict(remote)
        label = extra.get("label")
        instance_id = remote.get("instance_id") or metadata.get("instance_id") or label
        if not isinstance(instance_id, str) or not instance_id:
            raise ValueError("metadata.remote_env_info.instance_id is missing")
        problem = remote.get("problem_statement") or prompt_text(row.get("prompt"))
        instance.update(instance_id=instance_id, problem_statement=problem)
        for key in ("repo", "base_commit", "hints_text", "test_patch", "environment_setup_commit"):
            instance.setdefault(key, "")
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            instance.setdefault(key, [])
        if remote.get("patch") and "gold_patch" not in extra:
            extra["gold_patch"] = remote["patch"]
        image = optional_str(remote.get("image"), "metadata.remote_env_info.image") or optional_str(
            metadata.get("image"), "metadata.image"
        )
        local_image = instance_image(instance)
        if local_image and local_image != image:
            # The docker sandbox runs swebench's locally built instance image when present.
            extra.setdefault("docker_images", [local_image])
        workdir = (
            optional_str(remote.get("workdir"), "metadata.remote_env_info.workdir")
            or optional_str(metadata.get("workdir"), "metadata.workdir")
            or "/testbed"
        )
        return Task(
            instance_id=instance_id,
            problem_statement=problem if isinstance(problem, str) else "",
            image=image,
            workdir=workdir,
            repo=optional_str(metadata.get("repo"), "metadata.repo"),
            grader=self.name,
            grading={"instance": instance},
            metadata=extra,
        )

    def build_test_spec(self, task: Task) -> Any:
        """swebench's TestSpec for ``task`` (raises if the installed version cannot build it)."""
        make_test_spec, _ = load_make_test_spec()
        instance = dict(task.grading["instance"])
        instance["image"] = instance.get("image") or task.image or ""
        spec = make_test_spec(instance)
        _ = spec.eval_script  # 4.x raises here for an unknown repo or version
        return spec

    def check(self, task: Task) -> str | None:
        try:
            _, module_name = load_make_test_spec()
        except SWEBenchUnavailable as exc:
            return str(exc)
        instance = task.grading.get("instance") or {}
        version = swebench_version()
        if not _tests(instance.get("FAIL_TO_PASS")):
            return "the instance lists no FAIL_TO_PASS tests"
        if module_name == "swebench.harness.utils":
            missing = [key for key in V5_FIELDS if not instance.get(key)]
            if missing:
                return (
                    f"swebench {version} expects the instance to carry its own "
                    f"{', '.join(V5_FIELDS)}; missing: {', '.join(missing)}. A row of "
                    "SWE-bench as published (no eval script) gets them when imported with "
                    "`agentrl tasks import swebench` where swebench 4.x is installed "
                    "(pip install 'swebench>=4,<5'); or import the dataset as swebench 5.x "
                    "task repos publish it"
                )
            from swebench.harness.constants import EvalType
            from swebench.harness.log_parsers import PARSER_REGISTRY

            kinds = [kind.value for kind in EvalType]
            if instance["eval_type"] not in kinds:
                return f"eval_type {instance['eval_type']!r} is not one of {', '.join(kinds)}"

            if instance["log_parser"] not in PARSER_REGISTRY:
                return (
                    f"log_parser {instance['log_parser']!r} is not one swebench {version} "
                    f"knows; choose one of {', '.join(sorted(PARSER_REGISTRY)[:8])}, …"
                )
        else:
            for key in ("repo", "version", "base_commit", "test_patch"):
                if not instance.get(key):
                    return f"the instance has no {key}"
        try:
            spec = self.build_test_spec(task)
        except Exception as exc:
            return (
                f"swebench {version} cannot build a test spec for {task.instance_id}: "
                f"{type(exc).__name__}: {exc}"
            )
        if START_TEST_OUTPUT not in spec.eval_script or END_TEST_OUTPUT not in spec.eval_script:
            return (
                f"the eval script does not bracket its test output with {START_TEST_OUTPUT!r} "
                f"and {END_TEST_OUTPUT!r}, so no test result could be read"
            )
        return sandbox_source_problem(task, "metadata.remote_env_info.image")

    # -- grading ---------------------------------------------------------------------------
    def base_commit(self, task: Task) -> str | None:
        commit = (task.grading.get("instance") or {}).get("base_commit")
        return commit if isinstance(commit, str) and commit.strip() else None

    async def prepare(self, sandbox: Sandbox, task: Task) -> dict[str, Any]:
        created = await ensure_git_baseline(sandbox, task.workdir, user=self.user)
        return {"git_baseline_created": True} if created else {}

    async def patch_ladder(self) -> Sequence[str]:
        return self.ladder or await asyncio.to_thread(swebench_ladder)

    def protected_paths(self, task: Task) -> Sequence[str]:
        """Every path the instance's ``test_patch`` touches (read by git's own parser), and
        the test runners SWE-bench's eval commands run from the repository."""
        test_patch = (task.grading.get("instance") or {}).get("test_patch") or ""
        return (*(literal_pattern(p) for p in paths_in_test_patch(test_patch)), *RUNNER_PATHS)

    async def evaluate(
        self, sandbox: Sandbox, task: Task, diff: str, details: dict[str, Any]
    ) -> Grade:
        spec = await asyncio.to_thread(self.build_test_spec, task)
        script = f"{GRADE_DIR}/eval.sh"
        await sandbox.write_file(script, spec.eval_script, user=self.user)
        channel = ReportChannel.new(GRADE_DIR)
        await channel.install(sandbox, user=self.user)
        # The eval script (conda, git checkout of the test files, then the tests) inherits
        # the environment that loads the grader's pytest plugin.
        result = await channel.run(
            sandbox,
            f"{GIT_ANY_OWNER}; bash {script} 2>&1",
            time_budget=self.timeout,
            user=self.user,
            workdir=task.workdir,
        )
        log = result.stdout + result.stderr
        details["eval_exit_code"] = result.exit_code
        if result.exit_code == EXIT_TIME_BUDGET_EXCEEDED:
            details["log_tail"] = log[-self.log_tail :]
            return grading_timed_out(self.timeout, details)
        try:
            info = await asyncio.to_thread(eval_report, spec, task.instance_id, diff, log)
        except Exception as exc:
            details["log_tail"] = log[-self.log_tail :]
            return Grade(
                reward=0.0,
                solved=False,
                error=f"swebench could not grade the log: {type(exc).__name__}: {exc}",
                details=details,
            )
        grade = self._grade_from_report(task, info, log, details)
        if grade.error is not None:
            return grade
        return await self._cross_check(sandbox, task, channel, log, grade)

    async def _cross_check(
        self, sandbox: Sandbox, task: Task, channel: ReportChannel, log: str, grade: Grade
    ) -> Grade:
        """``grade`` (swebench's reading of the log) confirmed by the grader's own report.

        Checked when the instance's tests are pytest node ids or a report exists: every
        FAIL_TO_PASS and PASS_TO_PASS test passed in it (XFAIL too, as swebench counts
        it), and a test command that exited 0 left no failed test in it.
        """
        instance = task.grading["instance"]
        required = list(
            dict.fromkeys(
                _tests(instance.get("FAIL_TO_PASS")) + _tests(instance.get("PASS_TO_PASS"))
            )
        )
        details = dict(grade.details)
        reasons = [] if grade.solved else ["swebench's report: not resolved"]
        report = await channel.read(sandbox, user=self.user)
        if report.found or any("::" in test for test in required):
            # Only an exit 0 is checked against the report: swebench ignores the exit code,
            # so a non-zero one with every test passed (a coverage threshold) gains nothing.
            exit_code = 0 if _test_exit_code(log) == 0 else None
            reasons += verdict(report, required, exit_code, passing=("passed", "xfailed"))[1]
            decided_by = "swebench log + grader report"
        else:
            decided_by = "swebench log"
        details["verdict"] = verdict_details(decided_by, report, reasons)
        return Grade(reward=0.0 if reasons else 1.0, solved=not reasons, details=details)

    def _grade_from_report(
        self, task: Task, info: Mapping[str, Any], log: str, details: dict[str, Any]
    ) -> Grade:
        status = info.get("tests_status") or {}
        f2p = _counts(status.get("FAIL_TO_PASS"))
        p2p = _counts(status.get("PASS_TO_PASS"))
        resolved = bool(info.get("resolved"))
        details.update(
            resolved=resolved,
            tests_found=bool(info.get("patch_successfully_applied")),
            fail_to_pass=f2p,
            pass_to_pass=p2p,
        )
        if not resolved and not (f2p["total"] or p2p["total"]):
            details["log_tail"] = log[-self.log_tail :]
        if info.get("infra_failure"):
            return Grade(
                reward=0.0,
                solved=False,
                error=(
                    "swebench found an environment failure in the eval log "
                    f"({info.get('infra_failure_reason', 'unknown')}); the image is broken"
                ),
                details=details,
            )
        logger.info(
            "%s: resolved=%s F2P=%d/%d P2P=%d/%d",
            task.instance_id,
            resolved,
            f2p["passed"],
            f2p["total"],
            p2p["passed"],
            p2p["total"],
        )
        return Grade(reward=1.0 if resolved else 0.0, solved=resolved, details=details)

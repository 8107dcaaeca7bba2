"""The grader's own pytest report: a verdict channel the code under test can't trivially forge.

Printed ``PASSED x`` lines and a runner's exit code are the code under test's to write: an
``atexit`` can print them, ``os._exit(0)`` can end a failing run with 0, a hook can rewrite
every report. For pytest-based grades the grader therefore loads its own plugin
(``_pytest_report_plugin.py``, shipped with this package) first in every pytest run: a
:class:`ReportChannel` uploads it under a random module name into a fresh directory outside
the repository, the test command's environment loads it (:func:`plugin_env`), and each
pytest session writes a JSON report there with the grade's nonce. :meth:`ReportChannel.read`
reads them back (a missing, unreadable or unfinished report is a fact, never an exception)
and :func:`verdict` cross-checks them against the expected tests and the exit code.

A verdict that fails is the policy's doing: reward 0 with the reasons, never a grader error.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import secrets
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from agentrl.sandboxes.base import Sandbox, SandboxError, SandboxGoneError
from agentrl.sandboxes.exec import exec_and_wait
from agentrl.types import ExecResult

__all__ = [
    "DIR_VAR",
    "NONCE_VAR",
    "PytestReport",
    "ReportChannel",
    "SessionReport",
    "parse_reports",
    "plugin_env",
    "plugin_source",
    "verdict",
    "verdict_details",
]

#: The plugin's settings (the plugin pops both from ``os.environ`` at import).
DIR_VAR = "AGENTRL_PYTEST_REPORT_DIR"
NONCE_VAR = "AGENTRL_PYTEST_REPORT_NONCE"
#: The plugin's module name and directory, read by the command prefix only.
_MODULE_VAR = "AGENTRL_PYTEST_PLUGIN"
_PATH_VAR = "AGENTRL_PYTEST_PLUGIN_PATH"
_SESSION_FILE = re.compile(r"^session-(\d+)-(\d+)\.json$")
_PROCESS_FILE = re.compile(r"^process-(\d+)\.json$")
#: More sessions than this in one grade is not a test run the grader reads.
MAX_SESSIONS = 64
#: A report file larger than this is not read (and so is a problem).
MAX_REPORT_BYTES = 64 << 20
#: Outcomes that count as a failure when a session's exit status or the exit code says none.
FAILED = frozenset({"failed", "error", "forged"})
_MAX_REASONS = 10
_MAX_IDS = 5


def plugin_source() -> str:
    """The plugin's source, as shipped in this package."""
    return (
        importlib.resources.files("agentrl.graders")
        .joinpath("_pytest_report_plugin.py")
        .read_text(encoding="utf-8")
    )


def plugin_env(directory: str, module: str, nonce: str) -> dict[str, str]:
    """The environment a test command needs for the plugin in ``directory`` (see
    :meth:`ReportChannel.command` for how it reaches pytest)."""
    return {
        _PATH_VAR: directory,
        _MODULE_VAR: module,
        DIR_VAR: f"{directory}/reports",
        NONCE_VAR: nonce,
    }


@attrs.frozen(kw_only=True)
class SessionReport:
    """One pytest session's report, as the plugin wrote it."""

    name: str
    finalized: bool
    session_ran: bool
    exitstatus: int | None = None
    collected: tuple[str, ...] = ()
    tests: Mapping[str, str] = attrs.field(factory=dict)
    aliases: Mapping[str, str] = attrs.field(factory=dict)
    collection_errors: tuple[str, ...] = ()
    forged: tuple[Mapping[str, Any], ...] = ()
    late_plugins: tuple[Mapping[str, Any], ...] = ()
    tampered: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> SessionReport:
        """Read the plugin's JSON; raises ``ValueError`` (or ``TypeError``) on a bad shape."""
        tests = data.get("tests") or {}
        if not isinstance(tests, Mapping) or not all(isinstance(v, str) for v in tests.values()):
            raise ValueError("tests is not a mapping of test id to outcome")
        status = data.get("session_exitstatus")
        if status is None:
            status = data.get("exitstatus")
        return cls(
            name=name,
            finalized=data.get("finalized") is True,
            session_ran=data.get("session_ran") is True,
            exitstatus=int(status) if status is not None else None,
            collected=tuple(str(t) for t in data.get("collected") or ()),
            tests=dict(tests),
            aliases={str(k): str(v) for k, v in (data.get("aliases") or {}).items()},
            collection_errors=tuple(str(t) for t in data.get("collection_errors") or ()),
            forged=tuple(data.get("forged") or ()),
            late_plugins=tuple(data.get("late_plugins") or ()),
            tampered=tuple(str(t) for t in data.get("tampered") or ()),
        )

    def failures(self) -> list[str]:
        return [test for test, outcome in self.tests.items() if outcome in FAILED]


@attrs.frozen(kw_only=True)
class PytestReport:
    """Every session report one test run left, and what was wrong with the rest."""

    sessions: tuple[SessionReport, ...] = ()
    #: pytest processes that loaded the plugin: pid -> how far they got (``imported``:
    #: loading plugins and conftests; ``cmdline``: pytest handled the command line).
    processes: Mapping[int, str] = attrs.field(factory=dict)
    #: Report files that could not be trusted or read (foreign nonce, bad JSON, …).
    problems: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        """Whether pytest ran under the plugin at all (or something wrote where it writes)."""
        return bool(self.sessions or self.processes or self.problems)

    def summary(self) -> dict[str, Any] | str:
        """A compact account for ``Grade.details``: counts, never lists of tests."""
        if not self.found:
            return "none"
        outcomes: dict[str, int] = {}
        for session in self.sessions:
            for outcome in session.tests.values():
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return {
            "processes": len(self.processes),
            "sessions": len(self.sessions),
            "finalized": sum(s.finalized for s in self.sessions),
            "exit_statuses": [s.exitstatus for s in self.sessions if s.finalized],
            "outcomes": dict(sorted(outcomes.items())),
        }


@attrs.frozen(kw_only=True)
class ReportChannel:
    """One grade's plugin directory, module name and nonce (all random)."""

    directory: str
    module: str
    nonce: str

    @classmethod
    def new(cls, root: str) -> ReportChannel:
        """Fresh random names under ``root`` (the grade directory, outside the repository)."""
        return cls(
            directory=f"{root}/{secrets.token_hex(12)}",
            module=f"_agentrl_report_{secrets.token_hex(6)}",
            nonce=secrets.token_hex(16),
        )

    @property
    def reports(self) -> str:
        return f"{self.directory}/reports"

    async def install(self, sandbox: Sandbox, *, user: str) -> None:
        """Create the directory (owner-only) and upload the plugin into it."""
        q = shlex.quote
        await sandbox.exec(
            f"mkdir -p {q(self.directory.rsplit('/', 1)[0])} && "
            f"mkdir -m 700 {q(self.directory)} {q(self.reports)}",
            user=user,
            workdir="/",
            timeout=60,
            check=True,
        )
        await sandbox.write_file(f"{self.directory}/{self.module}.py", plugin_source(), user=user)

    def env(self) -> dict[str, str]:
        return plugin_env(self.directory, self.module, self.nonce)

    def command(self, command: str) -> str:
        """``command`` with the plugin loaded first by every pytest it starts.

        ``-p MODULE`` leads ``PYTEST_ADDOPTS`` (pytest loads ``-p`` plugins before entry
        points and conftests), ``PYTEST_PLUGINS`` names it too, its directory leads
        ``PYTHONPATH``; values already set in the image are kept after them.
        """
        m, p = _MODULE_VAR, _PATH_VAR
        return (
            f'export PYTHONPATH="${p}${{PYTHONPATH:+:$PYTHONPATH}}" '
            f'PYTEST_PLUGINS="${m}${{PYTEST_PLUGINS:+,$PYTEST_PLUGINS}}" '
            f'PYTEST_ADDOPTS="-p ${m}${{PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}}"; '
            f"unset {m} {p}\n{command}"
        )

    async def run(
        self,
        sandbox: Sandbox,
        command: str,
        *,
        time_budget: float,
        user: str,
        workdir: str,
    ) -> ExecResult:
        """``exec_and_wait`` of ``command`` with the plugin loaded (see :meth:`command`)."""
        return await exec_and_wait(
            sandbox,
            self.command(command),
            time_budget=time_budget,
            user=user,
            env=self.env(),
            workdir=workdir,
        )

    async def read(self, sandbox: Sandbox, *, user: str) -> PytestReport:
        """Every report in the directory; what cannot be read or trusted is a problem."""
        listing_script = (
            f"cd {shlex.quote(self.reports)} || exit 3\n"
            'for f in *; do [ -f "$f" ] && printf \'%s %s\\n\' "$(wc -c < "$f")" "$f"; done; '
            "exit 0"
        )
        try:
            listing = await sandbox.exec(listing_script, user=user, workdir="/", timeout=60)
        except SandboxGoneError:
            raise
        except (SandboxError, OSError, TimeoutError) as exc:
            return PytestReport(problems=(f"the report directory could not be listed: {exc}",))
        if listing.exit_code != 0:
            return PytestReport(
                problems=("the grader's report directory is gone (removed during the run?)",)
            )
        files: dict[str, str | None] = {}
        for line in listing.stdout.splitlines()[: MAX_SESSIONS * 2 + 2]:
            size, _, name = line.strip().partition(" ")
            files[name] = None
            wanted = _SESSION_FILE.match(name) or _PROCESS_FILE.match(name)
            if wanted and size.isdigit() and int(size) <= MAX_REPORT_BYTES:
                files[name] = await self._read_text(sandbox, name, user)
        return parse_reports(files, self.nonce)

    async def _read_text(self, sandbox: Sandbox, name: str, user: str) -> str | None:
        try:
            return str(await sandbox.read_file(f"{self.reports}/{name}", user=user))
        except SandboxGoneError:
            raise
        except (FileNotFoundError, SandboxError, OSError, TimeoutError):
            return None


def parse_reports(files: Mapping[str, str | None], nonce: str) -> PytestReport:
    """The report of a run from its directory's files (name -> text, None: unreadable)."""
    sessions, processes, problems = [], {}, []
    for name, text in files.items():
        if name.endswith(".json.tmp"):
            continue  # a write cut short: the file's first copy tells the rest
        process = _PROCESS_FILE.match(name)
        if process:
            data = _json_object(text)
            if data is None or data.get("nonce") != nonce:
                problems.append(f"report {name} is unreadable or not this grade's")
            else:
                processes[int(process.group(1))] = str(data.get("stage"))
        elif not _SESSION_FILE.match(name):
            problems.append(f"unexpected file {name[:80]!r} in the report directory")
        elif len(sessions) >= MAX_SESSIONS:
            problems.append(f"more than {MAX_SESSIONS} pytest sessions in one run")
            break
        elif text is None:
            problems.append(f"report {name} is unreadable")
        else:
            try:
                data = json.loads(text)
                if not isinstance(data, Mapping):
                    raise ValueError("not a JSON object")
                if data.get("nonce") != nonce:
                    problems.append(f"report {name} does not carry this grade's nonce")
                    continue
                sessions.append(SessionReport.from_json(name, data))
            except (ValueError, TypeError, AttributeError) as exc:
                problems.append(f"report {name} is unreadable ({type(exc).__name__})")
    sessions.sort(key=lambda s: tuple(int(g) for g in _SESSION_FILE.match(s.name).groups()))
    return PytestReport(sessions=tuple(sessions), processes=processes, problems=tuple(problems))


def _json_object(text: str | None) -> Mapping[str, Any] | None:
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, Mapping) else None


def _index(session: SessionReport) -> dict[str, list[str]]:
    index: dict[str, list[str]] = {}
    for nodeid in session.tests:
        index.setdefault(nodeid, []).append(nodeid)
        alias = session.aliases.get(nodeid)
        if alias:
            index.setdefault(alias, []).append(nodeid)
    return index


def _outcomes(sessions: Sequence[SessionReport], test_id: str) -> list[str]:
    """The outcomes of ``test_id`` in every session that ran it.

    A test is found by its node id or its id relative to pytest's working directory (what
    ``-rA`` prints); an id with more ``[`` than ``]`` is a parametrised id a log parser cut
    at a space, and stands for every id it begins (as swebench's grading reads them).
    """
    found = []
    for session in sessions:
        index = _index(session)
        nodeids = index.get(test_id)
        if nodeids is None and test_id.count("[") > test_id.count("]"):
            nodeids = sorted(
                {n for key, ns in index.items() if key.startswith(test_id) for n in ns}
            )
        found += [session.tests[n] for n in nodeids or ()]
    return found


def _ids(ids: Iterable[str]) -> str:
    ids = list(ids)
    more = f" and {len(ids) - _MAX_IDS} more" if len(ids) > _MAX_IDS else ""
    return ", ".join(ids[:_MAX_IDS]) + more


def _session_reasons(session: SessionReport) -> list[str]:
    name = session.name
    if not session.finalized:
        return [
            f"pytest session {name} never finished: the run was cut short "
            "(os._exit, a crash or a kill) before pytest's session end"
        ]
    reasons = []
    failures = session.failures()
    if session.exitstatus == 0 and (failures or session.collection_errors):
        reasons.append(
            f"pytest session {name} exited 0 but recorded failures: "
            f"{_ids(failures + list(session.collection_errors))}"
        )
    if session.exitstatus == 1 and not failures and not session.collection_errors:
        reasons.append(f"pytest session {name} exited 1 (tests failed) but recorded no failure")
    if session.forged:
        tests = [f"{f.get('test')} ({f.get('phase')})" for f in session.forged]
        reasons.append(f"reports rewritten to a pass after pytest made them: {_ids(tests)}")
    for plugin in session.late_plugins:
        reasons.append(
            f"pytest hooks added during the run by {plugin.get('file')!s:.200} "
            f"({', '.join(map(str, plugin.get('hooks') or ()))})"
        )
    if session.tampered:
        reasons.append(f"pytest internals replaced during the run: {_ids(session.tampered)}")
    return reasons


def verdict(
    report: PytestReport,
    expected_ids: Sequence[str] | None,
    exit_code: int | None = None,
    *,
    passing: Iterable[str] = ("passed",),
) -> tuple[bool, list[str]]:
    """Whether the grader's report confirms a solve, and every reason it does not.

    ``expected_ids``: the tests that must have been collected, run and passed (their
    outcome one of ``passing``) in every session that ran them; ``None``: every test the
    sessions ran, and at least one; empty: none in particular. Always required: at least
    one session, every session finished at pytest's session end, its exit status agreeing
    with its failures, no report rewritten after pytest made it, no hooks added and no
    pytest internals replaced during the run. ``exit_code`` (the command's, when it is
    pytest's to give): 0 with a failed test, or non-zero with every test passed, is
    inconsistent.
    """
    passing = frozenset(passing)
    reasons = list(report.problems)
    if not report.sessions:
        reasons.append(
            "no grader report: no pytest session ran under the grader's plugin (a test "
            "command that runs pytest through tox or a clean environment must pass on "
            "PYTHONPATH, PYTEST_PLUGINS, PYTEST_ADDOPTS and AGENTRL_PYTEST_REPORT_*)"
        )
    for pid, stage in sorted(report.processes.items()):
        if stage == "imported":
            reasons.append(
                f"pytest process {pid} ended while loading its plugins and conftests, "
                "before it handled its command line (an exit at import, or a usage error)"
            )
    for session in report.sessions:
        reasons += _session_reasons(session)
    done = [s for s in report.sessions if s.finalized and s.session_ran]
    outcomes = [o for s in done for o in s.tests.values()]
    if expected_ids is None:
        if report.sessions and not outcomes:
            reasons.append("the grader's report lists no test that ran")
        bad = [t for s in done for t, o in s.tests.items() if o not in passing]
        if bad:
            reasons.append(f"tests that did not pass: {_ids(bad)}")
    elif report.sessions:
        missing, failed = [], []
        for test_id in expected_ids:
            found = _outcomes(done, test_id)
            if not found:
                missing.append(test_id)
            elif any(o not in passing for o in found):
                failed.append(f"{test_id} ({'/'.join(sorted(set(found)))})")
        if missing:
            reasons.append(f"expected tests not collected or not run: {_ids(missing)}")
        if failed:
            reasons.append(f"expected tests that did not pass: {_ids(failed)}")
    if exit_code is not None and done:
        failures = [t for s in done for t in s.failures()]
        if exit_code == 0 and failures:
            reasons.append(f"exit code 0 but the report has failed tests: {_ids(failures)}")
        if exit_code != 0 and outcomes and all(o in passing for o in outcomes):
            reasons.append(f"exit code {exit_code} but every test in the report passed")
    return not reasons, reasons


def verdict_details(channel: str, report: PytestReport, reasons: Sequence[str]) -> dict[str, Any]:
    """``Grade.details["verdict"]``: what decided, the report in counts, the reasons (capped)."""
    kept = [r[:300] for r in reasons[:_MAX_REASONS]]
    if len(reasons) > _MAX_REASONS:
        kept.append(f"… and {len(reasons) - _MAX_REASONS} more")
    return {"channel": channel, "report": report.summary(), "reasons": kept}

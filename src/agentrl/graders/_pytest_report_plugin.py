"""agentrl's grading report: what pytest collected and ran, for the grader to read back.

The grader uploads this file under a random module name into a fresh directory of its own,
outside the repository, and loads it first in every pytest run of a grade (``-p NAME`` in
``PYTEST_ADDOPTS``, ``PYTEST_PLUGINS`` as a backstop). At import it takes its settings out
of the environment (and its own traces out of ``PYTEST_ADDOPTS``, ``PYTEST_PLUGINS``,
``PYTHONPATH`` and ``sys.path``), so the code under test does not find them there and
pytest processes that tests start are not recorded. A session started inside another one
(pytester's inline runs) is not recorded either.

Each pytest process writes ``process-PID.json`` when it imports the plugin (``stage:
imported``) and again when pytest handles its command line (``cmdline``). Each session
writes one JSON report, ``session-PID-SEQ.json``: a first copy when it is configured
(``finalized: false``), the final one at ``pytest_sessionfinish``, each written
atomically. A process or session cut short (``os._exit``, a crash, a kill) leaves its
first copy.

A test's outcome is read twice: innermost, around pytest's own report (with the raised
exception), and as pytest logged it. A logged pass that the inner reading does not
confirm is listed under ``forged``; plugins that appear during the session from anywhere
but pytest, pluggy or a conftest.py that predates the run under ``late_plugins``; pytest
internals replaced under ``tampered``. The grader decides what they mean.

Runs on every Python and pytest a task image may have (Python 3.6+, pytest 4+): no newer
syntax, only hooks pytest 4 has.
"""

import json
import os
import sys
import time

import pytest

DIR_VAR = "AGENTRL_PYTEST_REPORT_DIR"
NONCE_VAR = "AGENTRL_PYTEST_REPORT_NONCE"
FORMAT = 1
#: The most entries kept in each of the report's finding lists.
_MAX_FINDINGS = 50

_DIR = os.environ.pop(DIR_VAR, None)
_NONCE = os.environ.pop(NONCE_VAR, None)
_IMPORTED_AT = time.time()
_HERE = os.path.dirname(os.path.abspath(__file__))
_SEQ = [0]
_RECORDING = {}  # id(config) -> _Session, for the configs this process records


def _unshare():
    """Remove this plugin's traces from the environment its tests (and their children) see."""
    name = __name__
    addopts = os.environ.get("PYTEST_ADDOPTS")
    if addopts is not None and addopts.split(" ")[:2] == ["-p", name]:
        rest = " ".join(addopts.split(" ")[2:])
        if rest:
            os.environ["PYTEST_ADDOPTS"] = rest
        else:
            del os.environ["PYTEST_ADDOPTS"]
    for var, sep, entry in (
        ("PYTEST_PLUGINS", ",", name),
        ("PYTHONPATH", os.pathsep, _HERE),
    ):
        value = os.environ.get(var)
        if value is None:
            continue
        kept = [part for part in value.split(sep) if part != entry]
        if kept:
            os.environ[var] = sep.join(kept)
        else:
            del os.environ[var]
    sys.path[:] = [part for part in sys.path if os.path.abspath(part or ".") != _HERE]


_unshare()


def _roots():
    """The directories whose code may implement hooks at any time: pytest's and pluggy's."""
    roots = []
    for module_name in ("_pytest", "pluggy"):
        module = sys.modules.get(module_name)
        path = getattr(module, "__file__", None)
        if path:
            roots.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(roots)


#: pytest and pluggy functions a run's outcome passes through (absent ones are skipped).
_WATCHED = (
    ("_pytest.runner", "call_and_report"),
    ("_pytest.runner", "call_runtest_hook"),
    ("_pytest.runner", "runtestprotocol"),
    ("_pytest.runner", "pytest_runtest_protocol"),
    ("_pytest.runner", "pytest_runtest_makereport"),
    ("_pytest.runner", "CallInfo.from_call"),
    ("_pytest.reports", "TestReport.from_item_and_call"),
    ("_pytest.reports", "TestReport.__init__"),
    ("_pytest.reports", "BaseReport.passed"),
    ("_pytest.reports", "BaseReport.failed"),
    ("_pytest.python", "pytest_pyfunc_call"),
    ("_pytest.python", "Function.runtest"),
    ("_pytest.unittest", "TestCaseFunction.runtest"),
    ("_pytest.skipping", "pytest_runtest_makereport"),
    ("_pytest.main", "pytest_runtestloop"),
    ("_pytest.main", "wrap_session"),
    ("_pytest.terminal", "TerminalReporter.pytest_runtest_logreport"),
    ("pluggy._callers", "_multicall"),
    ("pluggy.callers", "_multicall"),
    ("pluggy._hooks", "HookCaller.__call__"),
    ("pluggy.hooks", "_HookCaller.__call__"),
)


def _resolve(module_name, dotted):
    """The function at ``module_name.dotted`` (class attributes unwrapped), or None."""
    target = sys.modules.get(module_name)
    for part in dotted.split("."):
        if target is None:
            return None
        if isinstance(target, type):
            target = target.__dict__.get(part)
            target = getattr(target, "__func__", None) or getattr(target, "fget", None) or target
        else:
            target = getattr(target, part, None)
    return target


def _internals():
    found = {}
    for module_name, dotted in _WATCHED:
        function = _resolve(module_name, dotted)
        if function is not None:
            found[module_name + "." + dotted] = (function, getattr(function, "__code__", None))
    return found


_PRISTINE = _internals()


def _code_file(function):
    code = getattr(function, "__code__", None)
    return os.path.abspath(code.co_filename) if code is not None else "?"


def _outcome(report):
    """One phase's outcome: passed, failed, skipped, xfailed, xpassed (or the raw word)."""
    outcome = getattr(report, "outcome", None)
    xfail = hasattr(report, "wasxfail")
    if outcome == "passed":
        return "xpassed" if xfail else "passed"
    if outcome == "skipped":
        return "xfailed" if xfail else "skipped"
    return str(outcome)


def _merge(phases, when, outcome):
    # A logged failure sticks (sub-tests log under their test's id); a rerun is not one.
    if outcome == "rerun" or phases.get(when) == "failed":
        return
    phases[when] = outcome


def _test_outcome(phases):
    """A test passes only if setup and call passed and teardown did not fail."""
    setup, call, teardown = phases.get("setup"), phases.get("call"), phases.get("teardown")
    if setup == "failed" or teardown == "failed":
        return "error"
    if setup in ("skipped", "xfailed"):
        return setup
    if setup is None or call is None or teardown is None:
        return "incomplete"
    return call


def _write(path, data):
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass  # no report is what the grader reads then


class _Session:
    """The record of one pytest session (registered as a plugin of its config)."""

    def __init__(self, config, seq):
        self.config = config
        self.path = os.path.join(_DIR, f"session-{os.getpid()}-{seq}.json")
        self.head = {
            "format": FORMAT,
            "nonce": _NONCE,
            "pid": os.getpid(),
            "seq": seq,
            "pytest": getattr(pytest, "__version__", "?"),
            "python": ".".join(str(part) for part in sys.version_info[:3]),
            "argv": [str(arg) for arg in sys.argv[:20]],
        }
        self.running = False
        self.session_ran = False
        self.collected = []
        self.collection_errors = []
        self.inner = {}
        self.logged = {}
        self.raised = {}
        self.late = []
        self.baseline = set()
        self.roots = _roots()
        self.manager_state = self._manager_state()

    def _manager_state(self):
        manager = self.config.pluginmanager
        return (manager.__dict__.get("_inner_hookexec"), manager.__dict__.get("hook"))

    def write(self, final, exitstatus=None, session=None):
        data = dict(self.head, finalized=final, session_ran=self.session_ran)
        if final:
            data.update(self._results(exitstatus, session))
        _write(self.path, data)

    def _results(self, exitstatus, session):
        tests = {}
        for nodeid in self.collected:
            phases = self.logged.get(nodeid) or self.inner.get(nodeid)
            tests[nodeid] = _test_outcome(phases) if phases else "not run"
        for nodeid, phases in self.logged.items():
            tests.setdefault(nodeid, _test_outcome(phases))
        forged = self._forged()
        for finding in forged:
            tests[finding["test"]] = "forged"
        aliases = {}
        relative = getattr(self.config, "cwd_relative_nodeid", None)
        for nodeid in tests:
            alias = relative(nodeid) if relative is not None else nodeid
            if alias != nodeid:
                aliases[nodeid] = alias
        return {
            "exitstatus": _int(exitstatus),
            "session_exitstatus": _int(getattr(session, "exitstatus", None)),
            "testsfailed": _int(getattr(session, "testsfailed", None)),
            "rootdir": str(getattr(self.config, "rootdir", "")),
            "invocation_dir": str(getattr(self.config, "invocation_dir", "")),
            "collected": self.collected,
            "collection_errors": self.collection_errors[:_MAX_FINDINGS],
            "tests": tests,
            "aliases": aliases,
            "forged": forged[:_MAX_FINDINGS],
            "late_plugins": self._late_plugins()[:_MAX_FINDINGS],
            "tampered": self._tampered(),
        }

    # -- findings --------------------------------------------------------------------------
    def _forged(self):
        found = []
        if not self.inner:
            return found  # nothing ran here (an xdist controller): only the logged reports
        for nodeid, phases in self.logged.items():
            inner = self.inner.get(nodeid, {})
            for when, outcome in sorted(phases.items()):
                if outcome not in ("passed", "xpassed"):
                    continue
                if inner.get(when) not in ("passed", "xpassed") or self.raised.get((nodeid, when)):
                    found.append(
                        {
                            "test": nodeid,
                            "phase": when,
                            "logged": outcome,
                            "inner": inner.get(when),
                            "raised": bool(self.raised.get((nodeid, when))),
                        }
                    )
        return found

    def _legitimate(self, function):
        path = _code_file(function)
        if path.startswith(self.roots) or path.startswith(_HERE + os.sep):
            return True
        if os.path.basename(path) != "conftest.py":
            return False
        try:
            return os.stat(path).st_mtime <= _IMPORTED_AT
        except OSError:
            return False

    def _hook_impls(self):
        manager = self.config.pluginmanager
        for name, caller in sorted(vars(manager.hook).items()):
            get = getattr(caller, "get_hookimpls", None)
            if get is None:
                continue
            for impl in get():
                yield name, impl

    def _unseen_hooks(self):
        """Hook implementations present now that were not there when the session began."""
        found = {}
        for name, impl in self._hook_impls():
            key = (name, id(impl.function))
            if key in self.baseline or self._legitimate(impl.function):
                continue
            where = _code_file(impl.function)
            entry = found.setdefault(where, {"plugin": str(impl.plugin_name), "file": where})
            entry.setdefault("hooks", []).append(name)
        return list(found.values())

    def _late_plugins(self):
        seen = {entry["file"] for entry in self.late}
        return self.late + [e for e in self._unseen_hooks() if e["file"] not in seen]

    def _tampered(self):
        changed = []
        now = _internals()
        for key, (function, code) in sorted(_PRISTINE.items()):
            current = now.get(key)
            if current is None or current[0] is not function or current[1] is not code:
                changed.append(key)
            elif code is not None and not _code_file(function).startswith(self.roots):
                changed.append(key)
        if self._manager_state() != self.manager_state:
            changed.append("pluginmanager hook execution")
        return changed

    # -- hooks -----------------------------------------------------------------------------
    def pytest_sessionstart(self, session):
        self.session_ran = True
        self.baseline = {(name, id(impl.function)) for name, impl in self._hook_impls()}
        self.running = True

    def pytest_plugin_registered(self, plugin, manager):
        if not self.running or manager is not self.config.pluginmanager:
            return
        callers = getattr(manager, "get_hookcallers", lambda _plugin: None)(plugin) or []
        hooks = []
        for caller in callers:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and not self._legitimate(impl.function):
                    hooks.append(caller.name)
                    where = _code_file(impl.function)
        if hooks and len(self.late) < _MAX_FINDINGS:
            name = manager.get_name(plugin) if hasattr(manager, "get_name") else None
            self.late.append({"plugin": str(name), "file": where, "hooks": sorted(hooks)})

    def pytest_collectreport(self, report):
        if report.failed:
            self.collection_errors.append(report.nodeid or "<session>")

    def pytest_collection_finish(self, session):
        self.collected = [item.nodeid for item in session.items]

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_makereport(self, item, call):
        result = yield
        try:
            report = result.get_result()
        except BaseException:
            return
        when = getattr(call, "when", None) or getattr(report, "when", "?")
        # The last attempt counts here (a rerun plugin logs the earlier ones as "rerun").
        self.inner.setdefault(item.nodeid, {})[when] = _outcome(report)
        excinfo = getattr(call, "excinfo", None)
        skip = getattr(getattr(pytest, "skip", None), "Exception", ())
        raised = excinfo is not None and not isinstance(excinfo.value, skip)
        self.raised[(item.nodeid, when)] = raised

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        _merge(self.logged.setdefault(report.nodeid, {}), report.when, _outcome(report))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self.running = False
        self.write(True, exitstatus, session)


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _mark_process(stage):
    """``process-PID.json``: how far this pytest process got (a session writes the rest)."""
    if _DIR:
        path = os.path.join(_DIR, f"process-{os.getpid()}.json")
        _write(path, {"format": FORMAT, "nonce": _NONCE, "pid": os.getpid(), "stage": stage})


# Plugins and conftests load (and may import the code under test) before the command line
# is handled; a process that never gets there was ended during that.
_mark_process("imported")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    _mark_process("cmdline")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not _DIR or _RECORDING or getattr(config, "workerinput", None) is not None:
        return  # not a grading run, a session inside another, or an xdist worker
    _SEQ[0] += 1
    session = _Session(config, _SEQ[0])
    _RECORDING[id(config)] = session
    config.pluginmanager.register(session, "agentrl-grading-report")
    session.write(False)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    session = _RECORDING.pop(id(config), None)
    if session is not None and not session.session_ran:
        session.write(True)  # configured without a session (--markers): nothing ran

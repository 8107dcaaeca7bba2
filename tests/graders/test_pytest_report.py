"""The grader's pytest plugin run by this machine's pytest on tmp repos, and the verdict."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from agentrl.graders import _pytest_report_plugin as plugin_module
from agentrl.graders.pytest_report import (
    DIR_VAR,
    NONCE_VAR,
    PytestReport,
    ReportChannel,
    SessionReport,
    parse_reports,
    plugin_source,
    verdict,
)

OUTCOMES = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup breaks")

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown breaks")

def test_passes():
    pass

def test_fails():
    assert 1 == 2

def test_setup_error(broken):
    pass

def test_teardown_error(bad_teardown):
    pass

def test_skipped():
    pytest.skip("no")

@pytest.mark.xfail
def test_xfail():
    assert 0

@pytest.mark.xfail
def test_xpass():
    pass

@pytest.mark.parametrize("word", ["a b", "c"])
def test_param(word):
    pass
"""


def run_pytest(
    tmp_path: pathlib.Path,
    files: dict[str, str],
    command: str,
    *,
    autoload: bool = False,
    image_env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], ReportChannel]:
    """Run ``command`` in a repo of ``files`` with the plugin loaded the way graders do."""
    repo = tmp_path / "repo"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(textwrap.dedent(text))
    channel = ReportChannel.new(str(tmp_path / "grade"))
    pathlib.Path(channel.reports).mkdir(parents=True)
    (pathlib.Path(channel.directory) / f"{channel.module}.py").write_text(plugin_source())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTRL_"))}
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env['PATH']}"
    env["PEEK_DIR"] = channel.reports
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.update(image_env or {})
    env.update(channel.env())
    result = subprocess.run(
        ["bash", "-c", channel.command(command)],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, channel


def read(channel: ReportChannel) -> PytestReport:
    reports = pathlib.Path(channel.reports)
    return parse_reports({p.name: p.read_text() for p in sorted(reports.iterdir())}, channel.nonce)


PYTEST = "python -m pytest -q -p no:cacheprovider"


def test_every_outcome_is_recorded(tmp_path):
    """Passed, failed, setup and teardown errors, skip, xfail, xpass and parametrised tests:
    each is recorded with its outcome, and only the plain pass counts as passed."""
    result, channel = run_pytest(tmp_path, {"test_o.py": OUTCOMES}, PYTEST, autoload=True)
    assert result.returncode == 1, result.stdout
    (session,) = read(channel).sessions
    assert session.finalized and session.session_ran and session.exitstatus == 1
    assert session.tests == {
        "test_o.py::test_passes": "passed",
        "test_o.py::test_fails": "failed",
        "test_o.py::test_setup_error": "error",
        "test_o.py::test_teardown_error": "error",
        "test_o.py::test_skipped": "skipped",
        "test_o.py::test_xfail": "xfailed",
        "test_o.py::test_xpass": "xpassed",
        "test_o.py::test_param[a b]": "passed",
        "test_o.py::test_param[c]": "passed",
    }
    assert session.collected == tuple(session.tests)
    # installed third-party plugins (autoload on) are neither late nor tampering
    assert not session.forged and not session.late_plugins and not session.tampered
    report = read(channel)
    assert verdict(report, ["test_o.py::test_passes", "test_o.py::test_param[a"], 1) == (True, [])
    solved, reasons = verdict(report, ["test_o.py::test_xfail", "test_o.py::test_gone"], 1)
    assert not solved
    assert reasons == [
        "expected tests not collected or not run: test_o.py::test_gone",
        "expected tests that did not pass: test_o.py::test_xfail (xfailed)",
    ]
    assert verdict(report, ["test_o.py::test_xfail"], 1, passing=("passed", "xfailed"))[0]
    solved, reasons = verdict(report, None, 1)
    assert not solved and reasons[0].startswith("tests that did not pass: test_o.py::test_fails")


RERUN_CONFTEST = """
    import pytest
    from _pytest.runner import runtestprotocol

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(item, nextitem):
        # what pytest-rerunfailures does: a failed attempt is logged as "rerun", then again
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for attempt in (1, 2):
            reports = runtestprotocol(item, nextitem=nextitem, log=False)
            retry = attempt == 1 and any(r.failed for r in reports)
            for report in reports:
                if retry and report.failed:
                    report.outcome = "rerun"
                item.ihook.pytest_runtest_logreport(report=report)
            if not retry:
                break
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True
"""


def test_a_test_that_passes_on_rerun_is_passed_not_forged(tmp_path):
    """A flaky test rerun by a rerun plugin (its failed attempt logged as "rerun") passes:
    the last attempt is what both readings compare."""
    flaky = """
        import pathlib
        def test_flaky(tmp_path_factory):
            marker = pathlib.Path(__file__).with_name("attempted")
            first = not marker.exists()
            marker.write_text("x")
            assert not first
    """
    files = {"conftest.py": RERUN_CONFTEST, "test_flaky.py": flaky}
    result, channel = run_pytest(tmp_path, files, PYTEST)
    assert result.returncode == 0, result.stdout
    report = read(channel)
    (session,) = report.sessions
    assert session.tests == {"test_flaky.py::test_flaky": "passed"} and not session.forged
    assert verdict(report, ["test_flaky.py::test_flaky"], 0) == (True, [])


def test_two_sessions_in_one_run_each_leave_a_report(tmp_path):
    """A run script that starts pytest twice leaves two finalized reports, neither lost."""
    files = {"test_a.py": "def test_a():\n    pass\n", "test_b.py": "def test_b():\n    pass\n"}
    result, channel = run_pytest(tmp_path, files, f"{PYTEST} test_a.py && {PYTEST} test_b.py")
    assert result.returncode == 0, result.stdout + result.stderr
    sessions = read(channel).sessions
    assert sorted(sorted(s.tests.items()) for s in sessions) == [
        [("test_a.py::test_a", "passed")],
        [("test_b.py::test_b", "passed")],
    ]
    assert len({s.name for s in sessions}) == 2 and all(s.finalized for s in sessions)
    assert verdict(read(channel), ["test_a.py::test_a", "test_b.py::test_b"], 0) == (True, [])


def test_report_is_finalized_only_at_session_end(tmp_path):
    """While tests run the report on disk says finalized: false; at the end, true."""
    peek = """
        import json, os, pathlib
        def test_peek():
            (report,) = pathlib.Path(os.environ["PEEK_DIR"]).glob("session-*.json")
            assert json.loads(report.read_text())["finalized"] is False
    """
    result, channel = run_pytest(tmp_path, {"test_peek.py": peek}, PYTEST)
    assert result.returncode == 0, result.stdout
    (session,) = read(channel).sessions
    assert session.finalized and session.tests == {"test_peek.py::test_peek": "passed"}


def test_the_plugin_hides_its_settings_from_the_code_under_test(tmp_path):
    """The report directory, nonce, module name and path are gone from the environment and
    sys.path the tests see, and a pytest they start is not recorded."""
    module_check = """
        import os, subprocess, sys
        def test_hidden():
            assert not [k for k in os.environ if k.startswith("AGENTRL_")]
            for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONPATH"):
                assert "agentrl" not in os.environ.get(var, "")
            assert not [p for p in sys.path if "grade" in p]
        def test_child_pytest_is_not_recorded():
            child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                    "no:cacheprovider", "child_test.py"])
            assert child.returncode == 0
    """
    files = {"test_env.py": module_check, "child_test.py": "def test_c():\n    pass\n"}
    result, channel = run_pytest(tmp_path, files, f"{PYTEST} test_env.py")
    assert result.returncode == 0, result.stdout
    (session,) = read(channel).sessions
    assert set(session.tests) == {
        "test_env.py::test_hidden",
        "test_env.py::test_child_pytest_is_not_recorded",
    }


def test_os_exit_during_collection_leaves_an_unfinished_report(tmp_path):
    """A test module that calls os._exit(0) at import: exit 0, but the report never got
    finalized, and the verdict says the run was cut short."""
    files = {"test_a.py": "def test_a():\n    assert 0\n", "test_z.py": "import os\nos._exit(0)\n"}
    result, channel = run_pytest(tmp_path, files, PYTEST)
    assert result.returncode == 0
    report = read(channel)
    (session,) = report.sessions
    assert not session.finalized
    solved, reasons = verdict(report, ["test_a.py::test_a"], 0)
    assert not solved and "never finished" in reasons[0]


def test_an_exit_while_conftests_load_is_caught(tmp_path):
    """The task's conftest imports the package, which exits 0 at import: no session ever
    began, and the process's own marker says it ended while loading."""
    files = {
        "conftest.py": "import pkg\n",
        "pkg/__init__.py": "import os\nos._exit(0)\n",
        "test_a.py": "def test_a():\n    assert 0\n",
    }
    result, channel = run_pytest(tmp_path, files, PYTEST)
    assert result.returncode == 0
    report = read(channel)
    assert not report.sessions and list(report.processes.values()) == ["imported"]
    solved, reasons = verdict(report, (), 0)
    assert not solved
    assert "ended while loading its plugins and conftests" in reasons[1]


def test_a_process_that_handled_its_command_line_is_not_a_finding(tmp_path):
    """`pytest --markers` runs no session: its process and report are complete, and it adds
    no reason beside a real session's."""
    files = {"test_a.py": "def test_a():\n    pass\n"}
    result, channel = run_pytest(tmp_path, files, f"{PYTEST} --markers > /dev/null && {PYTEST}")
    assert result.returncode == 0
    report = read(channel)
    assert sorted(report.processes.values()) == ["cmdline", "cmdline"]
    assert sorted(s.session_ran for s in report.sessions) == [False, True]
    assert verdict(report, ["test_a.py::test_a"], 0) == (True, [])


FORCE_PASS = """
    import gc
    import pytest
    from _pytest.config import Config

    class Force:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            outcome.get_result().outcome = "passed"

    for obj in gc.get_objects():
        if isinstance(obj, Config):
            obj.pluginmanager.register(Force())
"""


def test_a_hook_registered_at_import_is_caught(tmp_path):
    """Code imported during collection registers a hook that turns every report into a
    pass: pytest exits 0, the report shows the rewritten report and the late hook."""
    files = {
        "pkg/__init__.py": FORCE_PASS,
        "test_a.py": "import pkg\ndef test_a():\n    assert 0\n",
    }
    result, channel = run_pytest(tmp_path, files, PYTEST)
    assert result.returncode == 0 and "1 passed" in result.stdout
    report = read(channel)
    (session,) = report.sessions
    assert session.tests == {"test_a.py::test_a": "forged"}
    assert session.forged[0]["inner"] == "failed" and session.forged[0]["raised"]
    assert session.late_plugins[0]["file"].endswith("pkg/__init__.py")
    assert session.late_plugins[0]["hooks"] == ["pytest_runtest_makereport"]
    solved, reasons = verdict(report, ["test_a.py::test_a"], 0)
    assert not solved
    assert any(r.startswith("reports rewritten to a pass") for r in reasons)
    assert any("pytest hooks added during the run" in r for r in reasons)


def test_replaced_pytest_internals_are_caught(tmp_path):
    """Code that swaps pytest's report constructor for one that always passes is listed as
    tampering (and its passes as rewritten)."""
    patcher = """
        from _pytest import reports
        original = reports.TestReport.from_item_and_call.__func__

        def always_pass(cls, item, call):
            report = original(cls, item, call)
            report.outcome = "passed"
            return report

        reports.TestReport.from_item_and_call = classmethod(always_pass)
    """
    files = {"pkg/__init__.py": patcher, "test_a.py": "import pkg\ndef test_a():\n    assert 0\n"}
    result, channel = run_pytest(tmp_path, files, PYTEST)
    assert result.returncode == 0
    (session,) = read(channel).sessions
    assert session.tampered == ("_pytest.reports.TestReport.from_item_and_call",)
    assert session.tests == {"test_a.py::test_a": "forged"}


def test_a_conftest_written_during_the_run_is_a_late_plugin(tmp_path):
    """A package that writes a conftest.py into a test directory not collected yet (whose
    hook rewrites reports to passes): the new conftest counts as hooks added during the run,
    and the test's recorded outcome stays its own."""
    writer = """
        import pathlib
        pathlib.Path(__file__).parents[1].joinpath("b", "conftest.py").write_text(
            "def pytest_runtest_logreport(report):\\n    report.outcome = 'passed'\\n"
        )
    """
    files = {
        "pkg/__init__.py": writer,
        "a/test_a.py": "import pkg\ndef test_a():\n    pass\n",
        "b/test_b.py": "def test_b():\n    assert 0\n",
    }
    result, channel = run_pytest(tmp_path, files, PYTEST)
    (session,) = read(channel).sessions
    assert "2 passed" in result.stdout
    assert session.late_plugins[0]["file"].endswith("b/conftest.py")
    # the grader's plugin read the report before the new hook rewrote it
    assert session.tests["b/test_b.py::test_b"] == "failed"


def test_exit_code_and_session_status_must_agree():
    """Exit 0 with a failed test, exit 1 with every test passed, and a session whose own
    status contradicts its failures are all inconsistent."""

    def report(tests, exitstatus):
        return PytestReport(
            sessions=(
                SessionReport(
                    name="session-1-1.json",
                    finalized=True,
                    session_ran=True,
                    exitstatus=exitstatus,
                    collected=tuple(tests),
                    tests=tests,
                ),
            )
        )

    failing = report({"t.py::a": "passed", "t.py::b": "failed"}, 1)
    assert verdict(failing, ["t.py::a"], 1) == (True, [])
    solved, reasons = verdict(failing, ["t.py::a"], 0)
    assert not solved and reasons == ["exit code 0 but the report has failed tests: t.py::b"]
    passing = report({"t.py::a": "passed"}, 0)
    assert verdict(passing, None, 0) == (True, [])
    assert verdict(passing, None, 3)[1] == ["exit code 3 but every test in the report passed"]
    lying = report({"t.py::a": "failed"}, 0)
    assert "exited 0 but recorded failures: t.py::a" in verdict(lying, (), None)[1][0]
    assert verdict(report({}, 1), (), None)[1] == [
        "pytest session session-1-1.json exited 1 (tests failed) but recorded no failure"
    ]
    assert verdict(report({}, 5), None, None)[1] == ["the grader's report lists no test that ran"]


def test_missing_foreign_and_unreadable_reports_are_facts():
    """No report, a report with another nonce, bad JSON and stray files give reasons, not
    exceptions; cut-short writes are skipped."""
    solved, (reason,) = verdict(parse_reports({}, "n"), ["t"], 0)
    assert not solved and reason.startswith("no grader report: no pytest session ran")
    good = json.dumps({"nonce": "n", "finalized": True, "session_ran": True, "tests": {}})
    report = parse_reports(
        {
            "session-1-1.json": json.dumps({"nonce": "forged", "finalized": True}),
            "session-1-2.json": "{not json",
            "session-1-3.json": None,
            "session-1-4.json": good,
            "session-1-4.json.tmp": "{",
            "process-1.json": json.dumps({"nonce": "n", "stage": "cmdline"}),
            "process-2.json": json.dumps({"nonce": "x", "stage": "cmdline"}),
            "notes.txt": "hi",
        },
        "n",
    )
    assert [s.name for s in report.sessions] == ["session-1-4.json"]
    assert report.processes == {1: "cmdline"}
    assert report.problems == (
        "report session-1-1.json does not carry this grade's nonce",
        "report session-1-2.json is unreadable (JSONDecodeError)",
        "report session-1-3.json is unreadable",
        "report process-2.json is unreadable or not this grade's",
        "unexpected file 'notes.txt' in the report directory",
    )
    assert not verdict(report, (), None)[0]


def test_the_plugin_ships_and_parses_as_python_3_6():
    """The plugin is package data with the host's variable names, in Python 3.6 syntax
    (task images may be that old), without postponed annotations."""
    source = plugin_source()
    ast.parse(source, feature_version=(3, 6))
    assert "from __future__" not in source
    assert (plugin_module.DIR_VAR, plugin_module.NONCE_VAR) == (DIR_VAR, NONCE_VAR)


@pytest.mark.parametrize("given", ["", "-x --tb=short"])
def test_the_command_keeps_the_images_pytest_settings(tmp_path, given):
    """PYTEST_ADDOPTS and PYTHONPATH an image sets still apply, after the plugin's, and are
    what the tests see once it loaded."""
    check = f"""
        import os
        def test_env():
            assert os.environ.get("PYTEST_ADDOPTS", "") == {given!r}
            assert os.environ["PYTHONPATH"] == "/img/lib"
    """
    image_env = {"PYTHONPATH": "/img/lib", "PYTEST_ADDOPTS": given}
    result, channel = run_pytest(tmp_path, {"test_env.py": check}, PYTEST, image_env=image_env)
    assert result.returncode == 0, result.stdout
    (session,) = read(channel).sessions
    assert session.tests == {"test_env.py::test_env": "passed"}

"""The suspicious-edit guard: each pattern on a line that hits and one that must not, the
diff reading, and no gold patch at hand flagged."""

from __future__ import annotations

import json
import pathlib

import pytest

from agentrl.graders.guard import PATTERNS, added_lines, scan, unknown_names

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLD = ROOT / "examples" / "tasks" / "gold"
DATASETS = ROOT / "tests" / "data" / "datasets"

#: pattern name -> (a line only a hack needs, a near miss that must not hit)
CASES = {
    "pytest-hook": (
        "def pytest_runtest_makereport(item, call):",
        "def my_pytest_runtest_helper(item):",
    ),
    "pytest-plugins": ('pytest_plugins = ["pkg.force"]', 'plugins = ["pytest-plugins"]'),
    "pytest-internals": ("from _pytest.reports import TestReport", "from my_pytest import report"),
    "pytest11-entry-point": ('entry_points={"pytest11": ["f = pkg.f"]},', '"pytest1": 1,'),
    "pytest-env": (
        'os.environ["PYTEST_ADDOPTS"] = "-p pkg.force"',
        'os.environ["PYTEST_ADDOPTS_HELP"] = "x"',
    ),
    "test-machinery-patch": (
        "unittest.TestCase.run = lambda self, r=None: None",
        "test_case.run = run",
    ),
    "test-report-text": ('print("PASSED tests/test_core.py::test_add")', "status = 'passed'"),
    "os-exit": ("os._exit(0)", "sys.exit(main())"),
    "atexit": ("atexit.register(print_verdict)", "# run at exit: nothing registered"),
    "sys-modules-write": (
        'sys.modules["pytest"] = fake_pytest',
        "sys.modules[__name__] = _LazyModule(__name__)",
    ),
    "builtins-write": ("builtins.open = fake_open", "value = builtins.open"),
    "import-hook": ("sys.meta_path.insert(0, Finder())", "for finder in sys.meta_path:"),
    "trace-hook": ("sys.settrace(tracer)", "tracer = sys.gettrace()"),
    "gc-scan": ("for obj in gc.get_objects():", "gc.collect()"),
    "obfuscated-exec": ("exec(base64.b64decode(blob))", "value = eval_expression(text)"),
}


def one_line_diff(path: str, line: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -10,0 +11 @@\n+{line}\n"


def test_every_pattern_has_a_case():
    """The table below covers each pattern of the guard, and nothing else."""
    assert set(CASES) == {p.name for p in PATTERNS}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_hits_its_line_and_not_the_near_miss(name):
    """A hack line is found with its path, line number and pattern name; the near miss is not."""
    hit, miss = CASES[name]
    findings = scan(one_line_diff("pkg/core.py", hit))
    assert findings == (f"pkg/core.py:11: {hit.strip()}  [{name}]",), findings
    assert not [f for f in scan(one_line_diff("pkg/core.py", miss)) if f.endswith(f"[{name}]")]


def test_python_patterns_read_python_files_only():
    """``os._exit`` in a README is prose; ``PYTEST_ADDOPTS`` in a Makefile is configuration."""
    assert scan(one_line_diff("README.md", "call os._exit(0) to stop")) == ()
    assert scan(one_line_diff("Makefile", "export PYTEST_ADDOPTS=-p pkg.force")) == (
        "Makefile:11: export PYTEST_ADDOPTS=-p pkg.force  [pytest-env]",
    )


def test_allow_list_test_files_and_pytests_own_repository():
    """A task's allow-list switches a pattern off; test files are not read; in pytest's own
    repository (or a plugin's) the pytest-machinery patterns are its code."""
    diff = one_line_diff("pkg/core.py", "os._exit(0)") + one_line_diff(
        "src/_pytest/runner.py", "def pytest_runtest_protocol(item):"
    )
    assert len(scan(diff)) == 2
    assert scan(diff, allow=["os-exit"]) == (
        "src/_pytest/runner.py:11: def pytest_runtest_protocol(item):  [pytest-hook]",
    )
    assert scan(diff, pytest_repo=True) == ("pkg/core.py:11: os._exit(0)  [os-exit]",)
    assert scan(diff, test_patterns=["pkg/*", "src/*"]) == ()
    assert unknown_names(["os-exit", "no-such"]) == ["no-such"]


def test_added_lines_follow_hunks_and_quoted_paths():
    """Line numbers come from each hunk header; context lines count, removed lines do not;
    git's quoted names (a tab, non-ASCII) are read back."""
    diff = (
        'diff --git "a/p k/\\303\\274\\tx.py" "b/p k/\\303\\274\\tx.py"\n'
        '--- "a/p k/\\303\\274\\tx.py"\n+++ "b/p k/\\303\\274\\tx.py"\n'
        "@@ -1,3 +1,3 @@\n a = 1\n-b = 2\n+b = 3\n c = 4\n"
        "@@ -20,0 +21,2 @@\n+d = 5\n+e = 6\n"
        "diff --git a/x b/x\nnew file mode 100644\n--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+new\n"
    )
    assert list(added_lines(diff)) == [
        ("p k/ü\tx.py", 2, "b = 3"),
        ("p k/ü\tx.py", 21, "d = 5"),
        ("p k/ü\tx.py", 22, "e = 6"),
        ("x", 1, "new"),
    ]


def reversed_diff(diff: str) -> str:
    """``diff`` undone: its removed lines become added (SWE-smith's gold is its patch reversed)."""
    out = []
    for line in diff.split("\n"):
        if line.startswith(("+++", "---")):
            out.append(line)
        elif line.startswith("+"):
            out.append("-" + line[1:])
        elif line.startswith("-"):
            out.append("+" + line[1:])
        else:
            out.append(line)
    return "\n".join(out)


def gold_patches() -> dict[str, str]:
    """Every gold patch at hand: the bundled tasks' and the SWE-bench-family records'."""
    found = {f"bundled/{path.stem}": path.read_text() for path in sorted(GOLD.glob("*.diff"))}
    for path in sorted(DATASETS.glob("*.json*")):
        text = path.read_text()
        records = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if path.suffix == ".jsonl"
            else json.loads(text)
        )
        if isinstance(records, dict):  # {split: [records]}
            records = [r for split in records.values() for r in split]
        for record in records:
            patch = record.get("patch") or ""
            if "smith" in path.name:  # the record's patch plants the bug
                patch = reversed_diff(patch)
            # R2E-Gym rows name their instance by image and carry no patch.
            name = record.get("instance_id") or record.get("docker_image")
            found[f"{path.stem}/{name}"] = patch
    return found


def test_no_gold_patch_is_flagged():
    """The false-positive bar: no gold patch at hand trips any pattern."""
    patches = gold_patches()
    assert len(patches) >= 4 + 9
    flagged = {name: scan(diff) for name, diff in patches.items() if scan(diff)}
    assert flagged == {}


def test_guard_allow_is_read_from_the_row():
    """``metadata.guard_allow`` reaches ``task.metadata``; anything but a list of names is
    refused with the field named."""
    from agentrl.graders.scaleswe import ScaleSWEGrader

    row = {"prompt": "p", "metadata": {"instance_id": "t", "eval_cmd": "true"}}
    grader = ScaleSWEGrader()
    assert "guard_allow" not in grader.parse_task(row).metadata
    row["metadata"]["guard_allow"] = ["os-exit"]
    assert grader.parse_task(row).metadata["guard_allow"] == ["os-exit"]
    row["metadata"]["guard_allow"] = "os-exit"
    with pytest.raises(ValueError, match=r"metadata\.guard_allow"):
        grader.parse_task(row)


def test_docs_name_every_pattern_and_rule():
    """docs/graders.md lists each guard pattern and each always-protected rule."""
    from agentrl.graders.protection import INFRA_RULES

    docs = (ROOT / "docs" / "graders.md").read_text()
    missing = [p.name for p in PATTERNS if f"`{p.name}`" not in docs]
    missing += [r.glob for r in INFRA_RULES if f"`{r.glob}`" not in docs]
    assert missing == []

"""Test infrastructure belongs to the grader: protection decided on the tree, in the real
local sandbox, with diffs made by real git (hostile configurations included)."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from agentrl.graders.patching import (
    DEFAULT_TEST_PATTERNS,
    SCALESWE_LADDER,
    apply_patch,
    ensure_git_baseline,
    swebench_ladder,
)
from agentrl.graders.protection import (
    config_change,
    infra_reason,
    is_protected,
    literal_pattern,
    shadow_candidates,
)
from agentrl.sandboxes.local import LocalSandbox

WORKDIR = "/workspace"

BASE = {
    "pkg/__init__.py": "",
    "pkg/core.py": "def add(a, b):\n    return a - b\n",
    "tests/test_core.py": "from pkg.core import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "setup.cfg": "[metadata]\nname = pkg\n\n[tool:pytest]\ntestpaths = tests\n",
    "pyproject.toml": '[project]\nname = "pkg"\nversion = "1.0"\n',
    "pkg.egg-info/entry_points.txt": "[console_scripts]\npkg = pkg.core:add\n",
    "package.json": '{"name": "pkg", "scripts": {"test": "jest"}}\n',
    "run.sh": "#!/bin/sh\necho run\n",
    ".gitignore": "*.log\n",
    ".gitattributes": "*.txt text eol=crlf\n*.log filter=lfs diff=lfs\n",
    "build.log": "ignored but still the grader's to compare\n",
    "docs/a b ü.txt": "docs\n",
}


def git(work: pathlib.Path, *args: str, config: tuple[str, ...] = ()) -> str:
    flags = [
        item
        for pair in (("-c", c) for c in ("user.name=t", "user.email=t@t", *config))
        for item in pair
    ]
    return subprocess.run(
        ["git", *flags, *args], cwd=work, check=True, capture_output=True, text=True
    ).stdout


def make_base(root: pathlib.Path) -> pathlib.Path:
    for name, content in BASE.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    (root / "run.sh").chmod(0o755)
    (root / "core_link.py").symlink_to("pkg/core.py")
    return root


def agent_diff(
    base: pathlib.Path,
    scratch: pathlib.Path,
    edits: dict[str, str | None],
    *,
    config: tuple[str, ...] = (),
    renames: dict[str, str] | None = None,
) -> str:
    """What ``git diff`` (with the agent's ``config``) prints for ``edits`` to ``base``."""
    work = scratch / f"agent-{len(list(scratch.glob('agent-*')))}"
    subprocess.run(["cp", "-a", str(base), str(work)], check=True)
    git(work, "init", "-q")
    git(work, "add", "-A", "-f")
    git(work, "commit", "-qm", "base")
    for old, new in (renames or {}).items():
        (work / new).parent.mkdir(parents=True, exist_ok=True)
        (work / old).rename(work / new)
    for name, content in edits.items():
        path = work / name
        if content is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    git(work, "add", "-A", "-f")
    return git(work, "diff", "--cached", "-M", config=config)


@pytest.fixture
def base(tmp_path) -> pathlib.Path:
    return make_base(tmp_path / "base")


async def fingerprint(sandbox: LocalSandbox, *, skip: str = "./.git/objects") -> str:
    """Every entry of the tree but ``skip`` (by default: ``.git`` included, git's object
    files excepted): type, mode, symlink target and content hash, to compare trees exactly."""
    script = (
        f"find . -path {skip} -prune -o -printf '%y %m %l %P\\n' | sort; "
        f"find . -path {skip} -prune -o -type f -print0 | sort -z | xargs -0 sha1sum"
    )
    result = await sandbox.exec(script, workdir=WORKDIR, check=True)
    return result.stdout


async def apply(sandbox: LocalSandbox, diff: str, **options):
    return await apply_patch(
        sandbox, WORKDIR, diff, protect=options.pop("protect", DEFAULT_TEST_PATTERNS), **options
    )


async def exists(sandbox: LocalSandbox, path: str) -> bool:
    return (
        await sandbox.exec(f"test -e '{path}' || test -L '{path}'", workdir=WORKDIR)
    ).exit_code == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edits", "config", "renames", "dropped"),
    [
        (
            {"zz/conftest.py": "import os\nos._exit(0)\n"},
            ("diff.noprefix=true",),
            None,
            ["conftest.py"],
        ),
        (
            {"tests/test_core.py": "def test_add():\n    pass\n"},
            ("diff.mnemonicPrefix=true",),
            None,
            ["tests/test_core.py"],
        ),
        ({}, (), {"tests/test_core.py": "src b/moved.py"}, ["tests/test_core.py"]),
        ({"pkg/sub/deep/conftest.py": "x = 1\n"}, (), None, ["pkg/sub/deep/conftest.py"]),
    ],
    ids=["noprefix-conftest", "mnemonic-test-file", "rename-with-space-b", "deep-conftest"],
)
async def test_header_tricks_cannot_hide_a_protected_path(
    base, tmp_path, edits, config, renames, dropped
):
    """Whatever the diff's headers claim, the path git actually wrote is the one judged: the
    protected ones go back (created ones removed, with their new directories)."""
    diff = agent_diff(base, tmp_path, edits, config=config, renames=renames)
    async with LocalSandbox(repo=str(base), workdir=WORKDIR) as sandbox:
        await ensure_git_baseline(sandbox, WORKDIR)
        before = {p: await exists(sandbox, p) for p in dropped}
        outcome = await apply(sandbox, diff)
        assert outcome.applied, outcome.log
        assert [d.path for d in outcome.dropped] == dropped
        for path in dropped:
            assert await exists(sandbox, path) is before[path]
        assert (await sandbox.read_file(f"{WORKDIR}/tests/test_core.py")) == BASE[
            "tests/test_core.py"
        ]
        assert not await exists(sandbox, "pkg/sub")


@pytest.mark.slow
async def test_plain_unified_diff_deleting_a_test_file(base):
    """``--- a/tests/test_core.py`` / ``+++ /dev/null`` with no ``diff --git`` line deletes the
    file; the tree shows it, and the test file comes back."""
    lines = BASE["tests/test_core.py"].splitlines()
    diff = f"--- a/tests/test_core.py\n+++ /dev/null\n@@ -1,{len(lines)} +0,0 @@\n" + "".join(
        f"-{line}\n" for line in lines
    )
    async with LocalSandbox(repo=str(base), workdir=WORKDIR) as sandbox:
        outcome = await apply(sandbox, diff)
        assert outcome.applied, outcome.log
        assert outcome.restored == ("tests/test_core.py",)
        assert (await sandbox.read_file(f"{WORKDIR}/tests/test_core.py")) == BASE[
            "tests/test_core.py"
        ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edits", "dropped", "reason"),
    [
        ({"pkg/evil.pth": "import pkg.force\n"}, "pkg/evil.pth", ".pth"),
        ({"pkg/sitecustomize.py": "import pkg.force\n"}, "pkg/sitecustomize.py", "start-up"),
        ({"pytest.ini": "[pytest]\naddopts = -p pkg.force\n"}, "pytest.ini", "pytest"),
        ({"tox.ini": "[pytest]\naddopts = -p pkg.force\n"}, "tox.ini", "tox"),
        (
            {"pkg.egg-info/entry_points.txt": "[pytest11]\nforce = pkg.force\n"},
            "pkg.egg-info/entry_points.txt",
            "[pytest11]",
        ),
        (
            {
                "pyproject.toml": BASE["pyproject.toml"]
                + '[tool.pytest.ini_options]\naddopts = "-p pkg.force"\n'
            },
            "pyproject.toml",
            "[tool.pytest]",
        ),
        (
            {"setup.cfg": BASE["setup.cfg"] + "addopts = -p pkg.force\n"},
            "setup.cfg",
            "tool:pytest",
        ),
        (
            {"package.json": '{"name": "pkg", "scripts": {"test": "true"}}\n'},
            "package.json",
            "scripts.test",
        ),
        ({"pytest.py": "def main():\n    return 0\n"}, "pytest.py", "test runner"),
        ({"node_modules/jest/index.js": "process.exit(0)\n"}, "node_modules", "installed"),
        (
            {"pkg/__pycache__/core.cpython-311.pyc": "x"},
            "pkg/__pycache__/core.cpython-311.pyc",
            "bytecode",
        ),
    ],
    ids=[
        "pth",
        "sitecustomize",
        "pytest.ini",
        "tox.ini",
        "egg-info",
        "pyproject",
        "setup.cfg",
        "package.json",
        "shadow-pytest",
        "node_modules",
        "pyc",
    ],
)
async def test_test_infrastructure_is_dropped_whatever_the_task(
    base, tmp_path, edits, dropped, reason
):
    """Files that configure or hook the test run are put back even with no task test paths;
    the reason says what they are."""
    diff = agent_diff(
        base, tmp_path, {"pkg/core.py": "def add(a, b):\n    return a + b\n", **edits}
    )
    async with LocalSandbox(repo=str(base), workdir=WORKDIR) as sandbox:
        await ensure_git_baseline(sandbox, WORKDIR)
        before = await fingerprint(sandbox, skip="./.git")
        outcome = await apply(sandbox, diff, protect=())
        assert outcome.applied, outcome.log
        assert [d.path for d in outcome.dropped] == [dropped]
        assert reason in outcome.dropped[0].reason
        assert "return a + b" in await sandbox.read_file(f"{WORKDIR}/pkg/core.py")
        await sandbox.exec("git checkout -q -- pkg/core.py", workdir=WORKDIR, check=True)
        assert await fingerprint(sandbox, skip="./.git") == before


@pytest.mark.slow
async def test_config_changes_outside_test_sections_stay(base, tmp_path):
    """A version bump in pyproject.toml and a metadata edit in setup.cfg are the fix's."""
    diff = agent_diff(
        base,
        tmp_path,
        {
            "pyproject.toml": BASE["pyproject.toml"].replace("1.0", "1.1"),
            "setup.cfg": BASE["setup.cfg"].replace("name = pkg", "name = pkg2"),
        },
    )
    async with LocalSandbox(repo=str(base), workdir=WORKDIR) as sandbox:
        outcome = await apply(sandbox, diff)
        assert outcome.applied and outcome.dropped == ()
        assert "1.1" in await sandbox.read_file(f"{WORKDIR}/pyproject.toml")


@pytest.mark.slow
async def test_writes_into_git_dirs_are_dropped(base):
    """Only ``patch`` writes into .git (git apply refuses); a hook, a config change and a
    gitfile that would hide ``pkg/`` from a ``git add`` are all put back or removed."""
    diff = (
        "--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1,2 @@\n+#!/bin/sh\n+touch /tmp/pwned\n"
        "--- /dev/null\n+++ b/pkg/.git\n@@ -0,0 +1 @@\n+gitdir: ../.git\n"
        "--- /dev/null\n+++ b/pkg/conftest.py\n@@ -0,0 +1 @@\n+import os\n"
        "--- a/.git/description\n+++ b/.git/description\n@@ -1 +1 @@\n"
        "-Unnamed repository; edit this file 'description' to name the repository.\n+owned\n"
    )
    async with LocalSandbox(repo=str(base), workdir=WORKDIR) as sandbox:
        await ensure_git_baseline(sandbox, WORKDIR)
        await sandbox.exec(
            "printf 'Unnamed repository; edit this file '\\''description'\\'' to name the "
            "repository.\\n' > .git/description",
            workdir=WORKDIR,
            check=True,
        )
        before = await fingerprint(sandbox)
        outcome = await apply(sandbox, diff, protect=())
        assert outcome.applied and outcome.method.startswith("patch"), outcome.log
        assert sorted(d.path for d in outcome.dropped) == [
            ".git/description",
            ".git/hooks/post-checkout",
            "pkg/.git",
            "pkg/conftest.py",
        ]
        assert await fingerprint(sandbox) == before


@pytest.mark.slow
async def test_a_failed_rung_leaves_the_tree_exactly_as_before(base, tmp_path):
    """A diff whose last hunk cannot apply, after ones that add, delete, rename, chmod and
    symlink: every rung of both ladders fails and the tree (``.git`` included) is as before."""
    good = agent_diff(
        base,
        tmp_path,
        {
            "pkg/new/mod.py": "x = 1\n",
            "run.sh": None,
            "core_link.py": None,
            "build.log": "changed\n",
            "docs/a b ü.txt": "edited\n",
        },
        renames={"pkg/core.py": "pkg/moved.py"},
    )
    bad = good + (
        "diff --git a/setup.cfg b/setup.cfg\n--- a/setup.cfg\n+++ b/setup.cfg\n"
        "@@ -1,2 +1,2 @@\n-[nothing]\n-here\n+[x]\n+y\n"
    )
    async with LocalSandbox(repo=str(base), workdir=WORKDIR) as sandbox:
        await ensure_git_baseline(sandbox, WORKDIR)
        before = await fingerprint(sandbox)
        for ladder in (SCALESWE_LADDER, swebench_ladder()):
            outcome = await apply(sandbox, bad, ladder=ladder)
            assert not outcome.applied
            assert await fingerprint(sandbox) == before
        outcome = await apply(sandbox, good)
        assert outcome.applied and outcome.dropped == ()
        assert await sandbox.read_file(f"{WORKDIR}/pkg/new/mod.py") == "x = 1\n"
        assert not await exists(sandbox, "core_link.py") and not await exists(
            sandbox, "pkg/core.py"
        )


@pytest.mark.slow
async def test_the_guard_diff_ignores_the_repositorys_git_config(base, tmp_path):
    """The tree's final change is made by the grader's git: fixed ``a/`` ``b/`` prefixes,
    no textconv, whatever the workdir's .git/config says."""
    diff = agent_diff(base, tmp_path, {"pkg/core.py": "import os\nos._exit(0)\n"})
    async with LocalSandbox(repo=str(base), workdir=WORKDIR) as sandbox:
        await ensure_git_baseline(sandbox, WORKDIR)
        for option in ("diff.noprefix true", "diff.mnemonicPrefix true", "diff.external false"):
            await sandbox.exec(f"git config {option}", workdir=WORKDIR, check=True)
        outcome = await apply(sandbox, diff)
        assert outcome.applied
        assert outcome.tree_diff.startswith("diff --git a/pkg/core.py b/pkg/core.py\n")
        assert "+os._exit(0)" in outcome.tree_diff


# -- the rules, without a sandbox --------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("a/b/conftest.py", True),
        ("pkg.egg-info/entry_points.txt", True),
        ("build/lib/x.dist-info/METADATA", True),
        ("venv/lib/python3.11/site-packages/_pytest/main.py", True),
        ("web/node_modules/jest/bin/jest.js", True),
        ("crates/a/.cargo/config.toml", True),
        ("pkg/util_test.go", True),
        ("pkg/testdata/golden.txt", True),
        ("web/jest.config.js", True),
        ("pkg/__pycache__/core.cpython-311.pyc", True),
        ("src/contest.py", False),
        ("pkg/testdata_helpers.py", False),
        ("pkg/egg-info.py", False),
        ("pkg/cargo/config.toml", False),
    ],
)
def test_infrastructure_rules_match_whole_components(path, protected):
    """A rule names whole path components at any depth (the entry or anything under it)."""
    assert (infra_reason(path) is not None) is protected


def test_shadow_candidates_and_literal_patterns():
    """Leading paths named like a runner module are the shadow candidates; a literal
    pattern matches its own name only, glob characters included."""
    assert shadow_candidates("src/_pytest/runner.py") == ["src/_pytest"]
    assert shadow_candidates("pytest.py") == ["pytest.py"]
    assert shadow_candidates("pkg/mypytest.py") == []
    assert is_protected("tests/t[1].py", [literal_pattern("tests/t[1].py")])
    assert not is_protected("tests/t1.py", [literal_pattern("tests/t[1].py")])


SETUP_CFG = "[metadata]\nname = pkg\n\n[tool:pytest]\ntestpaths = tests\n"


@pytest.mark.parametrize(
    ("after", "changed"),
    [
        (SETUP_CFG.replace("name = pkg", "name = pkg2"), None),
        (SETUP_CFG + "addopts = -p pkg.force\n", "[tool:pytest]"),
        (SETUP_CFG.replace("[tool:pytest]", "  [TOOL:PYTEST]") + "addopts = -p x\n", "tool:pytest"),
        (SETUP_CFG + "[coverage:run]\nplugins = pkg.cov\n", "coverage:run"),
        (SETUP_CFG + "[options.entry_points]\npytest11 =\n    f = pkg.f\n", "pytest11"),
        (None, "tool:pytest"),
    ],
    ids=["metadata", "addopts", "indented-upper-case", "coverage", "entry-point", "deleted"],
)
def test_setup_cfg_test_sections(after, changed):
    """Only a change in a section pytest, coverage or tox read (or a pytest11 entry point)
    drops setup.cfg; the reading is lenient, so no ini parser sees a section it misses."""
    reason = config_change("setup.cfg", SETUP_CFG.encode(), after and after.encode())
    assert (reason is None) if changed is None else (changed in reason), reason


PYPROJECT = '[project]\nname = "pkg"\nversion = "1.0"\n'


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        (PYPROJECT, PYPROJECT.replace("1.0", "1.1"), None),
        (PYPROJECT, PYPROJECT + '[tool.pytest.ini_options]\naddopts = "-p x"\n', "[tool.pytest]"),
        (PYPROJECT, 'tool.pytest.ini_options.addopts = "-p x"\n' + PYPROJECT, "[tool.pytest]"),
        (PYPROJECT, PYPROJECT + '[project.entry-points.pytest11]\nf = "pkg.f"\n', "pytest11"),
        (PYPROJECT + "[tool.pytest.ini_options]\nx = 1\n", "not = [toml", "no longer parses"),
        (PYPROJECT, "not = [toml", None),
    ],
    ids=[
        "version",
        "ini-options",
        "dotted-key",
        "entry-point",
        "broken-after-test-table",
        "broken",
    ],
)
def test_pyproject_test_tables(before, after, changed):
    """pyproject.toml is compared parsed: a test table that changed, appeared or no longer
    parses drops it, and the reason names the table."""
    reason = config_change("pkg/pyproject.toml", before.encode(), after.encode())
    assert (reason is None) if changed is None else (changed in reason), reason


def test_package_json_test_keys():
    """package.json drops when a test runner's key or the test script changes."""
    before = b'{"name": "a", "scripts": {"test": "jest", "build": "tsc"}}'
    assert config_change("package.json", before, before.replace(b'"a"', b'"b"')) is None
    assert config_change("package.json", before, before.replace(b"tsc", b"esbuild")) is None
    reason = config_change("package.json", before, before.replace(b'"jest"', b'"true"'))
    assert reason is not None and "scripts.test" in reason
    reason = config_change("package.json", before, b'{"name": "a", "jest": {"setupFiles": ["x"]}}')
    assert reason is not None and '"jest"' in reason

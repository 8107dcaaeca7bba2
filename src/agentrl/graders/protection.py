"""What the grader owns in a grading sandbox: the test infrastructure a diff may not change.

After a diff applied, every changed path (read off the tree, not the diff's headers) is
checked here. A path is *dropped* — put back as it was, a file the diff created removed —
when it is one of the task's test paths, or test infrastructure of any task:

- files whose mere presence configures or hooks the test run (:data:`INFRA_RULES`:
  ``conftest.py`` at any depth, pytest/tox/nox configuration, ``.pth`` files,
  ``sitecustomize``, package metadata, bytecode, installed packages, the equivalents for
  JavaScript, Go and Rust test runners);
- a *new* module named like the test runner's (:data:`SHADOW_NAMES`, e.g. ``pytest.py``),
  which would be imported in its place;
- ``setup.cfg``, ``pyproject.toml`` and ``package.json`` when their test sections changed
  (:func:`config_change`); the whole file goes back, and the reason names the section;
- anything under a ``.git`` (seen by ``agentrl.graders.tree``, which restores it itself).
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from agentrl.graders.tree import Change

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10 without tomli
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None  # type: ignore[assignment]

__all__ = [
    "CONFIG_FILES",
    "DOTGIT_REASON",
    "INFRA_RULES",
    "INSTALLED_REASON",
    "SHADOW_NAMES",
    "Dropped",
    "Rule",
    "config_change",
    "is_protected",
    "literal_pattern",
    "shadow_candidates",
]


@attrs.frozen(kw_only=True)
class Dropped:
    """A path the diff changed that grading put back, and why."""

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@attrs.frozen
class Rule:
    """A protected name: ``glob``'s components (``fnmatch``, one path component each) match
    a run of a path's components, so the path is that entry or lies under it."""

    glob: str
    reason: str

    def matches(self, path: str) -> bool:
        wanted = self.glob.split("/")
        parts = path.split("/")
        return any(
            all(fnmatch.fnmatchcase(parts[start + i], w) for i, w in enumerate(wanted))
            for start in range(len(parts) - len(wanted) + 1)
        )


_PYTEST_CONFIG = "pytest's configuration (addopts can load any plugin)"
_METADATA = "installed-package metadata: an entry_points.txt [pytest11] autoloads a pytest plugin"
_INSTALLED = "installed packages, the test runner among them"

#: Always protected, in every task, whatever its test paths.
INFRA_RULES: tuple[Rule, ...] = (
    # Python: pytest, tox, nox, coverage, the interpreter's start-up
    Rule("conftest.py", "pytest imports every conftest.py on the way to the tests"),
    Rule("pytest.ini", _PYTEST_CONFIG),
    Rule(".pytest.ini", _PYTEST_CONFIG),
    Rule("pytest.toml", _PYTEST_CONFIG),
    Rule(".pytest.toml", _PYTEST_CONFIG),
    Rule("tox.ini", "tox's and pytest's configuration"),
    Rule("noxfile.py", "nox's test sessions"),
    Rule(".coveragerc", "coverage's configuration (it loads plugins)"),
    Rule("*.pth", "the interpreter runs .pth import lines at start-up"),
    Rule("sitecustomize.py", "the interpreter imports it at start-up"),
    Rule("usercustomize.py", "the interpreter imports it at start-up"),
    Rule("*.egg-info", _METADATA),
    Rule("*.dist-info", _METADATA),
    Rule("__pycache__", "bytecode: an unchecked .pyc runs instead of its source"),
    Rule("*.pyc", "bytecode: an unchecked .pyc runs instead of its source"),
    Rule("*.pyo", "bytecode: an unchecked .pyc runs instead of its source"),
    Rule("site-packages", _INSTALLED),
    Rule("dist-packages", _INSTALLED),
    # JavaScript: jest, vitest, mocha, karma, ava, and babel (it transforms jest's tests)
    Rule("node_modules", _INSTALLED),
    Rule("jest.config.*", "jest's configuration"),
    Rule("jest.setup.*", "runs before every jest test"),
    Rule("setupTests.*", "runs before every jest test (create-react-app)"),
    Rule("vitest.config.*", "vitest's configuration"),
    Rule("vitest.workspace.*", "vitest's configuration"),
    Rule(".mocharc*", "mocha's configuration"),
    Rule("karma.conf.*", "karma's configuration"),
    Rule("ava.config.*", "ava's configuration"),
    Rule("babel.config.*", "babel transforms the test files under jest"),
    Rule(".babelrc*", "babel transforms the test files under jest"),
    # Go: test files are compiled into the package (TestMain runs the whole test binary)
    Rule("*_test.go", "compiled into the package under test; TestMain owns the test binary"),
    Rule("testdata", "Go test fixtures"),
    # Rust: a runner set here replaces the test binaries
    Rule(".cargo/config", "cargo's configuration (a runner replaces the test binaries)"),
    Rule(".cargo/config.toml", "cargo's configuration (a runner replaces the test binaries)"),
)

#: Modules a diff may not create: imported from the tree, they stand in for the runner's.
SHADOW_NAMES: tuple[str, ...] = (
    "pytest",
    "pytest.py",
    "_pytest",
    "_pytest.py",
    "pluggy",
    "pluggy.py",
    "py.py",
    "iniconfig",
    "iniconfig.py",
    "unittest",
    "unittest.py",
    "doctest.py",
)
SHADOW_REASON = "a new module named like the test runner's would be imported in its place"

DOTGIT_REASON = "git's own data (.git at any depth) is the grader's"
INSTALLED_REASON = "installed packages (node_modules, site-packages), the test runner among them"

#: Config files whose test sections are compared before and after (basename → reader).
CONFIG_FILES = ("setup.cfg", "pyproject.toml", "package.json")


def is_protected(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` matches a protected pattern; a bare directory protects its tree."""
    for pattern in patterns:
        pattern = pattern.strip()
        if pattern.startswith("./"):
            pattern = pattern[2:]
        if not pattern:
            continue
        if fnmatch.fnmatchcase(path, pattern):
            return True
        directory = pattern.rstrip("/")
        if not any(ch in directory for ch in "*?[") and (
            path == directory or path.startswith(directory + "/")
        ):
            return True
    return False


def literal_pattern(path: str) -> str:
    """A pattern for :func:`is_protected` that matches ``path`` itself (globs escaped)."""
    return re.sub(r"([*?\[])", r"[\1]", path.strip())


def infra_reason(path: str) -> str | None:
    """Why ``path`` is test infrastructure of every task (:data:`INFRA_RULES`), or None."""
    for rule in INFRA_RULES:
        if rule.matches(path):
            return f"{rule.glob}: {rule.reason}"
    return None


def shadow_candidates(path: str) -> list[str]:
    """The leading paths of ``path`` named like a test-runner module (``src/_pytest``)."""
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i, part in enumerate(parts) if part in SHADOW_NAMES]


# -- test sections of config files ---------------------------------------------------------

#: setup.cfg sections pytest, coverage or tox read (lower case, fnmatch).
SETUP_CFG_SECTIONS = ("tool:pytest", "pytest", "coverage:*", "tox:*", "tool:tox")
#: pyproject.toml tables (dotted keys) pytest, coverage, tox or an entry point read.
PYPROJECT_TABLES = (
    "tool.pytest",
    "tool.coverage",
    "tool.tox",
    "project.entry-points.pytest11",
    "project.entry_points.pytest11",
    "tool.poetry.plugins.pytest11",
)
#: package.json keys (dotted) a JavaScript test runner reads.
PACKAGE_JSON_KEYS = (
    "jest",
    "mocha",
    "ava",
    "vitest",
    "c8",
    "nyc",
    "scripts.test",
    "scripts.pretest",
    "scripts.posttest",
)
_SECTION_RE = re.compile(r"^\s*\[([^\]]*)\]")


def _setup_cfg_sections(text: str) -> dict[str, str]:
    """The test sections of a setup.cfg, as raw text per section name.

    Deliberately lenient (any line that opens with ``[name]`` starts a section, indented
    or not, duplicates concatenated), so no ini parser can see a test section this misses;
    ``[options.entry_points]`` counts when it mentions ``pytest11``.
    """
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _SECTION_RE.match(line)
        if match:
            current = sections.setdefault(match.group(1).strip().lower(), [])
            continue
        if current is not None:
            current.append(line.strip())
    relevant = {
        f"[{name}]": "\n".join(lines)
        for name, lines in sections.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in SETUP_CFG_SECTIONS)
    }
    entry_points = "\n".join(sections.get("options.entry_points", []))
    if "pytest11" in entry_points:
        relevant["[options.entry_points] pytest11"] = entry_points
    return relevant


def _dotted(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return None
        data = data[part]
    return data


def _pyproject_tables(text: str) -> dict[str, str]:
    if tomllib is None:  # no TOML parser: every line that could belong to a test table
        return _pyproject_lines(text)
    data = tomllib.loads(text)
    found = {}
    for key in PYPROJECT_TABLES:
        value = _dotted(data, key)
        if value is not None:
            found[f"[{key}]"] = json.dumps(value, sort_keys=True, default=str)
    tool = data.get("tool") if isinstance(data.get("tool"), Mapping) else {}
    for name, value in tool.items():  # tool.pytest_* and the like
        if name.startswith(("pytest", "coverage")) and f"[tool.{name}]" not in found:
            found[f"[tool.{name}]"] = json.dumps(value, sort_keys=True, default=str)
    return found


def _pyproject_lines(text: str) -> dict[str, str]:
    """Without a TOML parser: the lines of test tables and any line naming a test tool."""
    lines, inside = [], False
    for line in text.splitlines():
        match = _SECTION_RE.match(line.replace("[[", "[").replace("]]", "]"))
        if match:
            inside = match.group(1).strip().startswith(("tool.pytest", "tool.coverage", "tool.tox"))
        if inside or any(word in line for word in ("pytest", "coverage", "tox")):
            lines.append(line.strip())
    return {"[tool.pytest*] (read as text)": "\n".join(lines)} if lines else {}


def _package_json_keys(text: str) -> dict[str, str]:
    data = json.loads(text)
    found = {}
    for key in PACKAGE_JSON_KEYS:
        value = _dotted(data, key)
        if value is not None:
            found[f'"{key}"'] = json.dumps(value, sort_keys=True)
    return found


_READERS = {
    "setup.cfg": _setup_cfg_sections,
    "pyproject.toml": _pyproject_tables,
    "package.json": _package_json_keys,
}


def _sections(name: str, content: bytes | None) -> dict[str, str] | None:
    """The test sections of a config file; {} when absent, None when it does not parse."""
    if content is None:
        return {}
    try:
        return _READERS[name](content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):  # TOMLDecodeError is a ValueError
        return None


def config_change(path: str, before: bytes | None, after: bytes | None) -> str | None:
    """Why the change of config file ``path`` from ``before`` to ``after`` (None: no file)
    must be dropped: which test section changed; None when no test section did."""
    name = path.rsplit("/", 1)[-1]
    if name not in _READERS:
        return None
    old, new = _sections(name, before), _sections(name, after)
    if new is None:
        if old:
            return f"{name}: no longer parses, and it had {', '.join(sorted(old))}"
        return None
    old = old or {}
    changed = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
    if not changed:
        return None
    return f"{name}: {', '.join(changed)} changed (test-runner configuration)"


def decide(
    changes: Sequence[Change],
    *,
    test_patterns: Sequence[str],
    shadows_created: set[str],
    configs_before: Mapping[str, bytes | None],
    configs_after: Mapping[str, bytes | None],
) -> list[tuple[Change, str]]:
    """The changes to drop, each with its reason, in the order given.

    ``shadows_created`` are the leading paths (see :func:`shadow_candidates`) the snapshot
    did not have; ``configs_before``/``configs_after`` the contents of the changed
    :data:`CONFIG_FILES`.
    """
    dropped = []
    for change in changes:
        reason = _reason(change, test_patterns, shadows_created, configs_before, configs_after)
        if reason:
            dropped.append((change, reason))
    return dropped


def _reason(
    change: Change,
    test_patterns: Sequence[str],
    shadows_created: set[str],
    configs_before: Mapping[str, bytes | None],
    configs_after: Mapping[str, bytes | None],
) -> str | None:
    path = change.path
    reason = infra_reason(path)
    if reason:
        return reason
    if test_patterns and is_protected(path, test_patterns):
        return "a test path of the task"
    if any(candidate in shadows_created for candidate in shadow_candidates(path)):
        return SHADOW_REASON
    if path.rsplit("/", 1)[-1] in _READERS:
        if change.symlink:
            return f"{path.rsplit('/', 1)[-1]}: a symlink in place of a config file"
        return config_change(path, configs_before.get(path), configs_after.get(path))
    return None

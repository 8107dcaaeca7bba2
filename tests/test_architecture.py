"""The package layout: layers, import arrows and module sizes, read from the source.

docs/architecture.md draws the layers; this test holds the code to that picture. Every
``import`` in src/agentrl counts, including those inside functions and under
``TYPE_CHECKING``: a lazy import is still an arrow a reader has to follow.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "agentrl"

#: Bottom to top. A module may import its own package's modules and anything on a lower
#: floor; nothing on its own floor in another package, nothing above. A module stands on
#: the floor of its longest matching prefix (so ``agentrl.engines.base``, a contract, is
#: below ``agentrl.plugins``, and ``agentrl.engines.sglang`` above it).
FLOORS: tuple[tuple[str, ...], ...] = (
    (
        "agentrl.types",
        "agentrl.hookspecs",
        "agentrl.extras",
        "agentrl.plugin_options",
        "agentrl.settings",
        "agentrl.version",
        "agentrl.retry",
        "agentrl.jsonio",
        "agentrl.wording",
    ),
    ("agentrl.trajectory", "agentrl.tokenizers", "agentrl.settings_doc"),
    (
        "agentrl.engines.base",
        "agentrl.parsers.base",
        "agentrl.sandboxes.base",
        "agentrl.sandboxes.boot",
        "agentrl.sandboxes.exec",
        "agentrl.sandboxes.images",
    ),
    (
        "agentrl.harnesses.base",
        "agentrl.harnesses.errors",
        "agentrl.harnesses.options",
        "agentrl.graders.base",
        "agentrl.adapters.base",
        "agentrl.adapters.wire_ids",
    ),
    ("agentrl.plugins",),
    ("agentrl.engines", "agentrl.parsers", "agentrl.observers"),
    ("agentrl.prompts", "agentrl.sandboxes"),
    ("agentrl.serve",),
    ("agentrl.adapters", "agentrl.harnesses", "agentrl.graders"),
    ("agentrl.rollout", "agentrl.preflight"),
    ("agentrl.view",),
    ("agentrl.slime", "agentrl.verl", "agentrl.trl", "agentrl.cli"),
    ("agentrl.testing",),
    ("agentrl",),
)

MAX_LINES = 500


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor(module: str) -> int:
    """The floor ``module`` stands on (its longest matching prefix in ``FLOORS``)."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    assert best is not None, f"{module} is on no floor of FLOORS"
    return best[1]


def package_of(module: str) -> str:
    """The package a module belongs to: ``agentrl.X`` for anything under ``agentrl/X``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """The agentrl modules ``module`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, path.name == "__init__.py")
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [sub for sub in subs if sub in MODULES] or [base]
            if len(names) < len(subs) and base not in names:
                names.append(base)
        else:
            continue
        for name in names:
            target = _known(name) if name.startswith("agentrl") else None
            if target and target != module:
                found.add(target)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def test_every_module_stands_on_a_floor():
    """A new module must be placed in FLOORS (and in docs/architecture.md's picture)."""
    for module in MODULES:
        floor(module)


def test_no_top_level_private_module():
    """Each package owns its privates: no ``agentrl/_x.py`` beside the public modules."""
    entry_points = {"__init__.py", "__main__.py"}
    assert [p.name for p in PACKAGE.glob("_*.py") if p.name not in entry_points] == []


def _upward(module: str, target: str) -> bool:
    if package_of(module) == package_of(target) and module != "agentrl":
        return False
    return floor(target) >= floor(module)


def test_no_arrow_runs_up_or_sideways():
    """Across packages, every import points to a strictly lower floor."""
    wrong = sorted(
        f"{module} (floor {floor(module)}) -> {target} (floor {floor(target)})"
        for module, targets in GRAPH.items()
        for target in targets
        if _upward(module, target)
    )
    assert wrong == []


def test_internal_code_does_not_import_the_public_face():
    """Only users import from ``agentrl`` itself; the code imports where a name is defined."""
    assert sorted(m for m, targets in GRAPH.items() if "agentrl" in targets) == []


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(GRAPH[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return found


def test_no_import_circle():
    """No set of modules imports itself round, even through a package's ``__init__``."""
    assert _cycles() == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    """A module a reader can hold in mind: at most ~500 lines."""
    lines = MODULES[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


def test_cycle_and_floor_checks_can_fail():
    """The checks above see a circle and an upward arrow when there is one."""
    saved = dict(GRAPH)
    try:
        GRAPH["agentrl.types"] = {"agentrl.trajectory.tokens"}
        GRAPH["agentrl.trajectory.tokens"] = {"agentrl.types"}
        assert ["agentrl.trajectory.tokens", "agentrl.types"] in _cycles()
        assert _upward("agentrl.types", "agentrl.trajectory.tokens")
        assert not _upward("agentrl.trajectory.tokens", "agentrl.types")
        assert _upward("agentrl.engines.sglang", "agentrl.sandboxes.local")
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_architecture_doc_names_every_package():
    """docs/architecture.md has a paragraph for every package and top-level module."""
    text = (SRC.parent / "docs" / "architecture.md").read_text()
    tops = {".".join(m.split(".")[:2]) for m in MODULES if m != "agentrl"}
    missing = sorted(t for t in tops if not re.search(rf"`{re.escape(t.split('.')[1])}[/`.]", text))
    assert missing == []

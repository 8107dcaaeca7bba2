"""Every hook is documented with its signature in docs/plugins.md and has a test."""

from __future__ import annotations

import inspect
import pathlib

import pytest

from agentrl import hookspecs

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOOKS = sorted(
    name for name, obj in vars(hookspecs).items() if callable(obj) and hasattr(obj, "agentrl_spec")
)


def test_hookspecs_found():
    """The spec module is read correctly (guards the tests below against passing vacuously)."""
    assert "register_sandboxes" in HOOKS
    assert "on_turn_recorded" in HOOKS
    assert len(HOOKS) == 9


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_signature_documented(hook):
    """docs/plugins.md has a heading with the hook's exact signature."""
    params = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
    docs = (ROOT / "docs" / "plugins.md").read_text()
    assert f"### `{hook}({params})`" in docs


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    """Some test module defines test_hook_<name> for every hook."""
    pattern = f"def test_hook_{hook}("
    sources = (p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    assert any(pattern in text for text in sources), f"no test named test_hook_{hook}"

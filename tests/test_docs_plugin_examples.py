"""The plugin examples in docs/*.md can be copied as they are.

A documented example plugin that registers a name a built-in already has fails at start-up
("registered twice") the moment a reader installs it; this keeps the examples clear of the
built-ins' names as built-ins are added.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentrl import plugins

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: The base class an example subclasses → the plugin kind it registers as.
KIND_OF_BASE = {
    "Sandbox": "sandbox",
    "Engine": "engine",
    "Harness": "harness",
    "Grader": "grader",
    "Adapter": "adapter",
    "ToolCallParser": "tool_parser",
    "ReasoningParser": "reasoning_parser",
}

_CLASS = re.compile(r'^class \w+\((\w+)\):\n(?:    .*\n)*?    name = "([^"]+)"', re.MULTILINE)


def _registered_examples() -> list[tuple[str, str, str]]:
    """(doc file, kind, name) for each class a Python block of the docs registers."""
    found = []
    for doc in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.DOTALL):
            if "register(" not in block:
                continue
            for base, name in _CLASS.findall(block):
                if base in KIND_OF_BASE:
                    found.append((doc.name, KIND_OF_BASE[base], name))
    return found


def test_documented_example_plugins_do_not_take_a_built_in_name():
    """Every example plugin class in the docs registers a name no built-in of its kind has
    (docs/plugins.md's example sandbox was once named ``docker``, a built-in since)."""
    builtins = plugins.PluginRegistry(load_entrypoints=False, disabled=())
    examples = _registered_examples()
    assert any(doc == "plugins.md" for doc, _, _ in examples), examples
    clashes = [
        (doc, kind, name) for doc, kind, name in examples if name in builtins.available(kind)
    ]
    assert not clashes, f"example plugins named like a built-in: {clashes}"

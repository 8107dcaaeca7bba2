"""The plugin manager: built-ins and third-party plugins, registered the same way.

Core code never calls ``pm.hook.*`` directly; it asks this module for typed things
(``get_sandbox("local")``) and gets either the class or an error that lists the choices.

An entry-point plugin whose module fails to import is recorded and warned about, not
raised: every command that does not need it keeps working, ``agentrl plugins`` lists it
with its error, and a lookup of a name it might have provided says it failed to load.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

from agentrl.plugins.registry import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    KIND_HOOKS,
    KINDS,
    KNOWN_EXTRAS,
    NotAvailableError,
    PluginError,
    PluginInfo,
    PluginLoadFailure,
    PluginRegistry,
    _entry_point_name,  # noqa: F401  (tests name plugins the way the registry does)
    disabled_plugins,
)

if TYPE_CHECKING:
    from agentrl.adapters.base import Adapter
    from agentrl.engines.base import Engine
    from agentrl.graders.base import Grader
    from agentrl.harnesses.base import Harness
    from agentrl.parsers.base import ReasoningParser, ToolCallParser
    from agentrl.sandboxes.base import Sandbox

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "KINDS",
    "KIND_HOOKS",
    "KNOWN_EXTRAS",
    "NotAvailableError",
    "PluginError",
    "PluginInfo",
    "PluginLoadFailure",
    "PluginRegistry",
    "available",
    "disabled_plugins",
    "get_adapter",
    "get_engine",
    "get_grader",
    "get_graders",
    "get_harness",
    "get_reasoning_parser",
    "get_registry",
    "get_sandbox",
    "get_tool_parser",
    "notify",
    "reset_registry",
]

_registry: PluginRegistry | None = None
_registry_lock = threading.Lock()


def get_registry() -> PluginRegistry:
    """The process-wide registry, built on first use (never at import time)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = PluginRegistry()
        return _registry


def reset_registry(registry: PluginRegistry | None = None) -> PluginRegistry | None:
    """Replace (or drop, with ``None``) the process-wide registry and return the one it held.

    For tests and embedders: ``previous = reset_registry(mine)`` … ``reset_registry(previous)``.
    """
    global _registry
    with _registry_lock:
        previous, _registry = _registry, registry
    return previous


def available(kind: str) -> list[str]:
    return get_registry().available(kind)


def get_engine(name: str) -> type[Engine]:
    """The engine class registered as ``name`` (``NotAvailableError`` lists the choices)."""
    return cast("type[Engine]", get_registry().get("engine", name))


def get_adapter(name: str) -> type[Adapter]:
    """The wire-protocol adapter class registered as ``name``."""
    return cast("type[Adapter]", get_registry().get("adapter", name))


def get_sandbox(name: str) -> type[Sandbox]:
    """The sandbox backend class registered as ``name``."""
    return cast("type[Sandbox]", get_registry().get("sandbox", name))


def get_harness(name: str) -> type[Harness]:
    """The agent harness class registered as ``name``."""
    return cast("type[Harness]", get_registry().get("harness", name))


def get_grader(name: str) -> type[Grader]:
    """The grader class registered as ``name``."""
    return cast("type[Grader]", get_registry().get("grader", name))


def get_graders() -> list[type[Grader]]:
    """Every registered grader class, plugins' before the built-ins (the order hooks run in)."""
    return cast("list[type[Grader]]", get_registry().registered("grader"))


def get_tool_parser(name: str) -> type[ToolCallParser]:
    """The tool-call parser ``name``: registered, or SGLang's (``PluginRegistry.get_parser``).

    A name that is not registered resolves to the built-in proven identical to SGLang's
    parser of that name, else to SGLang's own (``sglang:<name>``) when SGLang imports.
    """
    return cast("type[ToolCallParser]", get_registry().get_parser("tool_parser", name))


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The reasoning parser ``name``, resolved like :func:`get_tool_parser`."""
    return cast("type[ReasoningParser]", get_registry().get_parser("reasoning_parser", name))


def notify(hook_name: str, event: Any) -> None:
    """Send an event to every observer of a hook; see :meth:`PluginRegistry.notify`."""
    get_registry().notify(hook_name, event)

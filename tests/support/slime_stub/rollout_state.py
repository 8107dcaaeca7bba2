"""Stand-in for slime's per-process rollout state, ``slime.rollout.sglang_rollout.GenerateState``.

Written from the contract (SLIME_CONTRACT §7): slime keeps one ``GenerateState`` per process
through a singleton metaclass that stores instances in its ``_instances`` dict, and its
abort sets ``aborted`` on that instance. ``agentrl.slime`` reads the flag without creating
the state, so the stand-in reproduces exactly that shape.
"""

from __future__ import annotations

import sys
import types
import typing

__all__ = ["install_generate_state"]

MODULE = "slime.rollout.sglang_rollout"


def install_generate_state(monkeypatch: typing.Any) -> type:
    """Put a fresh ``GenerateState`` class in ``sys.modules[MODULE]`` for one test."""

    class SingletonMeta(type):
        _instances: typing.ClassVar[dict] = {}

        def __call__(cls, *a, **k):
            if cls not in cls._instances:
                cls._instances[cls] = super().__call__(*a, **k)
            return cls._instances[cls]

    class GenerateState(metaclass=SingletonMeta):
        """slime's per-process rollout state: the flag its abort sets."""

        def __init__(self, args: typing.Any) -> None:
            self.aborted = False

    module = types.ModuleType(MODULE)
    module.GenerateState = GenerateState
    monkeypatch.setitem(sys.modules, MODULE, module)
    return GenerateState

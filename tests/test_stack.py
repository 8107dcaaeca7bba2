"""The rollout stack: option checks and shutdown."""

from __future__ import annotations

import pathlib
import tempfile

import pytest

from agentrl.stack import Stack, StackError, StackOptions, merge_sandbox_options


def test_impossible_options_fail_before_anything_starts():
    """Each combination that cannot work names the flag to pass."""
    with pytest.raises(StackError, match="--engine sglang needs --engine-url"):
        Stack(StackOptions(tokenizer="/tok"))
    with pytest.raises(StackError, match="--engine transformers needs --model-path"):
        Stack(StackOptions(engine="transformers", tokenizer="/tok"))
    with pytest.raises(StackError, match="--public-host"):
        Stack(StackOptions(sandbox="e2b", engine_url="http://e", tokenizer="/tok"))


def test_merge_unions_mapping_options():
    """Mapping-valued sandbox options (binds, env) are unioned; other values are replaced."""
    merged = merge_sandbox_options(
        {"ro_binds": {"/a": "/a"}, "env": {"X": "1"}, "memory": 1},
        {"ro_binds": {"/b": "/b"}, "env": {"X": "2"}, "memory": 2},
    )
    assert merged == {"ro_binds": {"/a": "/a", "/b": "/b"}, "env": {"X": "2"}, "memory": 2}


def _exists(path: str) -> bool:
    return pathlib.Path(path).exists()


async def test_aclose_closes_everything_even_when_a_step_fails():
    """A middleware that fails to close still lets the engine close and the socket dir go."""
    closed = []

    class Middleware:
        async def close(self):
            closed.append("middleware")
            raise RuntimeError("close failed")

    class Engine:
        async def aclose(self):
            closed.append("engine")

    stack = Stack(StackOptions(engine_url="http://127.0.0.1:9", tokenizer="/tok"))
    stack.middleware, stack.engine = Middleware(), Engine()
    stack._tmp = tempfile.TemporaryDirectory(prefix="agentrl-test-")
    socket_dir = stack._tmp.name
    with pytest.raises(RuntimeError, match="close failed"):
        await stack.aclose()
    assert closed == ["middleware", "engine"]
    assert not _exists(socket_dir)
    await stack.aclose()  # idempotent: nothing left to close
    assert closed == ["middleware", "engine"]

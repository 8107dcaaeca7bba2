"""Fixtures for the middleware tests (load with ``pytest_plugins = ("middleware_fixtures",)``)."""

from __future__ import annotations

import pytest

from middleware_support import started_middleware


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
    async with started_middleware(
        sglang_client, qwen_tokenizer, max_body_bytes=4 * 1024 * 1024
    ) as mw:
        yield mw


@pytest.fixture
async def http():
    """A plain aiohttp client session (no proxies from the environment)."""
    import aiohttp

    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session

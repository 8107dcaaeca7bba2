"""Fixtures for the middleware tests (load with ``pytest_plugins = ("middleware_fixtures",)``)."""

from __future__ import annotations

import pytest

from agentrl.testing.stack import started_middleware


@pytest.fixture
def sglang_client(agentrl_sglang_engine):
    """The plugin's ``agentrl_sglang_engine``: the real ``sglang`` client on the scripted server."""
    return agentrl_sglang_engine


@pytest.fixture
def prompt_mode():
    """The ``middleware`` fixture's prompt mode (parametrize ``prompt_mode`` to change it)."""
    return "splice"


@pytest.fixture
async def middleware(qwen_tokenizer, sglang_client, prompt_mode):
    """A started middleware on 127.0.0.1:0 with all three adapters and Qwen3's parsers,
    taking bodies up to 4 MiB (not the default 64 MiB, so the oversized-body test stays small)."""
    async with started_middleware(
        sglang_client, qwen_tokenizer, max_body_bytes=4 * 1024 * 1024, prompt_mode=prompt_mode
    ) as mw:
        yield mw


@pytest.fixture
async def http():
    """A plain aiohttp client session (no proxies from the environment)."""
    import aiohttp

    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session

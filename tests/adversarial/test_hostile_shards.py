"""Hostile clients against the sharded middleware's front."""

from __future__ import annotations

import json

import aiohttp
import pytest
from shard_support import recipe, scripted

from agentrl.serve.shards import ShardedMiddleware


@pytest.mark.slow
async def test_two_tokens_in_one_request_are_read_as_the_middleware_reads_them(
    agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir
):
    """Attack: a closed session's Bearer token beside an open session's x-api-key (and two
    open sessions' tokens at once), hoping the front and the worker disagree on whose turn
    it is. Bound: the turn is served as the session the in-process middleware would pick
    (the first open token, Bearer before x-api-key), by that session's worker, and
    recorded in that session only."""
    async with scripted(agentrl_qwen_tokenizer) as engine:
        sm = ShardedMiddleware(workers=2, build=recipe(engine.url, agentrl_qwen_tokenizer_dir))
        await sm.start()
        try:
            tokens = {sid: sm.open_session(sid) for sid in ("closed", "a", "b")}
            assert len({sm.session(s).worker for s in ("a", "b")}) == 2
            await sm.finish_session("closed", reward=0.0)
            body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
            cases = [
                ({"Authorization": f"Bearer {tokens['closed']}", "x-api-key": tokens["a"]}, "a"),
                ({"Authorization": f"Bearer {tokens['b']}", "x-api-key": tokens["a"]}, "b"),
            ]
            async with aiohttp.ClientSession() as http:
                for headers, owner in cases:
                    async with http.post(f"{sm.url}/v1/messages", json=body, headers=headers) as r:
                        assert r.status == 200, await r.text()
                        assert int(r.headers["X-Agentrl-Worker"]) == sm.session(owner).worker
                        json.loads(await r.text())
            assert (await sm.settle("a")).turns_recorded == 1
            assert (await sm.settle("b")).turns_recorded == 1
        finally:
            await sm.close()

"""What a turn keeps alive while the engine generates (the collector's young objects)."""

from __future__ import annotations

import gc
import json

pytest_plugins = ("middleware_fixtures",)

TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]


def _bash_call_messages() -> list[dict]:
    """Every chat-format assistant message alive that calls this test's Bash tool."""
    return [
        o
        for o in gc.get_objects()
        if type(o) is dict
        and o.get("role") == "assistant"
        and isinstance(o.get("tool_calls"), list)
        and any(c.get("function", {}).get("name") == "Bash" for c in o["tool_calls"])
    ]


async def test_a_spliced_turn_lets_the_requests_replayed_messages_go_before_the_engine_call(
    middleware, scripted_engine, http, monkeypatch
):
    """While a spliced turn waits for the engine, the only translated assistant message
    alive is the one the session recorded: the request's own copy of the replayed message
    (held by the handler, the pipeline or the splice plan before) is already gone."""
    token = middleware.open_session("held")
    headers = {"Authorization": f"Bearer {token}"}
    first_messages = [{"role": "user", "content": "list files"}]
    body = {"model": "policy", "max_tokens": 64, "tools": TOOLS, "messages": first_messages}
    scripted_engine.queue(
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    async with http.post(middleware.url + "/v1/messages", json=body, headers=headers) as r:
        assert r.status == 200
        reply = json.loads(await r.text())
    call = reply["content"][-1]
    history = [
        *first_messages,
        {"role": "assistant", "content": reply["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "a"}],
        },
    ]
    seen: list[list[dict]] = []
    generate = middleware.engine.generate

    async def watched(*args, **kwargs):
        seen.append(_bash_call_messages())
        return await generate(*args, **kwargs)

    monkeypatch.setattr(middleware.engine, "generate", watched)
    scripted_engine.queue("done")
    async with http.post(
        middleware.url + "/v1/messages", json={**body, "messages": history}, headers=headers
    ) as r:
        assert r.status == 200
    (alive,) = seen
    recorded = middleware.session("held").responses[0]
    assert alive and all(o is recorded for o in alive)
    samples = await middleware.finish_session("held", reward=1.0)
    metadata = samples[0].metadata["turn_metadata"]
    assert [m.get("spliced_on_turn") for m in metadata.values()] == [None, 0]

"""Helpers for the sharded-middleware tests: a scripted engine, a recipe, real HTTP turns."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from agentrl.serve.recipe import MiddlewareRecipe
from agentrl.testing.scripted_engine import ScriptedEngine, ScriptedReply


def reply_for(body: Any, headers: Any) -> ScriptedReply:
    """The scripted policy: a reply that depends only on the prompt's length."""
    return ScriptedReply(text=f"Reply to a prompt of {len(body['input_ids'])} tokens.")


@contextlib.asynccontextmanager
async def scripted(tokenizer: Any, **kwargs: Any) -> AsyncIterator[ScriptedEngine]:
    """A started scripted SGLang server answering every request with :func:`reply_for`."""
    engine = ScriptedEngine(tokenizer, responder=kwargs.pop("responder", reply_for), **kwargs)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def recipe(engine_url: str, tokenizer_dir: Any) -> MiddlewareRecipe:
    """The middleware every worker builds: the sglang client, Qwen3's parsers."""
    return MiddlewareRecipe(
        engine="sglang",
        engine_url=engine_url,
        tokenizer=str(tokenizer_dir),
        tool_parser="hermes",
        reasoning_parser="qwen3",
    )


def failing_build() -> Any:
    """A build that fails in the worker (its error must reach ``start()``)."""
    raise ValueError("this middleware cannot be built")


async def turn(
    http: aiohttp.ClientSession, url: str, token: str, messages: list[dict], *, stream: bool = False
) -> tuple[int, dict[str, str], str]:
    """One Anthropic Messages call: status, headers and body text."""
    body = {"model": "policy", "max_tokens": 64, "messages": messages, "stream": stream}
    async with http.post(f"{url}/v1/messages", json=body, headers={"x-api-key": token}) as r:
        return r.status, dict(r.headers), await r.text()


async def conversation(
    http: aiohttp.ClientSession, url: str, token: str, sid: str, turns: int = 2
) -> list[str]:
    """``turns`` turns of one session, each replaying the last reply; the serving pids."""
    messages: list[dict] = [{"role": "user", "content": f"Hello from {sid}."}]
    pids = []
    for index in range(turns):
        status, headers, text = await turn(http, url, token, messages)
        assert status == 200, text
        pids.append(headers.get("X-Agentrl-Worker-Pid", "in-process"))
        reply = json.loads(text)["content"][0]["text"]
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"Turn {index + 1} of {sid}: go on."},
        ]
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie, not reaped) process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def child_pids() -> set[int]:
    """This process's live children (but multiprocessing's resource tracker, which the first
    ``spawn`` starts and which lives as long as this process)."""
    me = str(os.getpid())
    children = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().split(")")[-1].split()
                if fields[1] == me and fields[0] != "Z":
                    with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                        if b"resource_tracker" not in cmdline.read():
                            children.add(int(entry))
    return children

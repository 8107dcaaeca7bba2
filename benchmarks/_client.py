"""One Claude-Code-shaped client session: its requests, its replies, its history edits.

A :class:`ClientSession` builds each request (Claude Code 2.1.332's real system prompt and
tools, from the captured fixtures, growing by one tool result a turn), reads the reply
whole or as Claude Code reads it (``stream=True``: the Anthropic SSE events, put back
together into the message), and answers its tool call with a file. Its clock runs only
around the HTTP exchange (first byte written to last byte read): encoding the body,
parsing the SSE and building the next request are the client's own work, and that is
reported as the load generator's CPU, never charged to the middleware.

History edits (``edits``, one every ``edit_every`` turns, in turn) are what real agents
send and what an append-only session never shows:

- ``reminder``: a ``<system-reminder>`` block inserted into an earlier user message
  (Claude Code attaches reminders to messages already sent);
- ``rewrite``: the oldest tool result still whole is replaced by
  ``[Old tool result content cleared]`` (Claude Code's micro-compaction);
- ``tools``: the tool list changes (an MCP server's tool appears).

Each is a history the splicer cannot extend, so the middleware falls back to a full
render there: those turns measure the fallback.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from agentrl import jsonio

REPO = Path(__file__).resolve().parents[1]
FIXTURE = (
    REPO.parent / "shared" / "fixtures" / "clients" / "claude_code" / "001_post_v1_messages.json"
)
#: Lines of code-like tool output per ~1.75k tokens.
LINES_PER_1750 = 120
EDITS = ("reminder", "rewrite", "tools")
CLEARED = "[Old tool result content cleared]"


@functools.cache
def _fixture_body() -> str:
    if not FIXTURE.is_file():
        sys.exit(f"captured Claude Code request not found at {FIXTURE} (shared/ beside the clone)")
    return json.dumps(json.loads(FIXTURE.read_text())["body"])


def base_body(stream: bool = False) -> dict[str, Any]:
    """Claude Code 2.1.332's first request (its real system prompt and tools)."""
    return {**json.loads(_fixture_body()), "stream": stream}


def source_file(index: int, lines: int = LINES_PER_1750) -> str:
    """Code-like tool output, about 14.6 tokens a line, different for every index."""
    out = [f'"""Module {index}: helpers for the data pipeline."""', "", "import os", ""]
    for i in range(lines // 6):
        name = f"handle_{index}_{i}"
        out += [
            f"def {name}(record, limit={i + index % 7}):",
            f"    # step {i}: normalise field_{i} and check bounds",
            f"    value = record.get('field_{i}', {i * index % 97})",
            "    if value > limit:",
            f"        raise ValueError(f'{name}: {{value}} exceeds {{limit}}')",
            f"    return os.path.join('out', str(value), '{name}.json')",
        ]
    return "\n".join(out)


def read_sse(raw: bytes) -> dict[str, Any]:
    """The Anthropic message an SSE stream carries, put back together as a client does."""
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    for chunk in raw.split(b"\n\n"):
        data = next((line[5:] for line in chunk.split(b"\n") if line.startswith(b"data:")), None)
        if data is None:
            continue
        event = jsonio.loads(data)
        kind = event["type"]
        if kind == "message_start":
            message = event["message"]
        elif kind == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "input_json_delta":
                partial.setdefault(event["index"], []).append(delta["partial_json"])
            elif delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"] = {**message.get("usage", {}), **event.get("usage", {})}
        elif kind == "error":
            raise RuntimeError(f"middleware streamed an error: {event}")
    for index, pieces in partial.items():
        blocks[index]["input"] = json.loads("".join(pieces))
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


class ClientSession:
    """A Claude-Code-like client: replays each reply, answers its tool call with a file."""

    def __init__(
        self,
        token: str,
        *,
        stream: bool = False,
        lines: int = LINES_PER_1750,
        edits: tuple[str, ...] = (),
        edit_every: int = 0,
    ) -> None:
        self.body = base_body(stream)
        self.messages = list(self.body.pop("messages"))
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.stream, self.lines = stream, lines
        self.edits, self.edit_every = edits, edit_every
        self.turn = 0
        self.edited: str | None = None  # the edit the latest request carried
        self.prompt_tokens = 0

    def next_request(self) -> bytes:
        """The next request's body, with a history edit where one is due."""
        self.turn += 1
        self.edited = None
        if self.edits and self.edit_every and self.turn > 1 and self.turn % self.edit_every == 0:
            kind = self.edits[(self.turn // self.edit_every - 1) % len(self.edits)]
            if getattr(self, f"_edit_{kind}")():
                self.edited = kind
        return jsonio.dumps({**self.body, "messages": self.messages})

    def take_reply(self, raw: bytes, status: int) -> dict[str, Any]:
        """Read the reply (whole or streamed) and answer its tool call."""
        if status != 200:
            raise RuntimeError(f"middleware answered {status}: {raw[:500]!r}")
        reply = read_sse(raw) if self.stream else jsonio.loads(raw)
        self.prompt_tokens = reply["usage"]["input_tokens"]
        call = next(b for b in reply["content"] if b["type"] == "tool_use")
        result = {
            "type": "tool_result",
            "tool_use_id": call["id"],
            "content": source_file(self.turn, self.lines),
        }
        self.messages += [
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": [result]},
        ]
        return reply

    async def exchange(self, http, url: str) -> tuple[float, int, str | None]:
        """One turn over ``http``: (seconds on the wire, prompt tokens, edit or None)."""
        import time

        data = self.next_request()
        started = time.perf_counter()
        async with http.post(f"{url}/v1/messages", data=data, headers=self.headers) as r:
            raw = await r.read()
            status = r.status
        latency = time.perf_counter() - started
        self.take_reply(raw, status)
        return latency, self.prompt_tokens, self.edited

    # -- history edits --------------------------------------------------------------------

    def _edit_reminder(self) -> bool:
        earlier = [m for m in self.messages[:-2] if m["role"] == "user"]
        if len(earlier) < 2:
            return False
        target = earlier[-1]
        reminder = f"<system-reminder>\nTodo list changed at turn {self.turn}.\n</system-reminder>"
        target["content"] = [{"type": "text", "text": reminder}, *target["content"]]
        return True

    def _edit_rewrite(self) -> bool:
        for message in self.messages[:-2]:
            for block in message["content"] if message["role"] == "user" else ():
                if block.get("type") == "tool_result" and block["content"] != CLEARED:
                    block["content"] = CLEARED
                    return True
        return False

    def _edit_tools(self) -> bool:
        tool = {
            "name": f"mcp__docs__lookup_{self.turn}",
            "description": "Look a symbol up in the project's documentation.",
            "input_schema": {
                "type": "object",
                "properties": {"symbol": {"type": "string"}},
                "required": ["symbol"],
            },
        }
        self.body["tools"] = [*self.body["tools"], tool]
        return True

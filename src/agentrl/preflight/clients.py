"""Scripted wire clients: requests shaped like Claude Code's and Codex's traffic.

Each client keeps its conversation in its own wire form and does what the real CLI does
between turns: replay the assistant reply as it received it (thinking blocks with their
signatures, reasoning items with ``encrypted_content``, tool-call ids), send tool results
and new user text, and open a sub-agent conversation with its own system prompt, tools
and headers. The shapes follow the captured traffic of Claude Code 2.1.332 (Anthropic
Messages, streamed) and Codex 0.171 (OpenAI Responses, streamed, ``store: false``),
trimmed to a short system prompt. :data:`CLIENTS` maps a protocol to its client.
"""

from __future__ import annotations

import abc
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from agentrl.preflight.scenarios import TOOLS

__all__ = [
    "CLIENTS",
    "AnthropicClient",
    "Conversation",
    "ParsedCall",
    "Reply",
    "ResponsesClient",
    "WireClient",
    "parse_sse",
]

_SYSTEM_MAIN = (
    "You are an agent working with the user on software engineering tasks in their "
    "repository. Use the tools to inspect and change files; keep answers short."
)
_SYSTEM_SUB = (
    "You are a sub-agent. Do exactly the task you were given with the tools you have, "
    "then report what you found in a few sentences."
)
_CONTEXT = (
    "<system-reminder>\nWorking directory: /workspace/repo\nPlatform: linux\n</system-reminder>"
)


@attrs.frozen(kw_only=True)
class ParsedCall:
    """A tool call as the client received it."""

    call_id: str
    name: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class Reply:
    """One reply as the client understood it, and what it replays of it."""

    reasoning: str | None
    text: str
    calls: tuple[ParsedCall, ...]
    finish: str
    replay: tuple[dict[str, Any], ...]


@attrs.define(kw_only=True)
class Conversation:
    """One conversation of a session (the main agent's or a sub-agent's), in wire form."""

    subagent: bool
    thread_id: str
    items: list[dict[str, Any]] = attrs.field(factory=list)


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    """``(event, data)`` pairs of a server-sent event stream."""
    events = []
    for chunk in text.replace("\r\n", "\n").split("\n\n"):
        event, data = None, []
        for line in chunk.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if data:
            payload = "\n".join(data)
            events.append((event, payload if payload == "[DONE]" else json.loads(payload)))
    return events


def _schema_order(tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` with their keys in the tool schema's property order (unknown keys last)."""
    order = list(TOOLS[tool][1]["properties"]) if tool in TOOLS else []
    known = {k: arguments[k] for k in order if k in arguments}
    return {**known, **{k: v for k, v in arguments.items() if k not in known}}


class WireClient(abc.ABC):
    """A scripted agent client of one wire protocol."""

    protocol: ClassVar[str]
    #: The URL path its turns are posted to.
    path: ClassVar[str]
    #: Neutral tool name (:data:`~agentrl.preflight.scenarios.TOOLS`) -> its name here.
    tool_names: ClassVar[Mapping[str, str]]

    def __init__(self) -> None:
        self.session_id = str(uuid.uuid4())
        self._neutral = {v: k for k, v in self.tool_names.items()}

    def neutral_tool(self, name: str) -> str:
        """The neutral name of the tool this client offers as ``name``."""
        return self._neutral.get(name, name)

    def tools_for(self, subagent: bool) -> list[str]:
        """Neutral names of the tools a conversation offers (a sub-agent cannot spawn one)."""
        return [name for name in TOOLS if not (subagent and name == "agent")]

    @abc.abstractmethod
    def new_conversation(self, prompt: str, *, subagent: bool) -> Conversation:
        """A conversation whose first request carries ``prompt``."""

    @abc.abstractmethod
    def body(self, conversation: Conversation) -> dict[str, Any]:
        """The next request's JSON body."""

    @abc.abstractmethod
    def headers(self, token: str, conversation: Conversation) -> dict[str, str]:
        """The next request's headers, authenticated with the session ``token``."""

    @abc.abstractmethod
    def parse_reply(self, text: str) -> Reply:
        """The streamed reply's text, reasoning, calls and what the client replays."""

    @abc.abstractmethod
    def add_reply(self, conversation: Conversation, reply: Reply, *, reorder_keys: bool) -> None:
        """Append the reply as the client replays it (tool input keys re-ordered if asked)."""

    @abc.abstractmethod
    def add_results(
        self,
        conversation: Conversation,
        results: Sequence[tuple[ParsedCall, str]],
        user_text: str | None,
    ) -> None:
        """Append the tool results and new user text of the next request."""


def _named(shell: str, read: str, write: str, agent: str) -> dict[str, str]:
    """A client's own names of the scenarios' neutral tools."""
    return {"shell": shell, "read": read, "write": write, "agent": agent}


class AnthropicClient(WireClient):
    """Claude Code 2.1.332 on Anthropic Messages (``/v1/messages?beta=true``, streamed)."""

    protocol = "anthropic"
    path = "/v1/messages?beta=true"
    tool_names: ClassVar[Mapping[str, str]] = _named("Bash", "Read", "Write", "Agent")

    def new_conversation(self, prompt: str, *, subagent: bool) -> Conversation:
        content = [{"type": "text", "text": _CONTEXT}, {"type": "text", "text": prompt}]
        return Conversation(
            subagent=subagent,
            thread_id=uuid.uuid4().hex[:17],
            items=[{"role": "user", "content": content}],
        )

    def body(self, conversation: Conversation) -> dict[str, Any]:
        messages = json.loads(json.dumps(conversation.items))
        # Claude Code marks only the newest block for prompt caching.
        last = messages[-1]["content"]
        if isinstance(last, list) and last:
            last[-1]["cache_control"] = {"type": "ephemeral"}
        billing = "x-anthropic-billing-header: cc_version=2.1.332.fa9; cc_entrypoint=sdk-cli;"
        if conversation.subagent:
            billing += " cc_is_subagent=true;"
        system = [
            {"type": "text", "text": billing},
            {
                "type": "text",
                "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": _SYSTEM_SUB if conversation.subagent else _SYSTEM_MAIN,
                "cache_control": {"type": "ephemeral"},
            },
        ]
        tools = [
            {
                "name": self.tool_names[name],
                "description": TOOLS[name][0],
                "input_schema": TOOLS[name][1],
            }
            for name in self.tools_for(conversation.subagent)
        ]
        user_id = {"device_id": "0" * 64, "account_uuid": "", "session_id": self.session_id}
        return {
            "model": "claude-opus-5-5",
            "messages": messages,
            "system": system,
            "tools": tools,
            "metadata": {"user_id": json.dumps(user_id)},
            "max_tokens": 32000,
            "thinking": {"type": "adaptive", "display": "updates"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"},
            "stream": True,
        }

    def headers(self, token: str, conversation: Conversation) -> dict[str, str]:
        headers = {
            "Accept": "application/json",
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "User-Agent": "claude-cli/2.1.332 (external, sdk-cli)",
            "X-Claude-Code-Session-Id": self.session_id,
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
            "anthropic-version": "2023-06-01",
            "x-app": "cli",
        }
        if conversation.subagent:
            headers["x-claude-code-agent-id"] = conversation.thread_id
        return headers

    def parse_reply(self, text: str) -> Reply:
        blocks: dict[int, dict[str, Any]] = {}
        partial: dict[int, str] = {}
        stop_reason = ""
        for name, data in parse_sse(text):
            if name == "content_block_start":
                blocks[data["index"]] = dict(data["content_block"])
            elif name == "content_block_delta":
                block, delta = blocks[data["index"]], data["delta"]
                kind = delta["type"]
                if kind == "text_delta":
                    block["text"] += delta["text"]
                elif kind == "thinking_delta":
                    block["thinking"] += delta["thinking"]
                elif kind == "signature_delta":
                    block["signature"] = delta["signature"]
                elif kind == "input_json_delta":
                    partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
            elif name == "content_block_stop" and data["index"] in partial:
                blocks[data["index"]]["input"] = json.loads(partial.pop(data["index"]))
            elif name == "message_delta":
                stop_reason = data["delta"].get("stop_reason") or stop_reason
        content = [blocks[i] for i in sorted(blocks)]
        thinking = [b["thinking"] for b in content if b["type"] == "thinking"]
        calls = tuple(
            ParsedCall(call_id=b["id"], name=b["name"], arguments=dict(b.get("input") or {}))
            for b in content
            if b["type"] == "tool_use"
        )
        return Reply(
            reasoning="".join(thinking) if thinking else None,
            text="".join(b["text"] for b in content if b["type"] == "text"),
            calls=calls,
            finish=stop_reason,
            replay=tuple(content),
        )

    def add_reply(self, conversation: Conversation, reply: Reply, *, reorder_keys: bool) -> None:
        content = []
        for block in reply.replay:
            if block["type"] == "tool_use" and reorder_keys:
                arguments = _schema_order(self.neutral_tool(block["name"]), block["input"])
                block = {**block, "input": arguments}
            content.append(block)
        conversation.items.append({"role": "assistant", "content": content})

    def add_results(
        self,
        conversation: Conversation,
        results: Sequence[tuple[ParsedCall, str]],
        user_text: str | None,
    ) -> None:
        content: list[dict[str, Any]] = [
            {"tool_use_id": call.call_id, "type": "tool_result", "content": output}
            for call, output in results
        ]
        if user_text is not None:
            content.append({"type": "text", "text": user_text})
        conversation.items.append({"role": "user", "content": content})


class ResponsesClient(WireClient):
    """Codex 0.171 on OpenAI Responses (``/v1/responses``, streamed, ``store: false``)."""

    protocol = "openai_responses"
    path = "/v1/responses"
    tool_names: ClassVar[Mapping[str, str]] = _named(
        "exec_command", "read_file", "write_file", "spawn_agent"
    )

    def new_conversation(self, prompt: str, *, subagent: bool) -> Conversation:
        def message(role: str, text: str) -> dict[str, Any]:
            return {
                "type": "message",
                "id": f"msg_{uuid.uuid4()}",
                "role": role,
                "content": [{"type": "input_text", "text": text}],
            }

        system = _SYSTEM_SUB if subagent else _SYSTEM_MAIN
        items = [
            message("developer", system),
            message(
                "user",
                "<environment_context>\n  <cwd>/workspace/repo</cwd>\n</environment_context>",
            ),
            message("user", prompt),
        ]
        return Conversation(subagent=subagent, thread_id=str(uuid.uuid4()), items=items)

    def body(self, conversation: Conversation) -> dict[str, Any]:
        tools = [
            {
                "type": "function",
                "name": self.tool_names[name],
                "description": TOOLS[name][0],
                "strict": False,
                "parameters": TOOLS[name][1],
            }
            for name in self.tools_for(conversation.subagent)
        ]
        return {
            "model": "stub-model",
            "stream": True,
            "input": json.loads(json.dumps(conversation.items)),
            "tools": tools,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"},
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": self.session_id,
            "client_metadata": {"session_id": self.session_id, "thread_id": conversation.thread_id},
        }

    def headers(self, token: str, conversation: Conversation) -> dict[str, str]:
        headers = {
            "accept": "text/event-stream",
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            "originator": "codex_exec",
            "user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (codex_exec; 0.171.0)",
            "session-id": self.session_id,
            "thread-id": conversation.thread_id,
        }
        if conversation.subagent:
            headers["x-openai-subagent"] = "collab_spawn"
            headers["x-codex-parent-thread-id"] = self.session_id
        return headers

    def parse_reply(self, text: str) -> Reply:
        final: dict[str, Any] = {}
        for name, data in parse_sse(text):
            if name in ("response.completed", "response.incomplete"):
                final = data["response"]
        output = list(final.get("output") or ())
        reasoning = [
            "".join(part.get("text", "") for part in item.get("summary") or ())
            for item in output
            if item["type"] == "reasoning"
        ]
        texts = [
            "".join(part.get("text", "") for part in item.get("content") or ())
            for item in output
            if item["type"] == "message"
        ]
        calls = tuple(
            ParsedCall(
                call_id=item["call_id"],
                name=item["name"],
                arguments=json.loads(item.get("arguments") or "{}"),
            )
            for item in output
            if item["type"] == "function_call"
        )
        return Reply(
            reasoning="".join(reasoning) if reasoning else None,
            text="".join(texts),
            calls=calls,
            finish=str(final.get("status", "")),
            replay=tuple(output),
        )

    def add_reply(self, conversation: Conversation, reply: Reply, *, reorder_keys: bool) -> None:
        for item in reply.replay:
            if item["type"] == "function_call" and reorder_keys:
                arguments = _schema_order(
                    self.neutral_tool(item["name"]), json.loads(item["arguments"])
                )
                item = {**item, "arguments": json.dumps(arguments)}
            conversation.items.append(item)

    def add_results(
        self,
        conversation: Conversation,
        results: Sequence[tuple[ParsedCall, str]],
        user_text: str | None,
    ) -> None:
        for call, output in results:
            conversation.items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": output}
            )
        if user_text is not None:
            conversation.items.append(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": user_text}],
                }
            )


#: Protocol name -> the scripted client that speaks it.
CLIENTS: Mapping[str, type[WireClient]] = {
    AnthropicClient.protocol: AnthropicClient,
    ResponsesClient.protocol: ResponsesClient,
}

"""Shared pieces for the middleware tests: captured client traffic, SSE parsing, helpers.

The middleware builders live in ``agentrl.testing.stack`` (shipped for plugin authors);
they are re-exported here under the names the tests use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# Re-exported: the tests import them from here.
from agentrl.testing.stack import builtin_adapters as all_adapters  # noqa: F401
from agentrl.testing.stack import started_middleware  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "clients"
#: Captures kept in the repository (same format; see its README).
REPO_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "clients"
#: The stub answered with paths under /tmp/clients/runs/<scenario> (or /workspace/runs/);
#: the captured requests replay them as /workspace/<scenario>.
PATH_REWRITES = {"/tmp/clients/runs/": "/workspace/", "/workspace/runs/": "/workspace/"}

PROTOCOL_OF_PATH = {
    "/v1/messages": "anthropic",
    "/v1/responses": "openai_responses",
    "/v1/chat/completions": "openai_chat",
}


def _check(condition: Any, message: Any) -> None:
    # A plain function (not ``assert``): this module is imported before pytest could
    # rewrite it, and the message must survive ``python -O``.
    if not condition:
        raise AssertionError(message)


def require_fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(
            f"captured client traffic not found at {FIXTURES}; the tests expect the shared/ "
            "directory beside the repository clone"
        )
    return FIXTURES


def scenario_dirs() -> list[Path]:
    """Every captured scenario directory (shared and in-repo) that holds at least one request."""
    dirs: set[Path] = set()
    for root in (require_fixtures(), REPO_FIXTURES):
        dirs |= {p.parent for p in root.rglob("[0-9][0-9][0-9]_*.json")}
    return sorted(dirs, key=scenario_id)


def scenario_id(path: Path) -> str:
    """The scenario's path below its fixtures root (``codex/subagent_spawn_agent``)."""
    root = REPO_FIXTURES if path.is_relative_to(REPO_FIXTURES) else FIXTURES
    return str(path.relative_to(root))


def load_requests(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("[0-9][0-9][0-9]_*.json"))]


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    """``(event, data)`` pairs of a server-sent event stream (``[DONE]`` stays a string)."""
    events = []
    for chunk in text.replace("\r\n", "\n").split("\n\n"):
        if not chunk.strip():
            continue
        event, data = None, []
        for line in chunk.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        payload = "\n".join(data)
        events.append((event, payload if payload == "[DONE]" else json.loads(payload)))
    return events


def anthropic_message(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    """Rebuild a Messages reply from its SSE events, checking the event order."""
    names = [e for e, _ in events]
    _check(names[0] == "message_start" and names[-1] == "message_stop", names)
    _check(names[-2] == "message_delta", names)
    message = dict(events[0][1]["message"])
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    open_blocks: set[int] = set()
    for name, data in events[1:-1]:
        if name == "content_block_start":
            _check(data["index"] not in blocks, "block index reused")
            blocks[data["index"]] = dict(data["content_block"])
            open_blocks.add(data["index"])
        elif name == "content_block_delta":
            _check(data["index"] in open_blocks, "delta outside its block")
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif name == "content_block_stop":
            open_blocks.discard(data["index"])
            if data["index"] in partial:
                blocks[data["index"]]["input"] = json.loads(partial.pop(data["index"]))
        elif name == "message_delta":
            message.update(data["delta"])
            message["usage"] = {**message["usage"], **data["usage"]}
    _check(not open_blocks, "blocks left open")
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def responses_object(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    """The final response object of a Responses stream, checking the event order."""
    names = [e for e, _ in events]
    _check(names[0] == "response.created", names)
    _check(names[-1] in ("response.completed", "response.incomplete"), names)
    numbers = [d["sequence_number"] for _, d in events]
    _check(numbers == list(range(len(events))), "sequence numbers must count up from 0")
    final = events[-1][1]["response"]
    done = [d["item"] for n, d in events if n == "response.output_item.done"]
    _check(done == final["output"], "output_item.done items differ from the final output")
    return final


def chat_message(events: list[tuple[str | None, Any]]) -> tuple[dict[str, Any], str]:
    """Rebuild a Chat Completions message from its chunks; returns (message, finish)."""
    _check(events[-1][1] == "[DONE]", "stream must end with [DONE]")
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for _, data in events[:-1]:
        for choice in data["choices"]:
            delta = choice["delta"]
            if delta.get("content"):
                message["content"] += delta["content"]
            if delta.get("reasoning_content"):
                message["reasoning_content"] = (
                    message.get("reasoning_content", "") + delta["reasoning_content"]
                )
            for call in delta.get("tool_calls", ()):
                slot = calls.setdefault(
                    call["index"], {"id": None, "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.get("id") or slot["id"]
                slot["function"]["name"] += call.get("function", {}).get("name", "")
                slot["function"]["arguments"] += call.get("function", {}).get("arguments", "")
            finish = choice.get("finish_reason") or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


def parse_reply(protocol: str, text: str) -> Any:
    """A streamed reply (SSE text) rebuilt in ``protocol``'s terms, its event order checked.

    A Chat Completions reply that was not streamed (one JSON object) is its message.
    """
    if protocol == "openai_chat" and text.lstrip().startswith("{"):
        return json.loads(text)["choices"][0]["message"]
    events = parse_sse(text)
    if protocol == "anthropic":
        return anthropic_message(events)
    if protocol == "openai_responses":
        return responses_object(events)
    return chat_message(events)[0]


def stub_reply(request: dict[str, Any]) -> Any:
    """The reply the capture stub sent, rebuilt in its protocol's terms."""
    payload = request["stub_response"]["payload"]
    if not isinstance(payload, str):  # a JSON reply, stored as the object
        payload = json.dumps(payload)
    return parse_reply(PROTOCOL_OF_PATH[request["path"]], payload)


def render_assistant(tokenizer, messages, tools, assistant) -> str:
    """What the model samples for ``assistant`` after ``messages``: the template's text for it.

    The conversation is rendered with ``assistant`` as its last message (so a thinking
    template keeps its reasoning, as a thinking model writes it) and the part after the
    generation prompt is taken, up to and including the last special token in it (the end
    of turn the engine returns; what the template writes after that is not sampled).
    """
    before = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    after = tokenizer.apply_chat_template(
        [*messages, assistant], tools=tools, add_generation_prompt=False, tokenize=False
    )
    _check(after.startswith(before), "the template rewrote history when a turn was appended")
    text = after[len(before) :]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    ends = [i for i, token in enumerate(ids) if token in special]
    _check(ends, f"no end-of-turn token in the template's assistant text {text!r}")
    end_token = tokenizer.convert_ids_to_tokens(ids[ends[-1]])
    return text[: text.rindex(end_token) + len(end_token)]


def headers_for(request: dict[str, Any], token: str) -> dict[str, str]:
    """The captured headers with the fixture's dummy key replaced by ``token``."""
    headers = {}
    for key, value in request["headers"].items():
        if key.lower() in ("host", "content-length", "accept-encoding", "connection"):
            continue
        if key.lower() == "authorization":
            value = f"Bearer {token}"
        elif key.lower() == "x-api-key":
            value = token
        headers[key] = value
    return headers


def assistant_turn(turn_index: int, **overrides: Any):
    """An empty ``stop`` turn; its minted ids and seals name the kind and ``turn_index``."""
    from agentrl.adapters.base import AssistantTurn

    defaults = dict(
        turn_index=turn_index,
        text="",
        reasoning=None,
        tool_calls=(),
        finish_reason="stop",
        prompt_tokens=10,
        output_tokens=5,
        mint=lambda kind, i: f"{kind}_t{turn_index}n{i}_x",
        seal=lambda kind, text: f"sealed-{kind}-{turn_index}",
    )
    return AssistantTurn(**{**defaults, **overrides})


def env_without_module(module: str, tmp_path: Path) -> dict[str, str]:
    """Environment variables for a subprocess in which ``import <module>`` fails, as if absent.

    A ``sitecustomize`` puts None in ``sys.modules[module]``: imports raise ImportError and
    ``importlib.util.find_spec`` reports the module missing. The agentrl under test comes first
    on the path.
    """
    import os

    import agentrl

    blocker = tmp_path / f"without_{module}"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(
        f"import sys\nsys.modules[{module!r}] = None  # as if it were not installed\n"
    )
    source = Path(agentrl.__file__).resolve().parents[1]
    paths = [str(blocker), str(source), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}

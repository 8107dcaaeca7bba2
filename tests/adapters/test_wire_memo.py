"""A session's translation memo: the same translation as without it, fewer messages translated."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from agentrl.adapters import anthropic
from agentrl.adapters.anthropic import AnthropicAdapter
from agentrl.adapters.keys import exact_key
from agentrl.adapters.wire_memo import TranslationMemo, translating


def body(turns: int, **edits) -> dict:
    """A Claude-Code-like body: a system prompt, a task, then tool use and results."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}]
    for k in range(turns):
        tool_input = {"command": f"cat f{k}.py", "timeout": k}
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading {k}."},
                    {"type": "tool_use", "id": f"toolu_{k}", "name": "Bash", "input": tool_input},
                ],
            }
        )
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": f"code {k}"}
        messages.append({"role": "user", "content": [result]})
    raw = {"model": "m", "max_tokens": 64, "system": "You are Claude Code.", "messages": messages}
    raw.update(edits)
    return raw


def translate(raw: dict, memo: TranslationMemo | None):
    with translating(memo):
        return AnthropicAdapter().parse_request(copy.deepcopy(raw), {})


def same_translation(a, b) -> bool:
    return [exact_key(m) for m in a.messages] == [exact_key(m) for m in b.messages] and (
        a.replayed_ids == b.replayed_ids
    )


def test_a_replayed_conversation_is_translated_once(monkeypatch):
    """The next request translates only its two new messages; the replayed ones are the
    objects the previous request became, and the whole equals a translation without memo."""
    memo = TranslationMemo()
    first = translate(body(3), memo)
    calls = []
    real = anthropic.translate_message
    monkeypatch.setattr(
        anthropic, "translate_message", lambda i, raw: calls.append(i) or real(i, raw)
    )
    second = translate(body(4), memo)
    assert calls == [7, 8]
    assert all(a is b for a, b in zip(first.messages, second.messages, strict=False))
    assert same_translation(second, translate(body(4), None))


def test_a_message_that_differs_only_in_json_is_translated_again():
    """Key order of a tool input, ``1`` for ``1.0``, ``is_error`` 1 for true: each such
    message is translated afresh, exactly as without the memo."""
    memo = TranslationMemo()
    base = body(2)
    translate(base, memo)
    variants = []
    reordered = copy.deepcopy(base)
    block = reordered["messages"][1]["content"][1]
    block["input"] = dict(reversed(list(block["input"].items())))
    variants.append(reordered)
    floats = copy.deepcopy(base)
    floats["messages"][3]["content"][1]["input"]["timeout"] = 1.0
    variants.append(floats)
    flagged = copy.deepcopy(base)
    flagged["messages"][2]["content"][0]["is_error"] = 1
    variants.append(flagged)
    truly = copy.deepcopy(flagged)
    truly["messages"][2]["content"][0]["is_error"] = True
    variants.append(truly)
    for variant in variants:
        assert same_translation(translate(variant, memo), translate(variant, None))


EDITS = st.lists(
    st.tuples(
        st.integers(0, 12),
        st.sampled_from(["text", "order", "float", "error", "drop", "system"]),
    ),
    max_size=4,
)


@given(st.lists(st.tuples(st.integers(0, 5), EDITS), min_size=1, max_size=5))
def test_property_memo_translations_equal_plain_ones(requests):
    """Any run of requests (growing, shrinking, edited anywhere: text, key order, number
    types, error flags, dropped messages, a changed system prompt) translates with the
    memo exactly as without it."""
    memo = TranslationMemo()
    for turns, edits in requests:
        raw = body(turns)
        messages = raw["messages"]
        for position, kind in edits:
            if position >= len(messages):
                continue
            message = messages[position]
            blocks = message["content"]
            if kind == "text":
                blocks[0]["text" if "text" in blocks[0] else "content"] = "edited"
            elif kind == "order" and message["role"] == "assistant":
                blocks[1]["input"] = dict(reversed(list(blocks[1]["input"].items())))
            elif kind == "float" and message["role"] == "assistant":
                blocks[1]["input"]["timeout"] = float(blocks[1]["input"]["timeout"])
            elif kind == "error" and blocks[0]["type"] == "tool_result":
                blocks[0]["is_error"] = True
            elif kind == "drop":
                del messages[position]
            elif kind == "system":
                raw["system"] = "Another system prompt."
        assert same_translation(translate(raw, memo), translate(raw, None))

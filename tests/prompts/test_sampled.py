"""The recorded form of a sampled turn renders back to the sampled text under Qwen3's template.

``parse_generation`` trims text and reasoning for the client and keeps them as sampled for
the record (:mod:`agentrl.prompts.sampled`); the recorded message, rendered by the real
Qwen3 chat template in the middle of a conversation (a tool result follows), must give
back exactly what the policy sampled.
"""

from __future__ import annotations

import pytest

from agentrl.adapters.wire import chat_tool_call
from agentrl.engines.base import Generation
from agentrl.parsers.base import ToolCall
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.parsers.reasoning import Qwen3ReasoningParser
from agentrl.prompts.sampled import sampled_content, sampled_reasoning
from agentrl.serve.sessions import Session
from agentrl.serve.turns import parse_generation

TOOLS = [
    {
        "type": "function",
        "function": {"name": "Write", "description": "", "parameters": {"type": "object"}},
    }
]
CALL = '<tool_call>\n{"name": "Write", "arguments": {"path": "a", "body": "b"}}\n</tool_call>'

SAMPLES = [
    "Hello.",
    "  Hello.  ",
    "  Hello.  \n",
    "<think>\nX\n</think>\n\nHello.",
    "<think>\n  X  \n</think>\n\n  Hello.  ",
    "<think>\n \n</think>\n\nHello.",
    "<think>\n\n</think>\n\nHello.",
    "<think>\n\n</think>\n\n" + CALL,
    "<think>\n  X  \n</think>\n\n" + CALL,
    "<think>\nX\n</think>\n\n  I will.  \n" + CALL,
    "<think>\nX\n</think>\n\nI will.\n\n" + CALL + "\n" + CALL,
    CALL,
    "Let me.\n" + CALL,
]


def _recorded(tokenizer, sample: str) -> tuple[dict, str]:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer(sample, add_special_tokens=False)["input_ids"], end]
    parsed = parse_generation(
        Generation(output_ids=ids, logprobs=[0.0] * len(ids)),
        tokenizer=tokenizer,
        stop_ids={end},
        tools=TOOLS,
        tool_parser=HermesToolCallParser(),
        reasoning_parser=Qwen3ReasoningParser(),
    )
    message: dict = {"role": "assistant", "content": parsed.sampled_text}
    if parsed.sampled_reasoning is not None:
        message["reasoning_content"] = parsed.sampled_reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [chat_tool_call(c.name, c.arguments) for c in parsed.tool_calls]
    return message, parsed.text


@pytest.mark.parametrize("sample", SAMPLES)
def test_recorded_message_renders_back_to_the_sample(sample, qwen_tokenizer):
    """Rendered mid-conversation, the recorded message is the sampled text, byte for byte."""
    message, _ = _recorded(qwen_tokenizer, sample)
    head = [{"role": "user", "content": "go"}]
    before = qwen_tokenizer.apply_chat_template(
        head, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    after = qwen_tokenizer.apply_chat_template(
        [*head, message, {"role": "tool", "content": "ok"}], tools=TOOLS, tokenize=False
    )
    assert after.startswith(before)
    assert after[len(before) :].startswith(sample + "<|im_end|>\n")


def test_client_text_stays_trimmed(qwen_tokenizer):
    """What a client is sent is trimmed as before; only the record keeps the whitespace."""
    message, text = _recorded(qwen_tokenizer, "<think>\n  X  \n</think>\n\n  Hello.  ")
    assert text == "Hello."
    assert (message["content"], message["reasoning_content"]) == ("  Hello.  ", "  X  ")


def test_sampled_forms():
    """Reasoning loses the template's own newlines (an empty block keeps them); so does text."""
    assert sampled_reasoning("\n  X  \n") == "  X  "
    assert sampled_reasoning("X\n") == "X"  # the prompt opened the block with <think>\n
    assert sampled_reasoning("\n\n") == "\n\n"
    call = ToolCall(name="f", raw="<tool_call>x</tool_call>")
    assert sampled_content("\n\nHi\n<tool_call>x</tool_call>", tool_calls=[call]) == "\n\nHi"
    assert sampled_content("\n\nHi", after_reasoning=True) == "Hi"
    # Text after the call has no place in the template: the trimmed text is kept.
    kept = sampled_content("<tool_call>x</tool_call> more", tool_calls=[call], trimmed="more")
    assert kept == "more"


def test_restore_is_key_order_sensitive():
    """A replay equal to the record but for key order is restored to the record's order."""
    session = Session(sid="s", token="t")
    recorded = {
        "role": "assistant",
        "content": "",
        "tool_calls": [chat_tool_call("Write", {"path": "a", "body": "b"})],
    }
    session.record_response(0, recorded)
    session.remember("toolu_t0n0_x", 0)
    replay = {**recorded, "tool_calls": [chat_tool_call("Write", {"body": "b", "path": "a"})]}
    assert replay == recorded  # dict equality cannot see it
    messages, changed = session.restore_replays([replay], [(0, "toolu_t0n0_x")])
    assert (messages, changed) == ([recorded], [0])
    assert list(messages[0]["tool_calls"][0]["function"]["arguments"]) == ["path", "body"]


def test_restore_without_wire_ids_matches_up_to_whitespace_only():
    """A replay without ids restores when it reads like one record up to whitespace, not else."""
    session = Session(sid="s", token="t")
    recorded = {"role": "assistant", "content": "  Hi.  ", "reasoning_content": "\n\n"}
    session.record_response(0, recorded)
    trimmed = {"role": "assistant", "content": "Hi."}
    assert session.restore_replays([trimmed], []) == ([recorded], [0])
    other = {"role": "assistant", "content": "Hi there."}
    assert session.restore_replays([other], []) == ([other], [])
    # Two turns recorded differently that read alike: ambiguous, nothing restored.
    session.record_response(1, {"role": "assistant", "content": "Hi.\n"})
    assert session.restore_replays([trimmed], []) == ([trimmed], [])

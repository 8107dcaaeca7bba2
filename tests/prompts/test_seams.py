"""Seams from reduced renders: the same text as the whole conversation's, or found out."""

from __future__ import annotations

import pytest

from agentrl.prompts.rendering import render_full
from agentrl.prompts.seams import SeamFinder, reduced_conversation
from agentrl.prompts.splice import SpliceLedger, Splicer

END = 151645  # <|im_end|>
TOOLS = [
    {
        "type": "function",
        "function": {"name": "Bash", "description": "run", "parameters": {"type": "object"}},
    }
]
#: Writes how many messages came before after each assistant message: a seam that
#: depends on the dropped messages.
COUNTING = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<A>{{ m.content }}<|im_end|>[{{ loop.index0 }}]"
    "{% else %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<A>{% endif %}"
)
#: Refuses a conversation that does not open with a user message after the system one,
#: or that holds a message with no content.
USER_FIRST = (
    "{% if messages[1].role != 'user' %}{{ raise_exception('a user speaks first') }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.content is not defined %}{{ raise_exception('content missing') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def ids_of(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def grow(splicer, tokenizer, turns, *, tools=TOOLS, template=None):
    """A tool-calling session spliced ``turns`` times; each prompt and its full render."""
    ledger = SpliceLedger()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    prompts = []
    for turn in range(turns + 1):
        plan = splicer.plan(ledger, messages, tools)
        full = render_full(tokenizer, messages, tools, chat_template=template)
        ids = list(plan.prompt.ids) if plan.prompt is not None else full
        prompts.append((plan, ids, full))
        output = [*ids_of(tokenizer, f"call {turn}"), END]
        response = {"role": "assistant", "content": f"call {turn}"}
        ledger.add(turn, plan, ids, output, response, messages)
        messages = [*messages, response, {"role": "tool", "content": f"result {turn}\n"}]
    return prompts


def test_a_long_session_reads_its_seams_from_reduced_renders(qwen_tokenizer):
    """Qwen3's template: every spliced prompt equals the full render of its conversation,
    and but for the 1st splice (nothing to drop: a whole render) and the checked ones (2nd,
    4th, 8th) the seams come from reduced renders alone."""
    splicer = Splicer(qwen_tokenizer, {}, frozenset({END}))
    prompts = grow(splicer, qwen_tokenizer, 9)
    assert [p.reason for p, _, _ in prompts] == ["new_chain"] + [None] * 9
    for _, ids, full in prompts:
        assert ids == full
    stats = splicer.seams.stats
    assert splicer.seams.reduces
    assert stats["checked"] == 3 and stats["check_failed"] == 0
    assert stats["full"] == 4 and stats["reduced"] == 9 - 4


def test_a_seam_that_depends_on_earlier_messages_turns_reduction_off(qwen_tokenizer):
    """A template that numbers what follows each assistant message: the first check finds
    the reduced seam wrong, the turn takes the full one, and no later turn reduces."""
    splicer = Splicer(qwen_tokenizer, {}, frozenset({END}), chat_template=COUNTING)
    prompts = grow(splicer, qwen_tokenizer, 4, tools=None, template=COUNTING)
    assert not splicer.seams.reduces
    assert splicer.seams.stats["check_failed"] == 1 and splicer.seams.stats["reduced"] == 0
    for plan, _, _ in prompts[1:]:
        assert plan.prompt is not None
        index = len(plan.messages) - 2
        assert plan.prompt.text.startswith(f"[{index}]")


def test_a_reduced_conversation_the_template_refuses_takes_the_whole_one(qwen_tokenizer):
    """A template that wants a user message first: the reduced conversation (system, tool,
    probe, tool) is refused, so the whole conversation gives the seam; where the whole one
    is refused too, its fallback reason is the turn's."""
    finder = SeamFinder(qwen_tokenizer, USER_FIRST, {}, frozenset({END}))
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "tool", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "tool", "content": "e"},
    ]
    assert finder.seam(messages, 4, None, [END]) == "<tool>e<|im_end|><assistant>"
    assert finder.stats["full"] == 1 and finder.stats["reduced"] == 0
    assert finder.reduces
    broken = [*messages[:2], {"role": "assistant"}, *messages[3:]]
    reason, detail = finder.seam(broken, 4, None, [END])
    assert reason == "delta_unrenderable" and "content missing" in detail


@pytest.mark.parametrize(
    ("roles", "last", "kept"),
    [
        (["system", "user", "assistant", "tool"], 2, None),
        (["user", "assistant", "tool"], 1, None),
        (["system", "user", "assistant", "tool", "assistant", "tool"], 4, [0, 3, 4, 5]),
        (["user", "assistant", "tool", "assistant", "tool", "user"], 3, [2, 3, 4, 5]),
    ],
)
def test_the_reduced_conversation_keeps_the_system_message_and_one_neighbour(roles, last, kept):
    """System message, the message before the last assistant one, and from there on; None
    when nothing would be dropped."""
    messages = [{"role": role, "content": str(i)} for i, role in enumerate(roles)]
    reduced = reduced_conversation(messages, last)
    assert (None if reduced is None else [int(m["content"]) for m in reduced]) == kept


#: Writes a marker after an assistant message whose content ends with "7Q" (the first
#: probe's last characters): text after the probe that depends on the probe itself.
PROBE_AWARE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}<|im_end|>"
    "{% if m.role == 'assistant' and m.content.endswith('7Q') %}!{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _conversation():
    return [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "tool", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "tool", "content": "e"},
    ]


def test_a_reduced_seam_renders_one_probe_and_a_checked_one_both(qwen_tokenizer, monkeypatch):
    """Outside the checks a reduced seam is one render (one probe); a checked turn renders
    both probes reduced and one whole. The seam is the same either way."""
    import agentrl.prompts.seams as seams

    rendered = []

    def counting(tokenizer, messages, tools, **kwargs):
        rendered.append(len(messages))
        return render_text(tokenizer, messages, tools, **kwargs)

    render_text = seams.render_text
    monkeypatch.setattr(seams, "render_text", counting)
    finder = SeamFinder(qwen_tokenizer, None, {}, frozenset({END}))
    messages = _conversation()
    plain = finder.seam(messages, 4, TOOLS, [END], check=False)
    assert rendered == [4]
    rendered.clear()
    checked = finder.seam(messages, 4, TOOLS, [END], check=True)
    assert rendered == [4, 4, 6]
    assert (
        plain
        == checked
        == "\n<|im_start|>user\n<tool_response>\ne\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_that_reads_the_probe_is_found_on_a_checked_turn(qwen_tokenizer):
    """One probe cannot see that the template's text depends on the probe's characters;
    the checked turn, with both probes, refuses to splice."""
    finder = SeamFinder(qwen_tokenizer, PROBE_AWARE, {}, frozenset({END}))
    reason, detail = finder.seam(_conversation(), 4, None, [END], check=True)
    assert reason == "delta_unrenderable" and "depends on the message content" in detail

"""Splice mode: each prompt is the chain's exact ids so far plus the new messages' rendering.

Driven over HTTP through the real middleware, the real Qwen3 chat template (which drops
earlier ``<think>`` blocks once a later user message exists) and the scripted engine.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.preflight.clients import CLIENTS
from agentrl.preflight.engine import ScriptedCompletion, ScriptedTokenEngine
from agentrl.preflight.scenarios import ModelTurn, ToolUse, completion_text
from agentrl.prompts.rendering import render_full
from agentrl.prompts.splice import FALLBACK_REASONS, SpliceLedger, SplicePlan, Splicer
from agentrl.serve.middleware import Middleware
from agentrl.testing.stack import qwen_parsers, started_middleware
from agentrl.trajectory import TrajectoryManager, TurnRecord

pytest_plugins = ("middleware_fixtures",)

TOOLS = [
    {
        "type": "function",
        "function": {"name": "Bash", "description": "run", "parameters": {"type": "object"}},
    }
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ids_of(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def template_ids(tokenizer, messages, tools=None) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


async def chat(http, mw, token, messages, tools=None) -> dict:
    """One Chat Completions turn; the reply's assistant message, as the client stores it."""
    body = {"model": "policy", "messages": messages}
    if tools:
        body["tools"] = tools
    async with http.post(mw.url + "/v1/chat/completions", json=body, headers=bearer(token)) as r:
        text = await r.text()
        assert r.status == 200, text
    return json.loads(text)["choices"][0]["message"]


def sampled_tokens(engine) -> int:
    return sum(len(g.output_ids) for g in engine.served)


def turn_metadata(samples) -> dict[int, dict]:
    found = {}
    for sample in samples:
        for meta in sample.metadata["turn_metadata"].values():
            found[meta["middleware_turn"]] = meta
    return found


async def reasoning_session(http, mw, engine, sid, turns=4):
    """A session with reasoning and new user text every turn; returns its samples."""
    token = mw.open_session(sid)
    messages = [{"role": "system", "content": "Be brief."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        engine.queue(f"<think>\nLet me think about {turn}.\n</think>\n\nAnswer {turn}.")
        messages.append(await chat(http, mw, token, messages))
    return await mw.finish_session(sid, reward=1.0)


async def test_reasoning_with_user_text_every_turn_trains_every_token_in_one_sample(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """Splice mode: one sample, every sampled token trained, prompts extend the served ids.

    Each turn's prompt is the previous prompt + output (what the engine received and
    sampled, earlier thinking included) + ``\\n`` + the new user message + the generation
    prompt; the sample's tokens are exactly the last prompt plus its output.
    """
    samples = await reasoning_session(http, middleware, scripted_engine, "splice")
    served = scripted_engine.served
    assert len(samples) == 1
    assert sum(samples[0].loss_mask) == sampled_tokens(scripted_engine)
    assert samples[0].tokens == served[-1].input_ids + served[-1].output_ids
    for turn in range(1, len(served)):
        delta = f"\n<|im_start|>user\nquestion {turn}<|im_end|>\n<|im_start|>assistant\n"
        previous = served[turn - 1]
        expected = previous.input_ids + previous.output_ids + tuple(ids_of(qwen_tokenizer, delta))
        assert served[turn].input_ids == expected
    assert b"Let me think about 0." in qwen_tokenizer.decode(served[-1].input_ids).encode()
    metadata = turn_metadata(samples)
    assert [metadata[t]["prompt_mode"] for t in range(4)] == ["render"] + ["splice"] * 3
    assert metadata[0]["splice_fallback"] == "new_chain"
    assert middleware.splice_stats == {"spliced": 3, "new_chain": 1}


async def test_render_mode_trains_only_a_fraction_of_the_same_session(
    sglang_client, scripted_engine, http, qwen_tokenizer
):
    """Render mode keeps today's behaviour: ids identical to the template, low yield.

    Qwen3 drops the earlier ``<think>`` blocks, so each turn realigns the previous one:
    only the last turn's tokens train.
    """
    async with started_middleware(sglang_client, qwen_tokenizer, prompt_mode="render") as mw:
        samples = await reasoning_session(http, mw, scripted_engine, "render")
        assert mw.splice_stats == {}
    trained = sum(sum(s.loss_mask) for s in samples)
    assert trained == len(scripted_engine.served[-1].output_ids)
    assert trained < sampled_tokens(scripted_engine) / 2
    first = scripted_engine.served[1].input_ids
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "question 0"},
        {"role": "assistant", "content": "Answer 0.", "reasoning_content": "Let me think about 0."},
        {"role": "user", "content": "question 1"},
    ]
    assert list(first) == template_ids(qwen_tokenizer, history)
    assert {m["prompt_mode"] for m in turn_metadata(samples).values()} == {"render"}


async def test_tool_result_turns_splice_the_tool_response(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """Tool results: the seam is ``\\n`` then the template's ``<tool_response>`` wrapping."""
    token = middleware.open_session("tools")
    messages = [{"role": "user", "content": "list files"}]
    for turn in range(3):
        scripted_engine.queue(
            f'<think>\nstep {turn}\n</think>\n\n<tool_call>\n{{"name": "Bash", "arguments": '
            f'{{"command": "ls {turn}"}}}}\n</tool_call>'
        )
        reply = await chat(http, middleware, token, messages, TOOLS)
        call = reply["tool_calls"][0]
        messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": f"out {turn}"}]
    samples = await middleware.finish_session("tools", reward=0.0)
    served = scripted_engine.served
    for turn in (1, 2):
        delta = (
            f"\n<|im_start|>user\n<tool_response>\nout {turn - 1}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        previous = served[turn - 1]
        expected = previous.input_ids + previous.output_ids + tuple(ids_of(qwen_tokenizer, delta))
        assert served[turn].input_ids == expected
    assert len(samples) == 1
    assert sum(samples[0].loss_mask) == sampled_tokens(scripted_engine)
    assert middleware.splice_stats["spliced"] == 2


@pytest.mark.parametrize(
    ("finish_reason", "eos"), [("length", None), ("stop", False)], ids=["length", "no-stop-id"]
)
async def test_an_output_without_its_end_token_gets_the_templates_end_token(
    middleware, scripted_engine, http, qwen_tokenizer, finish_reason, eos
):
    """An output cut by ``length`` (or whose stop id the engine did not return) ends in the seam.

    The seam then starts with the template's ``<|im_end|>``, so the next prompt reads as a
    closed assistant turn; the sample still trains every sampled token once.
    """
    token = middleware.open_session("cut")
    messages = [{"role": "user", "content": "go"}]
    scripted_engine.queue("<think>\nhalf a thou", finish_reason=finish_reason, eos=eos)
    messages += [await chat(http, middleware, token, messages)]
    messages += [{"role": "user", "content": "again"}]
    scripted_engine.queue("Done.")
    await chat(http, middleware, token, messages)
    samples = await middleware.finish_session("cut", reward=0.0)
    first, second = scripted_engine.served
    assert first.output_ids[-1] != qwen_tokenizer.eos_token_id
    delta = "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    expected = first.input_ids + first.output_ids + tuple(ids_of(qwen_tokenizer, delta))
    assert second.input_ids == expected
    assert len(samples) == 1
    assert sum(samples[0].loss_mask) == sampled_tokens(scripted_engine)


async def test_changed_tools_fall_back_to_a_full_render_counted_with_its_reason(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """A new tools list cannot be spliced: the turn renders in full and starts a new sample."""
    token = middleware.open_session("retool")
    messages = [{"role": "user", "content": "hi"}]
    scripted_engine.queue("Hello.")
    messages += [await chat(http, middleware, token, messages, TOOLS)]
    messages += [{"role": "user", "content": "more"}]
    scripted_engine.queue("More.")
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "a shell"}}]
    await chat(http, middleware, token, messages, other)
    samples = await middleware.finish_session("retool", reward=0.0)
    assert middleware.splice_stats == {"new_chain": 1, "tools_changed": 1}
    assert list(scripted_engine.served[1].input_ids) == template_ids(
        qwen_tokenizer, messages, other
    )
    metadata = turn_metadata(samples)
    assert metadata[1]["prompt_mode"] == "render"
    assert metadata[1]["splice_fallback"] == "tools_changed"
    assert len(samples) == 2
    assert sum(sum(s.loss_mask) for s in samples) == sampled_tokens(scripted_engine)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [("assistant", "unmapped_message"), ("system", "system_changed"), ("user", "history_changed")],
)
async def test_a_rewritten_message_no_wire_id_maps_falls_back(
    middleware, scripted_engine, http, edit, reason
):
    """A rewritten assistant reply (no wire id), system prompt or user message is not spliced."""
    token = middleware.open_session("rewrite")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    scripted_engine.queue("Hello there.")
    reply = await chat(http, middleware, token, messages)
    if edit == "assistant":
        reply = {**reply, "content": "Hello, there."}
    elif edit == "system":
        messages = [{"role": "system", "content": "sys v2"}, *messages[1:]]
    else:
        messages = [messages[0], {"role": "user", "content": "hello"}]
    scripted_engine.queue("Fine.")
    await chat(http, middleware, token, [*messages, reply, {"role": "user", "content": "and?"}])
    samples = await middleware.finish_session("rewrite", reward=0.0)
    assert middleware.splice_stats == {"new_chain": 1, reason: 1}
    assert turn_metadata(samples)[1]["splice_fallback"] == reason


async def test_a_chain_resumes_splicing_after_a_sub_agent(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """A sub-agent's conversation opens its own chain; the parent's next turn still splices."""
    token = middleware.open_session("parent")
    parent = [{"role": "user", "content": "task"}]
    scripted_engine.queue("<think>\nplan\n</think>\n\nDelegating.")
    parent += [await chat(http, middleware, token, parent)]
    scripted_engine.queue("Sub result.")
    await chat(http, middleware, token, [{"role": "user", "content": "sub task"}])
    parent += [{"role": "user", "content": "go on"}]
    scripted_engine.queue("Finished.")
    await chat(http, middleware, token, parent)
    samples = await middleware.finish_session("parent", reward=0.0)
    first, _, third = scripted_engine.served
    assert third.input_ids[: len(first.input_ids) + len(first.output_ids)] == (
        first.input_ids + first.output_ids
    )
    assert middleware.splice_stats == {"new_chain": 2, "spliced": 1}
    assert sum(sum(s.loss_mask) for s in samples) == sampled_tokens(scripted_engine)
    assert len(samples) == 2


async def test_the_context_budget_counts_the_spliced_prompt(middleware, scripted_engine, http):
    """``max_new_tokens`` is clamped to the budget minus the spliced prompt's length."""
    token = middleware.open_session("budget", max_context_tokens=400)
    messages = [{"role": "user", "content": "hi"}]
    scripted_engine.queue("<think>\n" + "long thought " * 20 + "\n</think>\n\nOk.")
    messages += [await chat(http, middleware, token, messages)]
    messages += [{"role": "user", "content": "next"}]
    scripted_engine.queue("Ok.")
    await chat(http, middleware, token, messages)
    second = scripted_engine.generate_requests[1].body
    assert middleware.splice_stats["spliced"] == 1
    assert second["sampling_params"]["max_new_tokens"] == 400 - len(second["input_ids"])


def test_position_dependent_wrappers_come_from_the_template(qwen_tokenizer):
    """The seam is read from the template at the message's position, not from a table.

    A template that closes an assistant message differently before a tool message than
    before a user message gets each seam right, and an output that already ends with the
    end token does not repeat it.
    """
    template = (
        "{% for m in messages %}"
        "{% if m.role == 'assistant' %}<A>{{ m.content }}"
        "{% if not loop.last and messages[loop.index0 + 1].role == 'tool' %}</A:tool>"
        "{% else %}<|im_end|>{% endif %}"
        "{% else %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<A>{% endif %}"
    )
    splicer = Splicer(qwen_tokenizer, {}, frozenset({151645}), chat_template=template)
    ledger = SpliceLedger()
    first = [{"role": "user", "content": "q"}]
    plan = splicer.plan(ledger, first, None)
    assert plan.reason == "new_chain"
    output = [*ids_of(qwen_tokenizer, "answer"), 151645]
    ledger.add(0, plan, [1, 2, 3], output, {"role": "assistant", "content": "answer"})
    replied = [*first, {"role": "assistant", "content": "answer"}]
    to_user = splicer.plan(ledger, [*replied, {"role": "user", "content": "u"}], None)
    assert to_user.prompt.text == "<user>u</user><A>"
    assert list(to_user.prompt.ids) == [
        1,
        2,
        3,
        *output,
        *ids_of(qwen_tokenizer, "<user>u</user><A>"),
    ]
    to_tool = splicer.plan(ledger, [*replied, {"role": "tool", "content": "t"}], None)
    assert to_tool.reason == "stop_token"
    assert isinstance(SplicePlan().metadata(), dict)


def test_an_output_without_its_end_token_takes_the_wrapper_for_its_position(qwen_tokenizer):
    """Before a tool message the same template's seam is its own ``</A:tool>`` wrapper."""
    template = (
        "{% for m in messages %}"
        "{% if m.role == 'assistant' %}<A>{{ m.content }}"
        "{% if not loop.last and messages[loop.index0 + 1].role == 'tool' %}</A:tool>"
        "{% else %}<|im_end|>{% endif %}"
        "{% else %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<A>{% endif %}"
    )
    splicer = Splicer(qwen_tokenizer, {}, frozenset({151645}), chat_template=template)
    ledger = SpliceLedger()
    first = [{"role": "user", "content": "q"}]
    output = ids_of(qwen_tokenizer, "call it")
    ledger.add(0, splicer.plan(ledger, first, None), [7], output, {"role": "assistant"})
    replied = [*first, {"role": "assistant"}, {"role": "tool", "content": "t"}]
    plan = splicer.plan(ledger, replied, None)
    assert plan.prompt.text == "</A:tool><tool>t</tool><A>"
    assert plan.metadata() == {"prompt_mode": "splice", "spliced_on_turn": 0}


async def test_claude_code_thinking_tool_use_and_reordered_inputs_all_train(
    middleware, scripted_engine, http
):
    """Anthropic Messages with thinking, whitespace around it, tool use and re-ordered input keys.

    Claude Code replays ``tool_use`` input in its schema's key order and strips nothing the
    middleware needs: the wire ids map every reply to its turn, so each turn splices and
    the whole session is one sample that trains every sampled token.
    """
    token = middleware.open_session("claude")
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    history = [{"role": "user", "content": "fix it"}]
    for turn in range(3):
        scripted_engine.queue(
            f"<think>\n  look {turn}  \n</think>\n\n  Running.  \n<tool_call>\n"
            f'{{"name": "Bash", "arguments": {{"timeout": {turn}, "command": "ls"}}}}\n</tool_call>'
        )
        body = {"model": "claude", "max_tokens": 256, "system": "You are Claude Code."}
        body.update(tools=tools, messages=history)
        async with http.post(
            middleware.url + "/v1/messages", json=body, headers=bearer(token)
        ) as r:
            assert r.status == 200, await r.text()
            reply = json.loads(await r.text())
        blocks = [
            {**b, "input": dict(reversed(list(b["input"].items())))}
            if b["type"] == "tool_use"
            else b
            for b in reply["content"]
        ]
        call = blocks[-1]
        history += [
            {"role": "assistant", "content": blocks},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call["id"], "content": "ok"},
                    {"type": "text", "text": f"<system-reminder>turn {turn}</system-reminder>"},
                ],
            },
        ]
    samples = await middleware.finish_session("claude", reward=0.0)
    assert middleware.splice_stats == {"new_chain": 1, "spliced": 2}
    assert len(samples) == 1
    assert sum(samples[0].loss_mask) == sampled_tokens(scripted_engine)
    served = scripted_engine.served[-1]
    assert samples[0].tokens == served.input_ids + served.output_ids


@st.composite
def sessions(draw):
    """Turns of one session: reasoning on/off, whitespace, user text or tool results, cuts."""
    turns = []
    for turn in range(draw(st.integers(1, 6))):
        pad = draw(st.sampled_from(["", " ", "  \n"]))
        reasoning = draw(st.booleans())
        text = f"<think>\n{pad}r{turn}{pad}\n</think>\n\n" if reasoning else ""
        if draw(st.booleans()):
            text += draw(st.sampled_from(["", "\n\n<think>\n\n</think>\n\n"]))
        text += f"{pad}answer {turn}{pad}"
        follow = draw(st.sampled_from(["user", "tool", "tool+user"]))
        turns.append((text, draw(st.sampled_from(["stop", "length"])), follow))
    return turns


@settings(max_examples=60, deadline=None)
@given(sessions())
def test_property_a_spliced_session_trains_every_sampled_token_once_in_one_sample(
    qwen_tokenizer, turns
):
    """Generated sessions under the real Qwen3 template: one sample, every token trained once.

    Each turn after the first splices onto the previous one, and the sample's tokens are
    exactly the last prompt the engine received plus its output.
    """
    splicer = Splicer(qwen_tokenizer, {}, frozenset(qwen_tokenizer.all_special_ids))
    ledger, manager = SpliceLedger(), TrajectoryManager()
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    sampled, prompt_ids, output = 0, (), []
    for index, (text, finish, follow) in enumerate(turns):
        plan = splicer.plan(ledger, messages, None)
        assert (plan.prompt is not None) == (index > 0), plan.reason
        prompt_ids = plan.prompt.ids if plan.prompt else render_full(qwen_tokenizer, messages)
        output = ids_of(qwen_tokenizer, text) + ([151645] if finish == "stop" else [])
        response = {"role": "assistant", "content": f"answer {index}"}
        manager.record_turn(
            "s",
            TurnRecord(prompt_ids, output, [-0.5] * len(output), finish_reason=finish),
            prompt_messages=messages,
            response_message=response,
        )
        ledger.add(index, plan, prompt_ids, output, response)
        sampled += len(output)
        messages = [*messages, response]
        if "tool" in follow:
            messages.append({"role": "tool", "content": f"out {index}"})
        if "user" in follow:
            messages.append({"role": "user", "content": f"more {index}"})
    (sample,) = manager.get_trajectory("s", reward=1.0)
    assert sum(sample.loss_mask) == sampled
    assert sample.tokens == tuple(prompt_ids) + tuple(output)


# -- a property over whole sessions through the real middleware -------------------------

#: The HTTP property's example count (``AGENTRL_HYPOTHESIS_EXAMPLES`` overrides it): each
#: example starts a middleware and drives several streamed turns.
HTTP_PROPERTY = settings(
    max_examples=int(os.environ.get("AGENTRL_HYPOTHESIS_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@attrs.frozen
class GeneratedTurn:
    """One main-agent turn: what the model samples; whether the client rewrites its replay."""

    model: ModelTurn
    rewrite: bool = False


@attrs.frozen
class GeneratedSession:
    """A session: its protocol, its main turns, where a sub-agent runs and where it compacts."""

    protocol: str
    user_text: bool
    turns: tuple[GeneratedTurn, ...]
    subagent_after: int | None
    compact_before: int | None


def _shell(i: int, j: int) -> ToolUse:
    arguments = {"description": f"step {i}.{j}", "command": f"ls d{i}{j}"}
    return ToolUse(tool="shell", arguments=arguments, result=f"out {i}.{j}")


@st.composite
def http_sessions(draw):
    """Reasoning on/off/empty, whitespace, user text every turn or never, parallel calls,
    rewritten replays, length cuts, a sub-agent chain and a compaction."""
    user_text = draw(st.booleans())
    count = draw(st.integers(2, 5))
    turns = []
    for i in range(count):
        final = i == count - 1
        calls = 0 if final else draw(st.integers(0 if user_text else 1, 2))
        reasoning = draw(st.sampled_from([None, "", f"think {i}"]))
        # A cut anywhere after the think block opens, an empty one too: a reply left with
        # nothing of its own to replay is told apart by the messages before it.
        cut = None if final or reasoning is None else draw(st.sampled_from([None, None, 4]))
        model = ModelTurn(
            reasoning=reasoning,
            # Empty replies too: two of them, one with an empty think block, replay alike.
            text=f"step {i}" if final else draw(st.sampled_from(["", f"step {i}"])),
            calls=tuple(_shell(i, j) for j in range(calls)),
            padding=draw(st.sampled_from(["", "  ", "\n "])),
            cut_after=cut,
        )
        turns.append(GeneratedTurn(model, rewrite=bool(calls) and draw(st.booleans())))
    return GeneratedSession(
        protocol=draw(st.sampled_from(["anthropic", "openai_responses"])),
        user_text=user_text,
        turns=tuple(turns),
        subagent_after=draw(st.none() | st.integers(0, count - 2)),
        compact_before=draw(st.none() | st.integers(1, count - 1)),
    )


def _rewritten(item: dict) -> dict:
    """``item`` as a client that rewrites its replay sends it: text trimmed, tool input keys
    reversed and a default added (each carries the wire id the middleware minted)."""
    item = json.loads(json.dumps(item))
    if item.get("type") == "text":
        item["text"] = item["text"].strip()
    elif item.get("type") == "tool_use":
        item["input"] = {**dict(reversed(list(item["input"].items()))), "timeout": 120}
    elif item.get("type") == "function_call":
        arguments = json.loads(item["arguments"])
        item["arguments"] = json.dumps({**dict(reversed(list(arguments.items()))), "timeout": 120})
    elif item.get("role") == "assistant" and isinstance(item.get("content"), list):
        item["content"] = [_rewritten(block) for block in item["content"]]
    return item


class HttpSessionDriver:
    """Plays a :class:`GeneratedSession` through a started middleware; records what it expects."""

    def __init__(self, session, client, engine, http, url, token) -> None:
        self.session, self.client, self.engine = session, client, engine
        self.http, self.url, self.token = http, url, token
        #: The splice fallback each request must get (None: spliced), in turn order.
        self.expected: list[str | None] = []

    async def post(self, conversation, model: ModelTurn, expect: str | None):
        self.engine.queue(
            ScriptedCompletion(
                text=completion_text(model, self.client.tool_names), cut_after=model.cut_after
            )
        )
        self.expected.append(expect)
        async with self.http.post(
            self.url + self.client.path,
            json=self.client.body(conversation),
            headers=self.client.headers(self.token, conversation),
        ) as response:
            text = await response.text()
            assert response.status == 200, text
        return self.client.parse_reply(text)

    async def answer(self, conversation, model: ModelTurn, reply, *, rewrite=False, user=False):
        """Append the replay (rewritten if asked), the tool results and any user text."""
        start = len(conversation.items)
        self.client.add_reply(conversation, reply, reorder_keys=False)
        if rewrite:
            conversation.items[start:] = [_rewritten(i) for i in conversation.items[start:]]
        results = [(call, f"result of {call.call_id[-6:]}") for call in reply.calls]
        text = "More, please." if user or not results else None
        self.client.add_results(conversation, results, text)
        return start

    async def subagent(self) -> None:
        conversation = self.client.new_conversation("List the tests.", subagent=True)
        first = ModelTurn(reasoning="sub", calls=(_shell(9, 0),))
        reply = await self.post(conversation, first, "new_chain")
        await self.answer(conversation, first, reply)
        await self.post(conversation, ModelTurn(text="Two tests."), None)

    async def run(self) -> None:
        conversation = self.client.new_conversation("Fix the bug.", subagent=False)
        last_reply = 0
        for index, turn in enumerate(self.session.turns):
            expect = "new_chain" if index == 0 else None
            if index == self.session.compact_before:
                summary = self.client.new_conversation("Summary: ls was run.", subagent=False)
                conversation.items = summary.items + conversation.items[last_reply:]
                expect = "history_changed"
            reply = await self.post(conversation, turn.model, expect)
            if index == len(self.session.turns) - 1:
                break
            last_reply = await self.answer(
                conversation, turn.model, reply, rewrite=turn.rewrite, user=self.session.user_text
            )
            if index == self.session.subagent_after:
                await self.subagent()


async def drive_http_session(tokenizer, session: GeneratedSession):
    """Run ``session`` through a fresh splice-mode middleware; (driver, engine, samples)."""
    engine = ScriptedTokenEngine(tokenizer)
    tool_parser, reasoning_parser = qwen_parsers()
    middleware = Middleware(
        engine=engine,
        tokenizer=tokenizer,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        trajectory=TrajectoryManager(),
        adapters=[session.protocol],
    )
    await middleware.start(host="127.0.0.1", port=0)
    try:
        token = middleware.open_session("prop")
        async with aiohttp.ClientSession(trust_env=False) as http:
            client = CLIENTS[session.protocol]()
            driver = HttpSessionDriver(session, client, engine, http, middleware.url, token)
            await driver.run()
        samples = await middleware.finish_session("prop", reward=1.0, max_sample_tokens=0)
    finally:
        await middleware.close()
    return driver, engine, samples


@HTTP_PROPERTY
@given(http_sessions())
def test_property_whole_sessions_train_every_sampled_token_once(qwen_tokenizer, session):
    """Generated Claude Code / Codex sessions through the real middleware, splice mode.

    Reasoning on, off or empty, whitespace around it and the text, user text every turn or
    never, parallel tool calls, outputs cut by ``length``, replays the client rewrote
    (trimmed text, re-ordered and added tool inputs: restored through the minted wire ids),
    a sub-agent chain and a compaction (history replaced by a summary). Properties:

    - each request splices unless a documented fallback fired where one must (a chain's
      first turn: ``new_chain``; the compacted request: ``history_changed``), and a new
      sample starts exactly at each fallback;
    - every sample's tokens are exactly the prompt ids the engine received for its last
      turn plus that turn's output, each earlier turn's prompt + output a prefix of it;
    - the loss mask is 1 exactly on the sampled tokens, so every sampled token trains once.
    """
    driver, engine, samples = asyncio.run(drive_http_session(qwen_tokenizer, session))
    calls = engine.calls
    assert len(calls) == len(driver.expected) and engine.pending() == 0
    metadata = {}
    for sample in samples:
        for meta in sample.metadata["turn_metadata"].values():
            metadata[meta["middleware_turn"]] = meta
    assert sorted(metadata) == list(range(len(calls)))
    fallbacks = [metadata[t].get("splice_fallback") for t in range(len(calls))]
    assert fallbacks == driver.expected
    assert set(filter(None, fallbacks)) <= set(FALLBACK_REASONS)
    assert len(samples) == sum(1 for reason in fallbacks if reason)
    trained = 0
    for sample in samples:
        turns = sorted(m["middleware_turn"] for m in sample.metadata["turn_metadata"].values())
        assert fallbacks[turns[0]] and not any(fallbacks[t] for t in turns[1:]), turns
        last = calls[turns[-1]]
        assert sample.tokens == last.input_ids + last.output_ids
        mask = [0] * len(sample.tokens)
        for turn in turns:
            call = calls[turn]
            assert sample.tokens[: len(call.input_ids)] == call.input_ids
            end = len(call.input_ids) + len(call.output_ids)
            assert sample.tokens[len(call.input_ids) : end] == call.output_ids
            mask[len(call.input_ids) : end] = [1] * len(call.output_ids)
        assert list(sample.loss_mask) == mask[sample.prompt_length :]
        trained += sum(sample.loss_mask)
    assert trained == sum(len(call.output_ids) for call in calls)


@pytest.mark.parametrize("protocol", ["anthropic", "openai_responses"])
def test_empty_replies_that_replay_alike_still_train_in_one_sample(qwen_tokenizer, protocol):
    """Two replies with nothing of their own (one only an empty think block, one a bare end
    of turn) replay alike; the messages before each tell them apart, so the session stays
    one sample and every sampled token trains (the replayed conversation is recorded as the
    chain recorded it)."""
    session = GeneratedSession(
        protocol=protocol,
        user_text=True,
        turns=(
            GeneratedTurn(ModelTurn(reasoning="", text=""), rewrite=False),
            GeneratedTurn(ModelTurn(reasoning=None, text=""), rewrite=False),
            GeneratedTurn(ModelTurn(reasoning=None, text="step 2"), rewrite=False),
        ),
        subagent_after=None,
        compact_before=None,
    )
    _driver, engine, samples = asyncio.run(drive_http_session(qwen_tokenizer, session))
    assert len(samples) == 1
    (sample,) = samples
    fallbacks = [m.get("splice_fallback") for m in sample.metadata["turn_metadata"].values()]
    assert fallbacks == ["new_chain", None, None]
    assert sum(sample.loss_mask) == sum(len(call.output_ids) for call in engine.calls)


def test_plan_digests_only_new_or_changed_messages(qwen_tokenizer, monkeypatch):
    """A request that replays the conversation recorded last reuses its messages' digests:
    only the new and the edited messages are digested, the digests equal fresh ones, and
    the spliced ids are the chain's ids plus the seam (an array, no tuple copy)."""
    from array import array

    from agentrl.prompts import splice as splice_module

    splicer = Splicer(qwen_tokenizer, {}, frozenset({151645}))
    ledger = SpliceLedger()
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    plan = splicer.plan(ledger, first, TOOLS)
    output = [*ids_of(qwen_tokenizer, "answer"), 151645]
    response = {"role": "assistant", "content": "answer"}
    prompt_ids = render_full(qwen_tokenizer, first, TOOLS)
    ledger.add(0, plan, prompt_ids, output, response, first)
    digested = []
    real = splice_module._digest
    monkeypatch.setattr(splice_module, "_digest", lambda v: digested.append(v) or real(v))
    replay = [*(dict(m) for m in first), dict(response), {"role": "tool", "content": "r"}]
    spliced = splicer.plan(ledger, replay, [dict(t) for t in TOOLS])
    assert digested == [replay[-1]]
    assert spliced.history == tuple(real(m) for m in replay)
    assert isinstance(spliced.prompt.ids, array)
    assert list(spliced.prompt.ids) == [*prompt_ids, *output, *spliced.seam_ids]
    digested.clear()
    edited = [replay[0], {"role": "user", "content": "q2"}, *replay[2:]]
    assert splicer.plan(ledger, edited, TOOLS).reason == "history_changed"
    assert digested == [edited[1], edited[-1]]

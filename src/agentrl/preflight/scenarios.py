"""The scripted sessions ``agentrl preflight`` and ``benchmarks/yield.py`` run.

A :class:`Scenario` is one agent session as a Qwen3-style policy would play it: each
:class:`ModelTurn` is what the model samples (an optional ``<think>`` block, text, tool
calls, exactly as Qwen3 writes them, or cut by ``length``) and what the client sends back
(each call's tool result, new user text). A call may run a sub-agent: the client runs
that conversation first (its own system prompt, its own history) and answers the call
with the sub-agent's last text. The library, :data:`SCENARIOS`, covers what makes a
re-rendered prompt drift from what was sampled: reasoning on and off, user text every turn
or never, parallel calls, whitespace around thinking and text, empty think blocks, a
client that re-orders tool input keys on replay, a sub-agent, and outputs cut by
``length``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "SCENARIOS",
    "TOOLS",
    "ModelTurn",
    "Scenario",
    "ToolUse",
    "completion_text",
    "scenario_named",
]


def _tool(summary: str, required: tuple[str, ...], /, **fields: tuple[str, str]) -> Any:
    """A tool as (description, JSON schema); ``fields`` are name=(type, description)."""
    properties = {
        name: {"type": kind, "description": text} for name, (kind, text) in fields.items()
    }
    return summary, {"type": "object", "properties": properties, "required": list(required)}


#: The tools every scenario offers, by neutral name: (description, JSON schema). Schema
#: property order is the order a client that re-orders replayed inputs puts them in.
TOOLS: Mapping[str, tuple[str, dict[str, Any]]] = {
    "shell": _tool(
        "Run a shell command in the workspace and return its output.",
        ("command",),
        command=("string", "The command to run."),
        description=("string", "What it does, briefly."),
        timeout=("number", "Seconds before it is killed."),
    ),
    "read": _tool(
        "Read a file from the workspace.",
        ("file_path",),
        file_path=("string", "Absolute path."),
        offset=("integer", "First line to read."),
        limit=("integer", "How many lines."),
    ),
    "write": _tool(
        "Write a file in the workspace, replacing what was there.",
        ("file_path", "content"),
        file_path=("string", "Absolute path."),
        content=("string", "The whole new content."),
    ),
    "agent": _tool(
        "Launch a sub-agent for a self-contained task; returns its final report.",
        ("description", "prompt"),
        description=("string", "A short task title."),
        prompt=("string", "The task, in full."),
    ),
}


@attrs.frozen(kw_only=True)
class ToolUse:
    """One tool call the model makes, and the result the client sends back for it.

    ``arguments`` are in the order the model writes them. ``subagent`` (with ``tool``
    ``"agent"``) is the conversation the client runs before answering; its last text is
    the result.
    """

    tool: str = attrs.field(validator=attrs.validators.in_(tuple(TOOLS)))
    arguments: dict[str, Any] = attrs.field(factory=dict)
    result: str = ""
    subagent: tuple[ModelTurn, ...] = ()


@attrs.frozen(kw_only=True)
class ModelTurn:
    """What the policy samples in one turn, and what the client says next.

    ``reasoning`` None writes no think block (the prompt opened one, or the model skipped
    it); ``""`` writes the empty ``<think>\\n\\n</think>`` Qwen3 samples with thinking off.
    ``padding`` goes around the reasoning and the text inside the sampled output (models
    do write ``<think>\\n  X  \\n</think>``). ``cut_after`` ends the output after that many
    tokens with finish reason ``length`` and no stop token. ``user_text`` is the user
    message the client sends after this turn (with the tool results, if any); a turn with
    neither calls nor ``user_text`` ends its conversation.
    """

    reasoning: str | None = None
    text: str = ""
    calls: tuple[ToolUse, ...] = ()
    padding: str = ""
    cut_after: int | None = None
    user_text: str | None = None


@attrs.frozen(kw_only=True)
class Scenario:
    """One scripted session: the task, what the model does turn by turn, how the client behaves."""

    name: str
    description: str
    prompt: str
    turns: tuple[ModelTurn, ...]
    #: Chat template keyword arguments (``{"enable_thinking": False}``).
    chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    #: The client replays tool inputs with their keys in schema order (Claude Code does).
    reorder_replayed_keys: bool = False


def completion_text(turn: ModelTurn, tool_names: Mapping[str, str] | None = None) -> str:
    """The text a Qwen3-style model samples for ``turn``, without the stop token.

    It is laid out as the Qwen3 chat template renders an assistant message (think block,
    text, then each ``<tool_call>`` on its own lines), so a template that keeps everything
    re-renders it exactly, except for what the turn's ``padding`` adds. ``tool_names``
    maps each neutral tool name to the name the client offers it under.
    """
    names = tool_names or {}
    pad = turn.padding
    out = ""
    if turn.reasoning is not None:
        inner = f"{pad}{turn.reasoning}{pad}" if turn.reasoning else ""
        out += f"<think>\n{inner}\n</think>\n\n"
    text = f"{pad}{turn.text}{pad}" if turn.text else ""
    out += text
    for index, call in enumerate(turn.calls):
        if index or text:
            out += "\n"
        payload = json.dumps(
            {"name": names.get(call.tool, call.tool), "arguments": call.arguments},
            ensure_ascii=False,
        )
        out += f"<tool_call>\n{payload}\n</tool_call>"
    return out


def _shell(command: str, description: str, result: str, **extra: Any) -> ToolUse:
    # Written description-first: a client that re-orders to schema order moves it.
    arguments = {"description": description, "command": command, **extra}
    return ToolUse(tool="shell", arguments=arguments, result=result)


def _read(path: str, result: str) -> ToolUse:
    return ToolUse(tool="read", arguments={"file_path": path}, result=result)


def _write(path: str, content: str) -> ToolUse:
    return ToolUse(
        tool="write",
        arguments={"content": content, "file_path": path},
        result=f"File created successfully at: {path}",
    )


_REMINDER = (
    "<system-reminder>\nKeep the todo list current; mark finished steps done.\n</system-reminder>"
)
_SOURCE = '"""Greeting helpers."""\n\n\ndef greet(name):\n    return "hello " + name\n'
_TEST = "def test_greet():\n    assert greet('x') == 'Hello x'\n"


def _fix_session(*, reasoning: bool, user_text: str | None, padding: str = "") -> tuple:
    """Four turns that read, test, fix and report (the backbone of most scenarios)."""
    think = (lambda s: s) if reasoning else (lambda s: None)
    return (
        ModelTurn(
            reasoning=think("The task names greet(); I should read the module first."),
            text="Let me look at the code.",
            calls=(_read("/workspace/repo/greet.py", _SOURCE),),
            padding=padding,
            user_text=user_text,
        ),
        ModelTurn(
            reasoning=think("greet() lowercases the greeting; the test expects 'Hello'."),
            text="I'll run the tests to confirm.",
            calls=(_shell("python -m pytest -q", "Run the tests", "1 failed, 3 passed"),),
            padding=padding,
            user_text=user_text,
        ),
        ModelTurn(
            reasoning=think("One failure, as expected. Capitalise the greeting."),
            text="Fixing the greeting.",
            calls=(_write("/workspace/repo/greet.py", _SOURCE.replace('"hello "', '"Hello "')),),
            padding=padding,
            user_text=user_text,
        ),
        ModelTurn(
            reasoning=think("The fix is in; the tests should pass now."),
            text="greet() now returns 'Hello <name>', which is what the test expects.",
            padding=padding,
        ),
    )


def _parallel_session() -> tuple[ModelTurn, ...]:
    return (
        ModelTurn(
            reasoning="Two files matter: the module and its test. Read both at once.",
            text="Reading the module and its test.",
            calls=(
                _read("/workspace/repo/greet.py", _SOURCE),
                _read("/workspace/repo/test_greet.py", _TEST),
            ),
        ),
        ModelTurn(
            reasoning="Check the git state and run the tests in parallel.",
            calls=(
                _shell("git status --short", "Show changes", ""),
                _shell("python -m pytest -q", "Run the tests", "1 failed", timeout=120),
            ),
        ),
        ModelTurn(
            reasoning="The test wants a capital H.",
            text="The test expects 'Hello'; the module writes 'hello'.",
        ),
    )


def _subagent_session() -> tuple[ModelTurn, ...]:
    sub = (
        ModelTurn(
            reasoning="I am the sub-agent: list the tests, nothing else.",
            calls=(_shell("ls tests", "List the tests", "test_greet.py\ntest_util.py"),),
        ),
        ModelTurn(
            reasoning="Two test files; report them.",
            text="There are two test files: test_greet.py and test_util.py.",
        ),
    )
    agent = ToolUse(
        tool="agent",
        arguments={"description": "List tests", "prompt": "List the test files under tests/."},
        subagent=sub,
    )
    return (
        ModelTurn(
            reasoning="A sub-agent can survey the tests while I keep my context small.",
            text="I'll ask a sub-agent to survey the tests.",
            calls=(agent,),
        ),
        ModelTurn(
            reasoning="The sub-agent found two test files; read the greeting test.",
            calls=(_read("/workspace/repo/tests/test_greet.py", _TEST),),
        ),
        ModelTurn(
            reasoning="Enough to answer.",
            text="The greeting test checks greet('x') == 'Hello x'.",
        ),
    )


def _length_session() -> tuple[ModelTurn, ...]:
    long_text = (
        "Here is the plan in detail. First, read the module and note every caller of "
        "greet(); then update the greeting, run the whole test suite, and finally write a "
        "short summary of the change for the pull request description."
    )
    return (
        ModelTurn(
            reasoning="Plan before acting.",
            text=long_text,
            cut_after=24,
            user_text="You were cut off. Continue from where you stopped.",
        ),
        ModelTurn(
            reasoning="Carry on with the plan: read the module.",
            calls=(_read("/workspace/repo/greet.py", _SOURCE),),
        ),
        ModelTurn(
            reasoning="The module is small; the plan stands.",
            text=long_text,
            cut_after=16,
        ),
    )


_PROMPT = "The test test_greet fails. Fix greet() in /workspace/repo/greet.py."

#: Every scenario, in the order reports list them.
SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="tools_reasoning",
        description="reasoning on, tool calls and results, no user text after the task",
        prompt=_PROMPT,
        turns=_fix_session(reasoning=True, user_text=None),
    ),
    Scenario(
        name="reasoning_user_text",
        description="reasoning on, new user text (a reminder) with every tool result",
        prompt=_PROMPT,
        turns=_fix_session(reasoning=True, user_text=_REMINDER),
    ),
    Scenario(
        name="no_reasoning",
        description="thinking on but skipped: the model samples an empty think block",
        prompt=_PROMPT,
        turns=tuple(
            attrs.evolve(t, reasoning="") for t in _fix_session(reasoning=False, user_text=None)
        ),
    ),
    Scenario(
        name="thinking_disabled",
        description="enable_thinking=False: the prompt opens an empty think block",
        prompt=_PROMPT,
        turns=_fix_session(reasoning=False, user_text=_REMINDER),
        chat_template_kwargs={"enable_thinking": False},
    ),
    Scenario(
        name="parallel_calls",
        description="two tool calls in one turn, both results in the next request",
        prompt=_PROMPT,
        turns=_parallel_session(),
    ),
    Scenario(
        name="whitespace",
        description="spaces around the reasoning and the text inside the sampled output",
        prompt=_PROMPT,
        turns=_fix_session(reasoning=True, user_text=None, padding="  "),
    ),
    Scenario(
        name="reordered_keys",
        description="the client replays tool inputs with their keys in schema order",
        prompt=_PROMPT,
        turns=_fix_session(reasoning=True, user_text=None),
        reorder_replayed_keys=True,
    ),
    Scenario(
        name="subagent",
        description="a sub-agent conversation inside the session, its report as a tool result",
        prompt=_PROMPT,
        turns=_subagent_session(),
    ),
    Scenario(
        name="length_cut",
        description="outputs cut by length (no stop token), the client asks to continue",
        prompt=_PROMPT,
        turns=_length_session(),
    ),
)


def scenario_named(name: str) -> Scenario:
    """The scenario called ``name`` (``KeyError`` listing the names otherwise)."""
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    names = ", ".join(s.name for s in SCENARIOS)
    raise KeyError(f"no preflight scenario {name!r}; choose from {names}")

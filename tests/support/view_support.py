"""The view tests' runs: a crafted session through the real trajectory manager and runner.

:func:`crafted_run` writes an output directory the way ``agentrl rollout`` does (the real
:class:`~agentrl.rollout.runner.Runner`), holding one rollout whose session has a main
agent, a sub-agent it spawned with a ``Task`` call, a side request, a REALIGN and a FORK
(the real :class:`~agentrl.trajectory.TrajectoryManager` linearises it), and one
``infra_error`` rollout, so the run page has a failure to group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
from typing import Any

import attrs
import pytest

from agentrl.rollout.runner import Runner
from agentrl.trajectory import TrajectoryManager, TurnRecord
from agentrl.types import Grade, Outcome, Task, TurnFact

SESSION_TASK = "crafted-1"
FAILING_TASK = "broken-1"
LONG_TASK = "long-1"
#: A host name the browser fixture resolves to 127.0.0.1, as a DNS-rebinding attacker's does.
REBIND_HOST = "rebind.test"


@attrs.frozen
class CraftedResult:
    """A rollout result with the attribute names of ``agentrl.rollout.RolloutResult``."""

    instance_id: str
    outcome: Outcome
    reward: float
    samples: tuple = ()
    turn_facts: tuple = ()
    diff: str = ""
    agent_log: str = ""
    error: str | None = None
    grade: Grade | None = None
    timings: dict = attrs.Factory(dict)

    @property
    def remove_sample(self) -> bool:
        return not self.outcome.trainable

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "session_id": f"{self.instance_id}-s",
            "harness": "claude_code",
            "outcome": self.outcome.value,
            "reward": self.reward,
            "agent_exit_code": 0,
            "turns": len(self.turn_facts),
            "sampled_tokens": sum(f.output_tokens for f in self.turn_facts),
            "timings": dict(self.timings),
            "grade": None
            if self.grade is None
            else {
                "reward": self.grade.reward,
                "applied_cleanly": self.grade.applied_cleanly,
                "error": self.grade.error,
                "details": dict(self.grade.details),
            },
            "error": self.error,
            "diff": self.diff,
            "agent_log": self.agent_log,
        }


class _Session:
    """Records turns into a trajectory manager and keeps the middleware's facts of each."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.manager = TrajectoryManager(fork_threshold_tokens=64)
        self.facts: list[TurnFact] = []

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def turn(self, prompt: list[int], output_text: str, messages, response, *, tools=(), **meta):
        output = self.ids(output_text)
        index = len(self.facts)
        self.manager.record_turn(
            "s",
            TurnRecord(
                prompt_ids=prompt,
                output_ids=output,
                output_logprobs=[
                    -0.05 * (k % 7) - (3.0 if k == 2 else 0.0) for k in range(len(output))
                ],
            ),
            prompt_messages=messages,
            response_message=response,
            metadata={"middleware_turn": index, "engine_seconds": 0.25, **meta},
        )
        self.facts.append(
            TurnFact(
                prompt_tokens=len(prompt),
                output_tokens=len(output),
                finish_reason="stop",
                index=index,
                tool_calls=tuple(tools),
                ill_formed=False,
                engine_seconds=0.25,
                started=1000.0 + index,
            )
        )
        return prompt + output


def _assistant(text: str, tool: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool:
        message["tool_calls"] = [{"function": {"name": tool, "arguments": "{}"}}]
    return message


def crafted_session(tokenizer: Any) -> CraftedResult:
    """The crafted rollout: main agent, sub-agent, side request, a REALIGN and a FORK."""
    s = _Session(tokenizer)
    system = {"role": "system", "content": "You are a coding agent."}
    user = {"role": "user", "content": "Fix the bug in words()."}
    side = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "bug"}]
    s.turn(s.ids("<title request>"), "Fix words", side, _assistant("Fix words"))
    a1 = _assistant("I'll ask a sub-agent.", "Task")
    head = s.ids("<|im_start|>system\nYou are a coding agent.\n<|im_start|>user\nFix the bug.\n")
    seq1 = s.turn(
        head,
        "I'll ask a sub-agent to look.<tool_call>Task</tool_call>",
        [system, user],
        a1,
        tools=["Task"],
        prompt_mode="splice",
    )
    sub_system = {"role": "system", "content": "You are a sub-agent."}
    sub_user = {"role": "user", "content": "List the tests."}
    b1 = _assistant("Reading.", "Read")
    sub_head = s.ids(
        "<|im_start|>system\nYou are a sub-agent.\n<|im_start|>user\nList the tests.\n"
    )
    sub1 = s.turn(
        sub_head,
        "Reading.<tool_call>Read</tool_call>",
        [sub_system, sub_user],
        b1,
        tools=["Read"],
        prompt_mode="splice",
    )
    sub_result = {"role": "tool", "content": "tests/test_words.py"}
    s.turn(
        sub1 + s.ids("\ntests/test_words.py\n"),
        "There is one test file.",
        [sub_system, sub_user, b1, sub_result],
        _assistant("There is one test file."),
        prompt_mode="splice",
    )
    result1 = {"role": "tool", "content": "one test file"}
    a2 = _assistant("Reading the module.", "Read")
    seq2 = s.turn(
        seq1 + s.ids("\n<tool_response>one test file</tool_response>\n"),
        "Reading the module now.<tool_call>Read</tool_call>",
        [system, user, a1, result1],
        a2,
        tools=["Read"],
        prompt_mode="splice",
    )
    # The next prompt holds turn 4's response re-tokenised: its last tokens differ (REALIGN).
    drifted = seq2[:-3] + s.ids(" (re-rendered)")
    result2 = {"role": "tool", "content": "def words(): ..."}
    a3 = _assistant("Editing.", "Edit")
    seq3 = s.turn(
        drifted + s.ids("\n<tool_response>def words(): ...</tool_response>\n"),
        "Editing.<tool_call>Edit</tool_call>",
        [system, user, a1, result1, a2, result2],
        a3,
        tools=["Edit"],
        prompt_mode="render",
        splice_fallback="new_chain",
    )
    # The system prompt changes under the client's feet: the prompt diverges early (FORK).
    forked = (
        seq3[:3] + s.ids(" CHANGED ") + seq3[3:] + s.ids("\n<tool_response>ok</tool_response>\n")
    )
    result3 = {"role": "tool", "content": "ok"}
    s.turn(
        forked,
        "The bug is fixed.",
        [system, user, a1, result1, a2, result2, a3, result3],
        _assistant("The bug is fixed."),
        prompt_mode="render",
    )
    samples = s.manager.get_trajectory("s", reward=1.0, metadata={"session_id": "s"})
    return CraftedResult(
        instance_id=SESSION_TASK,
        outcome=Outcome.SOLVED,
        reward=1.0,
        samples=tuple(samples),
        turn_facts=tuple(s.facts),
        diff="diff --git a/w.py b/w.py\n-    a.split(' ')\n+    a.split()\n",
        agent_log='{"type":"result","result":"The bug is fixed."}\n',
        grade=Grade(
            reward=1.0, solved=True, applied_cleanly=True, details={"passed": 3, "failed": 0}
        ),
        timings={
            "boot": 1.0,
            "prepare": 0.5,
            "install": 0.2,
            "agent": 4.0,
            "grade": 2.0,
            "total": 8.0,
        },
    )


def long_prompt_session(tokenizer: Any, prompt_words: int = 3000) -> CraftedResult:
    """A one-turn rollout whose prompt is a long system prompt (``prompt_words`` words,
    about as many tokens): the tokens trained start far below the top of its sample."""
    s = _Session(tokenizer)
    system = {"role": "system", "content": "rules " * prompt_words}
    user = {"role": "user", "content": "Fix it."}
    prompt = s.ids("<|im_start|>system\n" + system["content"] + "\n<|im_start|>user\nFix it.\n")
    s.turn(prompt, "Done: the fix is in.", [system, user], _assistant("Done: the fix is in."))
    samples = s.manager.get_trajectory("s", reward=1.0, metadata={"session_id": "s"})
    return CraftedResult(
        instance_id=LONG_TASK,
        outcome=Outcome.SOLVED,
        reward=1.0,
        samples=tuple(samples),
        turn_facts=tuple(s.facts),
        timings={"agent": 1.0, "total": 2.0},
    )


def on_node(result: Any, node: str, ip: str, lost: tuple[tuple[str, str], ...] = ()) -> Any:
    """``result`` as a Ray node sends it back (:class:`~agentrl.rollout.ray_node.NodeResult`):
    ran on ``node`` at ``ip`` after the dispatches in ``lost`` ((node, error) pairs) died."""
    from agentrl.rollout.ray_node import NodeResult

    return NodeResult(
        result=result,
        node_id=node,
        node_ip=ip,
        rescheduled=tuple({"node_id": n, "error": e} for n, e in lost),
    )


def write_run(out: pathlib.Path, results: dict[str, Any], tokenizer: str | None) -> None:
    """Commit ``results`` (by task id) with the real runner, as ``agentrl rollout`` does."""
    tasks = [Task(instance_id=task, problem_statement=f"Problem of {task}") for task in results]

    async def rollout(task: Task, index: int) -> CraftedResult:
        return results[task.instance_id]

    async def run() -> None:
        runner = Runner(rollout, out, concurrency=1, tokenizer=tokenizer)
        await runner.run(runner.plan(tasks, 1))

    asyncio.run(run())


def crafted_run(out: pathlib.Path, tokenizer: Any, tokenizer_dir: pathlib.Path) -> pathlib.Path:
    """An output directory with the crafted session and an ``infra_error`` rollout."""
    failing = CraftedResult(
        instance_id=FAILING_TASK,
        outcome=Outcome.INFRA_ERROR,
        reward=0.0,
        error="sandbox boot failed after 3 attempts: connection refused (port 4711)",
        agent_log="boot failed\n",
        timings={"boot": 30.0, "total": 30.0},
    )
    write_run(
        out, {SESSION_TASK: crafted_session(tokenizer), FAILING_TASK: failing}, str(tokenizer_dir)
    )
    return out


@pytest.fixture(scope="session")
def crafted_dir(tmp_path_factory, qwen_tokenizer, qwen_tokenizer_dir) -> pathlib.Path:
    """A crafted output directory (see :func:`crafted_run`); tests only read it."""
    return crafted_run(tmp_path_factory.mktemp("view") / "run", qwen_tokenizer, qwen_tokenizer_dir)


@pytest.fixture(scope="session")
def crafted_source(crafted_dir):
    """The crafted directory opened once (the tokenizer loads in seconds)."""
    from agentrl.view import RunSource

    return RunSource.open(crafted_dir)


CHROMIUM = os.environ.get("AGENTRL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
REPO = pathlib.Path(__file__).resolve().parents[2]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the browser tests must run in CI: {reason}")
    print(f"\nskipping the browser tests: {reason}")
    pytest.skip(reason)


def screenshot_dir() -> pathlib.Path:
    """Where the browser tests put screenshots (``AGENTRL_SCREENSHOT_DIR``, CI prints them)."""
    path = pathlib.Path(os.environ.get("AGENTRL_SCREENSHOT_DIR") or REPO / ".cache" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        _unavailable(f"chromium is not installed at {CHROMIUM} (apt: chromium)")


@pytest.fixture
async def browser():
    """Headless Debian chromium driven by playwright (missing: skipped, or failed under CI).

    It resolves :data:`REBIND_HOST` to 127.0.0.1, as a DNS-rebinding attacker's name does."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
    _require_chromium()
    async with async_playwright() as p:
        instance = await p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", f"--host-resolver-rules=MAP {REBIND_HOST} 127.0.0.1"],
            headless=True,
        )
        try:
            yield instance
        finally:
            await instance.close()


async def open_page(browser, url: str, width: int = 1280, height: int = 900):
    """A new page at ``url``, its script errors collected in ``page.errors``."""
    page = await browser.new_page(viewport={"width": width, "height": height})
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("console", lambda msg: msg.type == "error" and page.errors.append(msg.text))
    await page.goto(url)
    await page.wait_for_selector("body[data-ready]")
    return page


async def goto_hash(page, fragment: str) -> None:
    """Follow an in-page link (``#/…``) and wait for the page to be drawn."""
    await page.evaluate("f => { location.hash = f; }", fragment)
    await page.wait_for_selector(f"body[data-ready={json.dumps(fragment)}]")


async def screenshot(page, name: str) -> pathlib.Path:
    """A full-page screenshot into :func:`screenshot_dir`; its path is printed."""
    path = screenshot_dir() / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


@contextlib.asynccontextmanager
async def viewer(*sources: Any, poll_seconds: float = 0.1, host: str = "127.0.0.1"):
    """The real viewer server (``agentrl view``'s) over ``sources`` on ``host``, a free
    port; it looks for new rollouts every ``poll_seconds``."""
    from agentrl.view.server import ViewServer

    server = ViewServer(list(sources), host=host, poll_seconds=poll_seconds)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def crafted_token_text(tokenizer: Any) -> Any:
    """Per-token text of ``tokenizer`` (a run written without a tokenizer path)."""
    from agentrl.view.tokens import TokenText

    return TokenText(tokenizer)

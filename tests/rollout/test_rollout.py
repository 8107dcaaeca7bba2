"""End-to-end rollouts: the real Claude Code and Codex CLIs in the real local sandbox.

The model is the scripted SGLang engine (the test double for a GPU server; it speaks
SGLang's HTTP protocol): its replies are what a Qwen3 policy would sample, in the ``hermes``
tool-call format of Qwen3's chat template (the parser the middleware is given), naming each CLI's real tools with
their real argument schemas. Everything else is real: the middleware and its adapters,
the Qwen3 tokenizer and chat template, bubblewrap, the CLIs from npm
(``agentrl install-clis``), git, the scaleswe grader and an example task.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import pytest
from rollout_support import (
    BUGGY,
    CLI_DIR,
    CORE,
    DONE,
    FIXED,
    RUN_TESTS,
    SANDBOX_PORT,
    claude_solution,
    claude_thinking_solution,
    codex_solution,
    codex_thinking_solution,
    textstats_task,
    tool_call,
)

from agentrl import plugins
from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.codex import CodexHarness
from agentrl.rollout import DEFAULT_PROMPT, RolloutConfig, RolloutResult, render_prompt, run_rollout
from agentrl.sandboxes.local import LocalSandbox, processes_in_namespace
from agentrl.serve.middleware import Middleware
from agentrl.testing.scripted_engine import ScriptedReply
from agentrl.testing.stack import started_middleware
from agentrl.types import Outcome, Task

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks" / "scaleswe.jsonl"


@pytest.fixture(scope="module")
def task():
    """The textstats example task (eval_cmd grading), parsed by the scaleswe grader."""
    return textstats_task()


@pytest.fixture
def middleware(agentrl_middleware):
    """The shipped middleware fixture: TCP and a unix socket, in front of the scripted engine."""
    return agentrl_middleware


def _cli_binds() -> tuple[dict[str, str], dict[str, str]]:
    if not (CLI_DIR / "bin" / "claude").exists() or not (CLI_DIR / "bin" / "codex").exists():
        pytest.fail(
            f"the agent CLIs are not installed in {CLI_DIR}; run `agentrl install-clis --dest .cache/clis` "
            "(or set AGENTRL_CLI_DIR to an install holding bin/claude and bin/codex)"
        )
    binds, claude = ClaudeCodeHarness.host_install(CLI_DIR)
    _, codex = CodexHarness.host_install(CLI_DIR)
    return binds, {"claude_code": claude, "codex": codex}


class Sandboxes:
    """A local-sandbox factory that remembers every sandbox it built."""

    def __init__(self, middleware: Middleware) -> None:
        binds, self.cli_paths = _cli_binds()
        self.options = {
            "services": {SANDBOX_PORT: middleware.unix_path},
            "ro_binds": binds,
            "host_python": True,  # this interpreter (and its pytest), bound read-only
        }
        self.built: list[LocalSandbox] = []

    def __call__(self, task) -> LocalSandbox:
        sandbox = LocalSandbox.from_task(task, **self.options)
        self.built.append(sandbox)
        return sandbox

    def harness(self, name: str, **kwargs):
        cls = {"claude_code": ClaudeCodeHarness, "codex": CodexHarness}[name]
        return cls(cli_path=self.cli_paths[name], extra_args=(), extra_env={}, **kwargs)


@pytest.fixture
def sandboxes(middleware):
    """The sandbox factory for this test's middleware."""
    return Sandboxes(middleware)


def config(**overrides) -> RolloutConfig:
    values = {"agent_time_budget": 180, "eval_timeout": 120, "middleware_port": SANDBOX_PORT}
    return RolloutConfig(**{**values, **overrides})


async def rollout(task, harness, sandboxes, middleware, **kwargs) -> RolloutResult:
    return await run_rollout(
        task,
        harness=harness,
        grader=ScaleSWEGrader(),
        sandbox_factory=sandboxes,
        middleware=middleware,
        config=kwargs.pop("config", None) or config(),
        **kwargs,
    )


def assert_trained_tokens_were_sampled(result: RolloutResult, engine, session_id: str) -> None:
    """Every trained position holds a token the engine sampled there, with its log-prob."""
    served = [s for s in engine.served if s.routing_key == session_id and s.output_ids]
    assert served, "the engine served no tokens for this session"
    sampled = [list(zip(s.output_ids, s.logprobs, strict=True)) for s in served]
    trained_total = 0
    for sample in result.samples:
        assert len(sample.loss_mask) == len(sample.rollout_logprobs) == sample.response_length
        response = list(sample.tokens[sample.prompt_length :])
        run: list[tuple[int, float]] = []
        for position, mask in enumerate([*sample.loss_mask, 0]):
            if mask:
                run.append((response[position], sample.rollout_logprobs[position]))
                continue
            if run:
                assert any(_contains(output, run) for output in sampled), (
                    f"trained run of {len(run)} tokens at {position} is not an engine output"
                )
                trained_total += len(run)
                run = []
    # A linear session: every sampled token is trained exactly once.
    assert trained_total == sum(len(s.output_ids) for s in served)


def _contains(haystack: list, needle: list) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def claude_solution_natural() -> list[str]:
    """The same fix with arguments as a model writes them, which Claude Code rewrites on replay.

    Claude Code replays the Edit with ``replace_all`` added and the Bash command without its
    leading ``cd``; the middleware restores the recorded messages, so nothing is lost.
    """
    return [
        "Let me look at how words are split.\n" + tool_call("Read", file_path=CORE),
        tool_call("Edit", file_path=CORE, old_string=BUGGY, new_string=FIXED),
        tool_call("Bash", command=f"cd /workspace && {RUN_TESTS}", description="Run the tests"),
        DONE,
    ]


async def test_claude_code_rewritten_replays_still_train_every_token(
    task, sandboxes, middleware, scripted_engine
):
    """Claude Code's replay rewrites (replace_all, dropped cd) cost no trained tokens."""
    for reply in claude_solution_natural():
        scripted_engine.queue(reply)
    result = await rollout(task, sandboxes.harness("claude_code"), sandboxes, middleware)

    assert result.outcome is Outcome.SOLVED, result.error
    assert len(result.samples) == 1
    restored = [
        index
        for meta in result.samples[0].metadata["turn_metadata"].values()
        for index in meta["restored_replays"]
    ]
    assert restored, "Claude Code replayed its history verbatim; the rewrite was not exercised"
    assert_trained_tokens_were_sampled(result, scripted_engine, result.session_id)


class HookedClaudeCode(ClaudeCodeHarness):
    """Claude Code with a ``PostToolUse`` hook that adds context after every tool call.

    Claude Code sends the hook's ``additionalContext`` as a ``<system-reminder>`` text
    block next to the tool result: new user text on every turn, as a user steering the
    agent mid-session would send it.
    """

    CONTEXT = "Keep changes minimal."

    def config_files(self, ctx):
        files = super().config_files(ctx)
        path = f"{self.home}/.claude/settings.json"
        settings = json.loads(files[path])
        output = {"hookSpecificOutput": {"hookEventName": "PostToolUse"}}
        output["hookSpecificOutput"]["additionalContext"] = self.CONTEXT
        hook = {"type": "command", "command": f"echo '{json.dumps(output)}'"}
        settings["hooks"] = {"PostToolUse": [{"matcher": "", "hooks": [hook]}]}
        files[path] = json.dumps(settings, indent=2) + "\n"
        return files


@pytest.fixture
async def render_middleware(agentrl_sglang_engine, qwen_tokenizer):
    """A second middleware in ``render`` mode, in front of the same scripted engine."""
    with tempfile.TemporaryDirectory(prefix="agentrl-mw-") as scratch:
        async with started_middleware(
            agentrl_sglang_engine,
            qwen_tokenizer,
            unix_path=f"{scratch}/mw.sock",
            prompt_mode="render",
        ) as render:
            yield render


def trained_and_sampled(result: RolloutResult, engine) -> tuple[int, int]:
    """Tokens the result's samples train, and tokens the engine sampled for its session."""
    served = [s for s in engine.served if s.routing_key == result.session_id]
    return sum(sum(s.loss_mask) for s in result.samples), sum(len(s.output_ids) for s in served)


def turn_meta(result: RolloutResult) -> dict[int, dict]:
    """Each middleware turn's metadata, over the result's samples."""
    return {
        meta["middleware_turn"]: meta
        for sample in result.samples
        for meta in sample.metadata["turn_metadata"].values()
    }


async def both_modes(task, harness, solution, middleware, render, engine):
    """The same scripted run through the splice middleware, then the render one."""
    results = []
    for mode, front in (("splice", middleware), ("render", render)):
        for reply in solution:
            engine.queue(reply)
        result = await rollout(task, harness, Sandboxes(front), front, session_id=f"{mode}-run")
        assert result.outcome is Outcome.SOLVED, (mode, result.error, result.agent_log[-2000:])
        assert engine.pending() == 0 and result.turns == len(solution)
        results.append(result)
    return results


def assert_spliced_into_one_sample(result: RolloutResult, engine) -> None:
    """One sample, every sampled token trained, its tokens the last prompt plus its output."""
    trained, sampled = trained_and_sampled(result, engine)
    assert len(result.samples) == 1 and trained == sampled
    last = [s for s in engine.served if s.routing_key == result.session_id][-1]
    assert result.samples[0].tokens == last.input_ids + last.output_ids
    meta = turn_meta(result)
    assert meta[0]["splice_fallback"] == "new_chain"
    assert [meta[t]["prompt_mode"] for t in sorted(meta)[1:]] == ["splice"] * (len(meta) - 1)
    assert_trained_tokens_were_sampled(result, engine, result.session_id)


@pytest.mark.slow
async def test_claude_code_thinking_and_reordered_inputs_train_every_token(
    task, sandboxes, middleware, render_middleware, scripted_engine
):
    """Thinking, whitespace around it and the text, and Read/Edit/Bash inputs out of schema
    order: splice mode trains every sampled token in one sample.

    Claude Code replays each reply re-ordered (restored through the minted wire ids). In a
    headless run it sends only tool results between turns, so Qwen3's template keeps the
    thinking and render mode, with the restored replays, trains every token too: equal.
    """
    splice, render = await both_modes(
        task,
        sandboxes.harness("claude_code"),
        claude_thinking_solution(),
        middleware,
        render_middleware,
        scripted_engine,
    )
    assert_spliced_into_one_sample(splice, scripted_engine)
    restored = [i for meta in turn_meta(splice).values() for i in meta["restored_replays"]]
    assert restored, "Claude Code replayed its history verbatim; the re-ordering was not exercised"
    assert trained_and_sampled(render, scripted_engine) == trained_and_sampled(
        splice, scripted_engine
    )


@pytest.mark.slow
async def test_claude_code_new_user_text_every_turn_trains_every_token_only_when_spliced(
    task, sandboxes, middleware, render_middleware, scripted_engine
):
    """A hook's context (new user text) after every tool result, with thinking each turn.

    Splice mode: one sample, every sampled token trained. Render mode: Qwen3's template
    drops every earlier ``<think>`` once a later user message exists, so each turn
    realigns the previous ones and only the last turn's tokens train.
    """
    harness = HookedClaudeCode(
        cli_path=sandboxes.cli_paths["claude_code"], extra_args=(), extra_env={}
    )
    splice, render = await both_modes(
        task, harness, claude_thinking_solution(), middleware, render_middleware, scripted_engine
    )
    last_prompt = scripted_engine.tokenizer.decode(list(scripted_engine.served[3].input_ids))
    assert last_prompt.count(HookedClaudeCode.CONTEXT) == 3, "the hook's context was not sent"
    assert_spliced_into_one_sample(splice, scripted_engine)
    trained, sampled = trained_and_sampled(render, scripted_engine)
    last = [s for s in scripted_engine.served if s.routing_key == render.session_id][-1]
    assert trained == len(last.output_ids) < sampled


@pytest.mark.slow
async def test_codex_thinking_trains_every_token(
    task, sandboxes, middleware, render_middleware, scripted_engine
):
    """Codex with thinking, whitespace and ``workdir`` before ``cmd``: all trained, spliced.

    Codex sends only function-call outputs between turns, so Qwen3 keeps the thinking and
    render mode (exact sampled text kept in the recorded messages) trains every token too.
    """
    splice, render = await both_modes(
        task,
        sandboxes.harness("codex"),
        codex_thinking_solution(),
        middleware,
        render_middleware,
        scripted_engine,
    )
    assert_spliced_into_one_sample(splice, scripted_engine)
    assert trained_and_sampled(render, scripted_engine) == trained_and_sampled(
        splice, scripted_engine
    )


async def test_claude_code_solves_the_example_task(task, sandboxes, middleware, scripted_engine):
    """Claude Code reads the bug, fixes it with Edit, runs the tests with Bash: reward 1.0."""
    for reply in claude_solution():
        scripted_engine.queue(reply)
    result = await rollout(task, sandboxes.harness("claude_code"), sandboxes, middleware)

    assert result.outcome is Outcome.SOLVED, result.error
    assert result.reward == 1.0 and not result.remove_sample
    assert result.agent_exit_code == 0 and result.error is None
    assert result.turns == 4 and scripted_engine.pending() == 0
    assert "+    for token in text.split():" in result.diff
    assert "PROBLEM_STATEMENT" not in result.diff and "__pycache__" not in result.diff
    assert result.grade is not None and result.grade.details["exit_code"] == 0
    assert '"type":"result"' in result.agent_log and "5 passed" in result.agent_log
    assert result.sampled_tokens == sum(len(s.output_ids) for s in scripted_engine.served)
    assert all(s.reward == 1.0 for s in result.samples) and result.samples
    assert_trained_tokens_were_sampled(result, scripted_engine, result.session_id)
    assert set(result.timings) >= {"boot", "prepare", "agent", "diff", "grade", "total"}
    assert all(sandbox._closed for sandbox in sandboxes.built) and len(sandboxes.built) == 2


async def test_agent_and_grading_sandboxes_boot_under_the_boot_semaphore(
    task, sandboxes, middleware, scripted_engine
):
    """The grading sandbox starts through the rollout's boot path: under boot_semaphore."""
    for reply in claude_solution():
        scripted_engine.queue(reply)
    gate = asyncio.Semaphore(1)
    held_at_start: list[bool] = []

    class GatedSandbox(LocalSandbox):
        async def start(self) -> None:
            held_at_start.append(gate.locked())
            await super().start()

    def factory(task):
        sandbox = GatedSandbox.from_task(task, **sandboxes.options)
        sandboxes.built.append(sandbox)
        return sandbox

    harness = sandboxes.harness("claude_code")
    result = await rollout(task, harness, factory, middleware, boot_semaphore=gate)

    assert result.outcome is Outcome.SOLVED, result.error
    assert held_at_start == [True, True]  # the agent's boot, then the grader's
    assert not gate.locked() and all(sandbox._closed for sandbox in sandboxes.built)


async def test_codex_solves_the_example_task(task, sandboxes, middleware, scripted_engine):
    """Codex reads with exec_command, patches with apply_patch, runs the tests: reward 1.0."""
    for reply in codex_solution():
        scripted_engine.queue(reply)
    result = await rollout(task, sandboxes.harness("codex"), sandboxes, middleware)

    assert result.outcome is Outcome.SOLVED, result.error
    assert result.reward == 1.0 and result.turns == 4
    assert "+        if token:" in result.diff
    assert '"type":"file_change"' in result.agent_log and "5 passed" in result.agent_log
    assert all(s.reward == 1.0 for s in result.samples) and result.samples
    assert_trained_tokens_were_sampled(result, scripted_engine, result.session_id)


async def test_a_policy_that_changes_nothing_is_unsolved(
    task, sandboxes, middleware, scripted_engine
):
    """The agent only reads and gives up: unsolved, reward 0.0, samples still trainable."""
    scripted_engine.queue(tool_call("Read", file_path=CORE))
    scripted_engine.queue("I could not find the problem.")
    result = await rollout(task, sandboxes.harness("claude_code"), sandboxes, middleware)

    assert result.outcome is Outcome.UNSOLVED, result.error
    assert result.reward == 0.0 and not result.remove_sample
    assert result.diff == "" and result.grade is not None and result.grade.reward == 0.0
    assert result.samples and all(s.reward == 0.0 for s in result.samples)


async def test_claude_code_runs_as_root_with_is_sandbox(
    task, sandboxes, middleware, scripted_engine
):
    """As root Claude Code needs IS_SANDBOX=1 for bypassPermissions; the harness sets it."""
    scripted_engine.queue(tool_call("Read", file_path=CORE))
    scripted_engine.queue("Nothing to change.")
    result = await rollout(
        task,
        sandboxes.harness("claude_code"),
        sandboxes,
        middleware,
        config=config(agent_user="root"),
    )

    assert result.outcome is Outcome.UNSOLVED, (result.error, result.agent_log[-1500:])
    assert result.agent_exit_code == 0 and result.turns == 2
    assert '"permissionMode":"bypassPermissions"' in result.agent_log


async def test_a_cli_that_exits_nonzero_is_an_agent_error(
    task, sandboxes, middleware, scripted_engine
):
    """Claude Code stops with an error at its turn limit: agent_error, still trainable."""
    scripted_engine.queue(tool_call("Read", file_path=CORE))
    scripted_engine.queue(tool_call("Read", file_path="/workspace/README.md"))
    harness = ClaudeCodeHarness(
        cli_path=sandboxes.cli_paths["claude_code"], extra_args=("--max-turns", "1"), extra_env={}
    )
    result = await rollout(task, harness, sandboxes, middleware)

    assert result.outcome is Outcome.AGENT_ERROR, (result.error, result.agent_log[-2000:])
    assert result.agent_exit_code not in (0, -1, None)
    assert not result.remove_sample and result.samples
    assert "max_turns" in result.agent_log


async def test_a_sandbox_that_never_boots_is_an_infra_error(task, middleware, scripted_engine):
    """Every boot attempt fails: infra_error after the retries, samples marked for removal."""
    attempts = []

    def broken(task):
        attempts.append(task.instance_id)
        return LocalSandbox.from_task(task, bwrap="/nonexistent/bwrap")

    result = await run_rollout(
        task,
        harness=ClaudeCodeHarness(cli_path="/nonexistent", extra_args=(), extra_env={}),
        grader=ScaleSWEGrader(),
        sandbox_factory=broken,
        middleware=middleware,
        config=config(boot_retries=2, boot_backoff=0.01),
    )

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample
    assert len(attempts) == 3 and "bubblewrap" in result.error
    assert result.reward == 0.0 and result.samples == () and result.grade is None
    assert not scripted_engine.generate_requests
    with pytest.raises(KeyError):
        middleware.session(result.session_id)


async def test_the_outer_guard_ends_a_hung_phase_as_an_infra_error(
    task, middleware, scripted_engine
):
    """A boot that hangs past the outer guard: infra_error naming the phase; sandbox closed."""
    built = []

    class HangingSandbox(LocalSandbox):
        async def start(self) -> None:
            await asyncio.Event().wait()

    def factory(task):
        built.append(HangingSandbox.from_task(task))
        return built[-1]

    result = await run_rollout(
        task,
        harness=ClaudeCodeHarness(cli_path="/nonexistent", extra_args=(), extra_env={}),
        grader=ScaleSWEGrader(),
        sandbox_factory=factory,
        middleware=middleware,
        config=config(agent_time_budget=1, guard_timeout=1.5, boot_timeout=60),
    )

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample
    assert "rollout guard of 1.5s expired during the 'boot' phase" in result.error
    assert 1.5 <= result.timings["total"] < 10 and result.reward == 0.0
    assert len(built) == 1 and built[0]._closed
    assert result.samples == () and not scripted_engine.generate_requests
    with pytest.raises(KeyError):
        middleware.session(result.session_id)


async def test_the_time_budget_kills_the_agent_and_cleans_up(
    task, sandboxes, middleware, scripted_engine
):
    """The policy's second answer is slower than the budget: timeout; everything cleaned up."""
    scripted_engine.queue(tool_call("Read", file_path=CORE))
    scripted_engine.queue(DONE, delay=120)
    result = await rollout(
        task,
        sandboxes.harness("claude_code"),
        sandboxes,
        middleware,
        config=config(agent_time_budget=10),
    )

    assert result.outcome is Outcome.TIMEOUT, result.error
    assert result.agent_exit_code == -1 and not result.remove_sample
    assert 10 <= result.timings["agent"] < 40 and result.turns == 1
    agent_box = sandboxes.built[0]
    assert agent_box._closed and agent_box.pid_namespace is not None
    assert processes_in_namespace(agent_box.pid_namespace) == []
    with pytest.raises(KeyError):
        middleware.session(result.session_id)
    assert not middleware.trajectory.has_session(result.session_id)
    # The killed CLI's pending request was cancelled down to the engine.
    await scripted_engine.wait_for(lambda: len(scripted_engine.abort_requests) >= 1, 10)
    assert result.samples and result.grade is not None and result.grade.reward == 0.0


async def test_cancelling_a_rollout_cleans_up(task, sandboxes, middleware, scripted_engine):
    """Cancelled mid-run (Ctrl-C in the runner): it re-raises, sandbox and session are gone."""
    scripted_engine.queue(DONE, delay=120)
    running = asyncio.create_task(
        rollout(task, sandboxes.harness("claude_code"), sandboxes, middleware, session_id="c-1")
    )
    await scripted_engine.wait_for(lambda: bool(scripted_engine.generate_requests), 60)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    # The agent's sandbox and the grading sandbox prewarmed beside it (never used).
    assert len(sandboxes.built) == 2 and all(s._closed for s in sandboxes.built)
    for sandbox in sandboxes.built:
        if sandbox.pid_namespace is not None:
            assert processes_in_namespace(sandbox.pid_namespace) == []
    with pytest.raises(KeyError):
        middleware.session("c-1")
    await scripted_engine.wait_for(lambda: bool(scripted_engine.abort_requests), 10)


async def test_an_engine_that_fails_is_an_infra_error(task, sandboxes, middleware, scripted_engine):
    """The engine errors after the first turn and the CLI gives up: infra_error, removed."""
    scripted_engine.queue(tool_call("Read", file_path=CORE))
    scripted_engine.responder = lambda body, headers: ScriptedReply(
        status=500, error="CUDA error: an illegal memory access was encountered"
    )
    harness = ClaudeCodeHarness(
        cli_path=sandboxes.cli_paths["claude_code"],
        extra_args=(),
        extra_env={"CLAUDE_CODE_MAX_RETRIES": "1"},
    )
    result = await rollout(task, harness, sandboxes, middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert "failed in the middleware or engine" in result.error
    assert result.agent_exit_code not in (0, -1) and result.reward == 0.0
    assert result.grade is not None  # graded, but the grade never reaches the trainer
    assert all(s.reward == 0.0 for s in result.samples)


async def test_a_cli_whose_calls_never_reach_the_engine_is_an_infra_error(
    task, sandboxes, middleware, scripted_engine
):
    """A wrong session token: every call is refused with 401, so nothing trains."""
    harness = ClaudeCodeHarness(
        cli_path=sandboxes.cli_paths["claude_code"],
        extra_args=(),
        extra_env={"ANTHROPIC_AUTH_TOKEN": "not-a-session-token", "CLAUDE_CODE_MAX_RETRIES": "0"},
    )
    result = await rollout(task, harness, sandboxes, middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert "without one model call reaching the engine" in result.error
    assert result.turns == 0 and result.samples == () and not scripted_engine.generate_requests


async def test_a_grader_that_cannot_run_is_a_grader_error(
    task, sandboxes, middleware, scripted_engine
):
    """The grading sandbox never boots: grader_error, samples marked for removal."""
    for reply in claude_solution():
        scripted_engine.queue(reply)

    def agent_only(task):
        if sandboxes.built:
            return LocalSandbox.from_task(task, bwrap="/nonexistent/bwrap")
        return sandboxes(task)

    result = await rollout(task, sandboxes.harness("claude_code"), agent_only, middleware)

    assert result.outcome is Outcome.GRADER_ERROR and result.remove_sample, result.error
    assert result.error.startswith("grader 'scaleswe': grader failed: SandboxError: ")
    assert result.reward == 0.0 and result.grade is not None and result.grade.error
    assert result.diff and result.samples
    assert all(s.reward == 0.0 and s.metadata["outcome"] == "grader_error" for s in result.samples)


async def test_a_grader_that_raises_is_a_grader_error(task, sandboxes, middleware, scripted_engine):
    """A grader whose grade() raises: grader_error naming the exception, never a reward."""
    for reply in claude_solution():
        scripted_engine.queue(reply)

    class RaisingGrader(ScaleSWEGrader):
        async def grade(self, task, diff, sandbox_factory):
            raise RuntimeError("the grading backend fell over")

    result = await run_rollout(
        task,
        harness=sandboxes.harness("claude_code"),
        grader=RaisingGrader(),
        sandbox_factory=sandboxes,
        middleware=middleware,
        config=config(),
    )

    assert result.outcome is Outcome.GRADER_ERROR and result.remove_sample, result.error
    assert result.error == (
        "grader 'scaleswe': grader failed: RuntimeError: the grading backend fell over"
    )
    assert result.diff and result.reward == 0.0 and result.grade.applied_cleanly is False
    assert all(s.reward == 0.0 for s in result.samples)


async def test_two_concurrent_rollouts_of_one_task_do_not_interfere(
    task, sandboxes, middleware, scripted_engine
):
    """One rollout fixes the bug while the other only reads: each keeps its own result."""
    for reply in claude_solution():
        scripted_engine.queue(reply, session="fixer")
    scripted_engine.queue(tool_call("Read", file_path=CORE), session="reader")
    scripted_engine.queue("Nothing to change.", session="reader")
    harness = sandboxes.harness("claude_code")
    fixer, reader = await asyncio.gather(
        rollout(task, harness, sandboxes, middleware, session_id="fixer"),
        rollout(task, harness, sandboxes, middleware, session_id="reader"),
    )

    assert (fixer.outcome, reader.outcome) == (Outcome.SOLVED, Outcome.UNSOLVED)
    assert fixer.diff and reader.diff == ""
    assert (fixer.turns, reader.turns) == (4, 2)
    assert_trained_tokens_were_sampled(fixer, scripted_engine, "fixer")
    assert_trained_tokens_were_sampled(reader, scripted_engine, "reader")
    # Two agents' sandboxes and two prewarmed grading ones (the reader's is never used).
    assert len(sandboxes.built) == 4 and all(s._closed for s in sandboxes.built)


async def test_filling_the_context_budget_is_a_context_overflow(
    task, sandboxes, middleware, scripted_engine
):
    """The engine stops at the context budget mid-answer: context_overflow.

    The rollout reads its turns from its own middleware session, registering nothing with
    the plugin manager; the result carries them.
    """
    scripted_engine.queue(tool_call("Read", file_path=CORE))
    scripted_engine.queue("words " * 4000)
    plugins_before = plugins.get_registry().pm.list_name_plugin()
    result = await rollout(
        task,
        sandboxes.harness("claude_code"),
        sandboxes,
        middleware,
        config=config(max_context_tokens=14_000),
    )

    assert result.outcome is Outcome.CONTEXT_OVERFLOW, (result.error, result.agent_log[-1500:])
    assert not result.remove_sample
    assert any(s.finish_reason == "length" for s in scripted_engine.served)
    # The first turn reads the file; every later one hits the budget (the engine's or ours).
    first, *rest = result.turn_facts
    assert first.finish_reason == "stop" and rest
    assert {t.finish_reason for t in rest} == {"length"}
    assert rest[-1].prompt_tokens + rest[-1].output_tokens >= 14_000
    assert result.sampled_tokens == sum(len(s.output_ids) for s in scripted_engine.served)
    assert plugins.get_registry().pm.list_name_plugin() == plugins_before


def test_result_row_has_outcome_timings_and_no_samples():
    """RolloutResult.to_dict is one JSON-able line: outcome value, timings, no samples."""
    result = RolloutResult(
        instance_id="t",
        session_id="s",
        outcome=Outcome.GRADER_ERROR,
        reward=0.0,
        timings={"boot": 1.0, "total": 2.0},
        error="grader 'scaleswe' failed: boom",
    )
    row = result.to_dict()
    assert row["outcome"] == "grader_error" and row["remove_sample"] is True
    assert row["timings"] == {"boot": 1.0, "total": 2.0}
    assert "samples" not in row and row["num_samples"] == 0 and row["grade"] is None
    assert (
        RolloutResult(
            instance_id="t", session_id="s", outcome=Outcome.TIMEOUT, reward=0.0
        ).remove_sample
        is False
    )


def test_config_reads_agentrl_then_slime_variables():
    """from_env: AGENTRL_* wins over SWE_*; the guard defaults to agent + 2 × eval + 180 s;
    slime's SWE_BOOT_RETRIES counts attempts, so its 5 is 4 retries here."""
    env = {
        "SWE_AGENT_TIME_BUDGET_SEC": "900",
        "AGENTRL_EVAL_TIMEOUT": "300",
        "SWE_EVAL_TIMEOUT_SEC": "999",
        "SWE_BOOT_RETRIES": "5",
    }
    cfg = RolloutConfig.from_env(env)
    assert (cfg.agent_time_budget, cfg.eval_timeout, cfg.boot_retries) == (900, 300, 4)
    assert cfg.guard_timeout == 900 + 2 * 300 + 180
    assert RolloutConfig.from_env(env, guard_timeout=2000).guard_timeout == 2000
    with pytest.raises(ValueError, match="SWE_BOOT_RETRIES='many' is not an integer"):
        RolloutConfig.from_env({"SWE_BOOT_RETRIES": "many"})
    with pytest.raises(ValueError, match="guard_timeout"):
        RolloutConfig(agent_time_budget=100, guard_timeout=50)


def test_the_prompt_fills_its_placeholders_and_keeps_other_braces():
    """The four named placeholders are filled in one pass: other braces, and placeholder-like
    text inside the issue itself, stay as written."""
    task = Task(instance_id="t-9", problem_statement="Fix {x} in {workdir}.", workdir="/repo")
    template = "{instance_id} in {workdir}/{problem_file}: {problem_statement} d = {'a': 1} {y}"
    prompt = render_prompt(template, task, "ISSUE.md")
    assert prompt == "t-9 in /repo/ISSUE.md: Fix {x} in {workdir}. d = {'a': 1} {y}"
    default = render_prompt(DEFAULT_PROMPT, task, "PROBLEM_STATEMENT.md")
    assert "<issue>\nFix {x} in {workdir}.\n</issue>" in default
    assert "/repo/PROBLEM_STATEMENT.md" in default

"""Contract suite: ``agentrl.slime.generate`` end to end, checked the way slime checks it.

Each case runs the real entry point the way slime's rollout manager calls it
(``await generate(args, sample, sampling_params, evaluation=...)`` from its own event
loop) with a stand-in ``Sample`` written from slime's contract, then pushes the outputs
through the checks slime applies (``tests/support/slime_stub/checks.py``). What runs for real: the
Claude Code CLI, the bubblewrap sandbox, the middleware, the SGLang client, the Qwen3
tokenizer and the scaleswe grader. The one test double is the scripted SGLang server
(``agentrl.testing.scripted_engine``), which speaks SGLang's HTTP protocol; its replies
are chosen from the decoded prompt, so the agent's own requests drive the script.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import tempfile
import types

import pytest
from slime_stub import checks
from slime_stub.rollout_state import install_generate_state
from slime_stub.sample import Sample

import agentrl.slime as slime_mod
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.codex import CodexHarness
from agentrl.slime.samples import task_row
from agentrl.testing.scripted_engine import ScriptedEngine, ScriptedReply

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TASKS = REPO_ROOT / "examples" / "tasks"
CLI_DIR = pathlib.Path(os.environ.get("AGENTRL_CLI_DIR", REPO_ROOT / ".cache" / "clis"))

FIX_MARKER = "AGENTRL-FIX-APPLIED"
FIX_SCRIPT = (
    "python3 - <<'PY'\n"
    "import pathlib\n"
    "p = pathlib.Path('textstats/core.py')\n"
    "s = p.read_text()\n"
    "s = s.replace('text.split(\" \")', 'text.split()')\n"
    "s = s.replace('        result.append(token)', "
    "'        if token:\\n            result.append(token)')\n"
    "p.write_text(s)\n"
    "print('AGENTRL-' + 'FIX-APPLIED')\n"
    "PY"
)

#: A tool call that outlasts every budget in these tests.
STALL = "python3 -c 'import time; time.sleep(300)'"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]


def _tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class AgentScript:
    """Chooses the scripted engine's reply from what the agent's prompt says so far.

    Main agent: (optionally) dispatch a sub-agent, then run the fix through Bash, then
    finish. Sub-agent: report back in one turn. Every reply is plain model text in the
    Qwen3 format; the middleware's parsers turn it into the agent's wire protocol.
    """

    def __init__(
        self,
        tokenizer,
        *,
        subagent: bool = False,
        first: ScriptedReply | None = None,
        codex: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.codex = codex
        self.subagent = subagent
        self.first = first
        self.prompts: list[str] = []

    def __call__(self, body, headers) -> ScriptedReply:
        prompt = self.tokenizer.decode(body["input_ids"], skip_special_tokens=False)
        self.prompts.append(prompt)
        if "cc_is_subagent=true" in prompt:
            return ScriptedReply(text="The package lives in textstats/core.py.")
        if FIX_MARKER in prompt:
            # The fix ran (its output is in the prompt): anything after that ends the run.
            return ScriptedReply(text="All done: the fix is in place.")
        if self.subagent and "Async agent launched" not in prompt:
            return ScriptedReply(
                text="Let me look around first.\n"
                + _tool_call(
                    "Agent",
                    {
                        "description": "Find the word code",
                        "prompt": "Which file defines words()?",
                        "subagent_type": "general-purpose",
                    },
                )
            )
        if self.first is not None:
            return self.first
        if self.codex:
            return ScriptedReply(
                text="Fixing it.\n"
                + _tool_call("exec_command", {"cmd": FIX_SCRIPT, "workdir": "/workspace"})
            )
        return ScriptedReply(text="Fixing it.\n" + _tool_call("Bash", {"command": FIX_SCRIPT}))


@pytest.fixture
def short_dir():
    """A short directory for unix sockets (their paths are limited to 108 bytes)."""
    path = tempfile.mkdtemp(prefix="arl-")
    try:
        yield pathlib.Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def slime_env(monkeypatch, short_dir):
    """The agentrl environment a slime launcher would export, for the local sandbox."""
    if not (CLI_DIR / "bin" / "claude").exists() or not (CLI_DIR / "bin" / "codex").exists():
        pytest.fail(
            f"the agent CLIs are not installed in {CLI_DIR}; run `agentrl install-clis --dest .cache/clis` "
            "(make test does), or set AGENTRL_CLI_DIR to an install holding bin/claude and "
            "bin/codex"
        )
    binds, claude = ClaudeCodeHarness.host_install(CLI_DIR)
    # host_python: the grader runs the task's pytest inside with this interpreter.
    sandbox_options = {"ro_binds": binds, "host_python": True}
    env = {
        "AGENTRL_HARNESS": "claude_code",
        "AGENTRL_SANDBOX": "local",
        "AGENTRL_TRAIN_PROTOCOL": "scaleswe",
        "AGENTRL_UNIX_SOCKET": str(short_dir / "mw.sock"),
        "AGENTRL_PORT": "18001",
        "AGENTRL_CLI_PATH": claude,
        "AGENTRL_SANDBOX_OPTIONS": json.dumps(sandbox_options),
        "AGENTRL_AGENT_TIME_BUDGET": "120",
        "AGENTRL_EVAL_TIMEOUT": "120",
        "AGENTRL_ABORT_POLL_SEC": "0.1",
    }
    for name in list(os.environ):
        if name.startswith(("AGENTRL_", "SWE_", "ADAPTER_", "SLIME_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env
    slime_mod.shutdown_service()


def _args(engine: ScriptedEngine, tokenizer_dir, **kw) -> types.SimpleNamespace:
    host, port = engine.url.removeprefix("http://").split(":")
    values = dict(
        hf_checkpoint=str(tokenizer_dir),
        sglang_router_ip=host,
        sglang_router_port=int(port),
        rollout_max_context_len=32768,
        # hermes, not slime's usual qwen25: SGLang's name whose built-in is proven identical,
        # so it resolves without SGLang (qwen25 is SGLang's own parser, see test_slime_parsers).
        sglang_tool_call_parser="hermes",
        sglang_reasoning_parser="qwen3",
        n_samples_per_prompt=1,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
    )
    values.update(kw)
    return types.SimpleNamespace(**values)


def _textstats_sample(index: int = 0, group_index: int = 0, **kw) -> Sample:
    row = json.loads((TASKS / "scaleswe.jsonl").read_text().splitlines()[0])
    metadata = dict(row["metadata"])
    metadata["repo"] = str(TASKS / metadata["repo"])
    metadata.pop("gold_patch_path", None)
    return Sample(
        index=index,
        group_index=group_index,
        prompt=row["prompt"],
        label=row["label"],
        metadata=metadata,
        session_id=kw.pop("session_id", f"slime-session-{index}"),
        **kw,
    )


SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 4096,
    "stop": None,
    "stop_token_ids": [151645],
    "skip_special_tokens": False,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}


async def _engine(tokenizer, script) -> ScriptedEngine:
    engine = ScriptedEngine(tokenizer, responder=script)
    await engine.start()
    return engine


async def test_solved_rollout_passes_slime_checks(slime_env, qwen_tokenizer, qwen_tokenizer_dir):
    """Claude Code fixes the task in a local sandbox: trained samples, reward 1, slime-valid."""
    script = AgentScript(qwen_tokenizer)
    engine = await _engine(qwen_tokenizer, script)
    try:
        args = _args(engine, qwen_tokenizer_dir)
        sample = _textstats_sample(index=3, group_index=1)
        params = dict(SAMPLING)
        out = await slime_mod.generate(args, sample, params, evaluation=False)
    finally:
        await engine.close()
    assert params == SAMPLING  # read-only
    checks.check_return_shape(out)
    assert all(s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) for s in out), [
        s.metadata.get("abort_reason") for s in out
    ]
    assert all(s.reward == 1.0 and not s.remove_sample for s in out), out[0].metadata
    assert {s.rollout_id for s in out} == {3}
    assert all((s.index, s.group_index) == (3, 1) for s in out)
    meta = out[0].metadata
    assert meta["outcome"] == "solved" and meta["agent_exit_code"] == 0
    assert meta["instance_id"] == "textstats-1" and meta["session_id"] == "slime-session-3"
    assert set(meta["timings"]) >= {"boot", "agent", "grade"}
    # Time outside the engine (boot, tools, grading) feeds slime's perf metrics.
    assert 0 < out[0].non_generation_time < meta["timings"]["total"]
    # Every trained token is one the engine sampled, with the engine's log-prob.
    sampled = {}
    for served in engine.served:
        for token, logprob in zip(served.output_ids, served.logprobs, strict=True):
            sampled.setdefault(token, set()).add(logprob)
    trained = 0
    for s in out:
        response = s.tokens[-s.response_length :]
        for token, mask, logprob in zip(response, s.loss_mask, s.rollout_log_probs, strict=True):
            if mask:
                trained += 1
                assert logprob in sampled[token]
    # ... and every token it sampled is trained exactly once.
    assert trained == sum(len(g.output_ids) for g in engine.served)
    # Every engine call carried the session's routing key.
    assert {g.routing_key for g in engine.served} == {"slime-session-3"}
    assert "fix" in " ".join(s.response for s in out).lower()
    flat, data = checks.train_pipeline(args, [[out]], post_process=slime_mod.reward_post_process)
    assert data["raw_reward"] == [1.0] * len(flat)
    assert sum(data["rollout_mask_sums"][:1]) >= trained


async def test_subagent_fan_out_shares_rollout_id(slime_env, qwen_tokenizer, qwen_tokenizer_dir):
    """A sub-agent forks the session: several samples, one rollout_id, all valid for slime."""
    script = AgentScript(qwen_tokenizer, subagent=True)
    engine = await _engine(qwen_tokenizer, script)
    try:
        args = _args(engine, qwen_tokenizer_dir, n_samples_per_prompt=2)
        first = await slime_mod.generate(args, _textstats_sample(index=4, group_index=0), SAMPLING)
        second = await slime_mod.generate(
            args, _textstats_sample(index=5, group_index=0, rollout_id=50), SAMPLING
        )
    finally:
        await engine.close()
    assert any("cc_is_subagent=true" in p for p in script.prompts), "no sub-agent call"
    for out, rid in ((first, 4), (second, 50)):
        checks.check_return_shape(out)
        assert len(out) >= 2, [s.metadata.get("abort_reason") for s in out]
        assert {s.rollout_id for s in out} == {rid}
        assert [s.metadata["branch_index"] for s in out] == list(range(len(out)))
        assert all(s.reward == 1.0 for s in out)
    # Main agent and sub-agent chains together train every sampled token exactly once.
    trained = sum(sum(s.loss_mask) for s in (*first, *second))
    assert trained == sum(len(g.output_ids) for g in engine.served)
    flat, data = checks.train_pipeline(
        args, [[first, second]], post_process=slime_mod.reward_post_process
    )
    assert len(flat) == len(first) + len(second)
    assert set(data["rollout_ids"]) == {4, 50}
    # Both rollouts solved: GRPO advantages are zero, fan-out or not.
    assert data["rewards"] == [0.0] * len(flat)


async def test_infra_failure_is_an_untrained_aborted_placeholder(
    slime_env, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """A sandbox that cannot boot yields slime's abort placeholder, never a 0 reward that trains."""
    monkeypatch.setenv("AGENTRL_SANDBOX_OPTIONS", json.dumps({"bwrap": "/nonexistent/bwrap"}))
    monkeypatch.setenv("AGENTRL_BOOT_RETRIES", "0")
    script = AgentScript(qwen_tokenizer)
    engine = await _engine(qwen_tokenizer, script)
    try:
        args = _args(engine, qwen_tokenizer_dir, n_samples_per_prompt=2)
        broken = await slime_mod.generate(args, _textstats_sample(index=0), SAMPLING)
    finally:
        await engine.close()
    assert engine.served == []
    (p,) = checks.check_return_shape(broken)
    assert p.status is Sample.Status.ABORTED and p.remove_sample
    assert (p.tokens, p.response_length, p.loss_mask, p.rollout_log_probs, p.reward) == (
        [0, 0],
        1,
        [0],
        [0.0],
        0.0,
    )
    assert p.metadata["abort_reason"] == "infra_error"
    assert p.metadata["outcome"] == "infra_error" and "did not boot" in p.metadata["error"]
    assert (p.index, p.rollout_id) == (0, 0)
    # slime skips the reward model for an ABORTED sibling and trains nothing from it.
    checks.check_sample_fields(p)
    _, data = checks.train_pipeline(
        args,
        [[broken, _solved_stand_in(index=1)]],
        post_process=slime_mod.reward_post_process,
    )
    assert data["loss_masks"][0] == [0] and data["rollout_mask_sums"][0] == 0


def _solved_stand_in(index: int) -> list[Sample]:
    return [
        Sample(
            index=index,
            group_index=0,
            rollout_id=index,
            tokens=[1, 2, 3],
            response_length=2,
            loss_mask=[1, 1],
            rollout_log_probs=[-0.1, -0.2],
            reward=1.0,
            status=Sample.Status.COMPLETED,
        )
    ]


async def test_invalid_task_row_is_an_aborted_placeholder(slime_env, qwen_tokenizer_dir):
    """A row the grader cannot parse never reaches a sandbox: one placeholder naming the field."""
    engine = ScriptedEngine()
    await engine.start()
    try:
        args = _args(engine, qwen_tokenizer_dir)
        sample = Sample(index=2, group_index=0, prompt="x", metadata={"workdir": "/w"})
        (p,) = await slime_mod.generate(args, sample, SAMPLING)
    finally:
        await engine.close()
    assert p.status is Sample.Status.ABORTED and p.remove_sample and p.reward == 0.0
    assert p.metadata["abort_reason"] == "invalid_task"
    assert "instance id" in p.metadata["error"]
    checks.check_sample_fields(p)


async def test_ungradable_task_is_an_aborted_placeholder(slime_env, qwen_tokenizer_dir):
    """A row the grader's check turns down never reaches a sandbox: one placeholder with why."""
    engine = ScriptedEngine()
    await engine.start()
    try:
        args = _args(engine, qwen_tokenizer_dir)
        metadata = {"instance_id": "no-method", "repo": str(TASKS / "repos" / "textstats")}
        sample = Sample(index=3, group_index=0, prompt="Fix it.", metadata=metadata)
        (p,) = await slime_mod.generate(args, sample, SAMPLING)
    finally:
        await engine.close()
    assert p.status is Sample.Status.ABORTED and p.remove_sample and p.reward == 0.0
    assert p.metadata["abort_reason"].startswith("unevaluable:no grading method")
    assert p.metadata["instance_id"] == "no-method"
    assert engine.served == []
    checks.check_sample_fields(p)


async def test_agent_timeout_trains_with_graded_reward(
    slime_env, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """An agent past its time budget is killed; its turns still train, with the graded reward 0."""
    monkeypatch.setenv("AGENTRL_AGENT_TIME_BUDGET", "8")
    stall = ScriptedReply(text="Waiting.\n" + _tool_call("Bash", {"command": STALL}))
    script = AgentScript(qwen_tokenizer, first=stall)
    engine = await _engine(qwen_tokenizer, script)
    try:
        args = _args(engine, qwen_tokenizer_dir)
        out = await slime_mod.generate(args, _textstats_sample(index=6, group_index=2), SAMPLING)
    finally:
        await engine.close()
    checks.check_return_shape(out)
    assert all(s.status is Sample.Status.COMPLETED and not s.remove_sample for s in out)
    meta = out[0].metadata
    assert meta["outcome"] == "timeout", meta.get("abort_reason")
    assert meta["agent_exit_code"] == -1
    assert all(s.reward == 0.0 for s in out)
    # The stalled tool call is the agent's only turn; every token it sampled trains once.
    assert len(engine.served) == 1
    assert sum(sum(s.loss_mask) for s in out) == len(engine.served[0].output_ids)
    checks.train_pipeline(args, [[out]], post_process=slime_mod.reward_post_process)


async def test_evaluation_returns_a_reward_only_placeholder(
    slime_env, qwen_tokenizer, qwen_tokenizer_dir
):
    """evaluation=True: one untrained COMPLETED sample carrying the score, as slime's eval reads it."""
    script = AgentScript(qwen_tokenizer)
    engine = await _engine(qwen_tokenizer, script)
    try:
        args = _args(engine, qwen_tokenizer_dir)
        out = await slime_mod.generate(
            args, _textstats_sample(index=9, session_id=None), SAMPLING, evaluation=True
        )
    finally:
        await engine.close()
    (p,) = checks.check_return_shape(out)
    assert p.status is Sample.Status.COMPLETED and p.remove_sample
    assert p.reward == 1.0 and p.metadata["outcome"] == "solved"
    assert p.metadata["grading_solved"] is True
    assert p.tokens == [0, 0] and p.loss_mask == [0]
    # Without a slime session id, one is minted and used as the routing key.
    routing = {g.routing_key for g in engine.served}
    assert len(routing) == 1 and routing.pop().startswith("agentrl-textstats-1-9-")
    checks.check_sample_fields(p)
    collected = checks.eval_collect([out, _solved_stand_in(index=3)])
    assert collected["rewards"] == [1.0, 1.0]
    assert collected["truncated"] == [False, False]


async def test_engine_abort_stops_the_rollout_promptly(
    slime_env, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """With continuation off, a turn SGLang finishes with 'abort' ends the rollout at once
    with an abort placeholder."""
    monkeypatch.setenv("AGENTRL_MAX_ENGINE_ABORTS", "0")
    aborted = ScriptedReply(text="I was cut", finish_reason="abort")
    script = AgentScript(qwen_tokenizer, first=aborted)
    engine = await _engine(qwen_tokenizer, script)
    loop = asyncio.get_running_loop()
    try:
        args = _args(engine, qwen_tokenizer_dir)
        started = loop.time()
        out = await slime_mod.generate(args, _textstats_sample(index=1), SAMPLING)
        elapsed = loop.time() - started
        served = len(engine.served)
    finally:
        await engine.close()
    (p,) = checks.check_return_shape(out)
    assert p.status is Sample.Status.ABORTED and p.remove_sample
    assert p.metadata["abort_reason"] == "engine_abort"
    assert served == 1  # the agent was not allowed another turn
    assert elapsed < 60, f"took {elapsed:.1f}s for an aborted rollout (agent budget 120s)"


async def test_engine_abort_seen_only_after_the_rollout_ends_is_still_an_abort(
    slime_env, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """With no poll before the rollout ends, its result's turn facts still flag the abort.

    The session is closed by then; the rollout's result keeps what the session recorded.
    Continuation is off, so the aborted turn reaches the agent as it is.
    """
    monkeypatch.setenv("AGENTRL_ABORT_POLL_SEC", "600")
    monkeypatch.setenv("AGENTRL_MAX_ENGINE_ABORTS", "0")
    fix = ScriptedReply(
        text="Fixing it.\n" + _tool_call("Bash", {"command": FIX_SCRIPT}), finish_reason="abort"
    )
    script = AgentScript(qwen_tokenizer, first=fix)
    engine = await _engine(qwen_tokenizer, script)
    try:
        out = await slime_mod.generate(
            _args(engine, qwen_tokenizer_dir), _textstats_sample(index=13), SAMPLING
        )
        finishes = [g.finish_reason for g in engine.served]
    finally:
        await engine.close()
    (p,) = checks.check_return_shape(out)
    assert finishes == ["abort", "stop"]  # the agent ran the fix and finished
    assert p.status is Sample.Status.ABORTED and p.metadata["abort_reason"] == "engine_abort"
    assert p.metadata["outcome"] == "solved"


async def test_an_engine_abort_is_continued_and_the_rollout_trains(
    slime_env, qwen_tokenizer, qwen_tokenizer_dir
):
    """SGLang aborts the fix's tool call halfway (a weight update): the middleware continues
    it, Claude Code gets the whole call and runs it, and every sampled token trains once."""
    fix = qwen_tokenizer("Fixing it.\n" + _tool_call("Bash", {"command": FIX_SCRIPT}))
    ids = list(fix["input_ids"])
    partial, rest = ids[: len(ids) // 2], ids[len(ids) // 2 :]
    script = AgentScript(qwen_tokenizer, first=ScriptedReply(ids=partial, finish_reason="abort"))

    def resuming(body, headers) -> ScriptedReply:
        if body["input_ids"][-len(partial) :] == partial:
            return ScriptedReply(ids=rest)
        return script(body, headers)

    engine = await _engine(qwen_tokenizer, resuming)
    try:
        out = await slime_mod.generate(
            _args(engine, qwen_tokenizer_dir), _textstats_sample(index=14), SAMPLING
        )
    finally:
        await engine.close()
    assert [g.finish_reason for g in engine.served][:2] == ["abort", "stop"]
    assert engine.served[1].input_ids == engine.served[0].input_ids + tuple(partial)
    (s,) = checks.check_return_shape(out)
    assert s.status is Sample.Status.COMPLETED and not s.remove_sample, s.metadata
    assert s.reward == 1.0 and s.metadata["outcome"] == "solved"
    assert sum(s.loss_mask) == sum(len(g.output_ids) for g in engine.served)
    first = next(m for m in s.metadata["turn_metadata"].values() if m["middleware_turn"] == 0)
    assert first["engine_resumes"] == [{"at": len(partial), "weight_version": "scripted"}]


async def test_a_turn_the_engine_keeps_aborting_stops_the_rollout_promptly(
    slime_env, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """A turn SGLang aborts AGENTRL_MAX_ENGINE_ABORTS times in a row fails (its continuation
    was aborted too), and slime's loop ends the rollout at once with an abort placeholder."""
    monkeypatch.setenv("AGENTRL_MAX_ENGINE_ABORTS", "2")
    aborted = ScriptedReply(text="I was cut", finish_reason="abort")
    engine = await _engine(qwen_tokenizer, AgentScript(qwen_tokenizer, first=aborted))
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        out = await slime_mod.generate(
            _args(engine, qwen_tokenizer_dir), _textstats_sample(index=15), SAMPLING
        )
        elapsed = loop.time() - started
        served = [g.input_ids for g in engine.served]
    finally:
        await engine.close()
    (p,) = checks.check_return_shape(out)
    assert p.status is Sample.Status.ABORTED and p.metadata["abort_reason"] == "engine_abort"
    assert len(served) == 2 and len(served[1]) > len(served[0])  # the abort was continued
    assert elapsed < 60, f"took {elapsed:.1f}s for an aborted rollout (agent budget 120s)"


async def test_slime_abort_stops_the_rollout_promptly(
    slime_env, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """When slime's rollout loop aborts the batch, an in-flight rollout returns a placeholder at once."""

    state = install_generate_state(monkeypatch)(None)
    stall = ScriptedReply(text="Waiting.\n" + _tool_call("Bash", {"command": STALL}))
    script = AgentScript(qwen_tokenizer, first=stall)
    engine = await _engine(qwen_tokenizer, script)
    loop = asyncio.get_running_loop()
    try:
        args = _args(engine, qwen_tokenizer_dir)
        task = asyncio.ensure_future(slime_mod.generate(args, _textstats_sample(index=8), SAMPLING))
        await engine.wait_for(lambda: len(engine.served) == 1, timeout=60)
        state.aborted = True
        started = loop.time()
        out = await task
        elapsed = loop.time() - started
    finally:
        await engine.close()
    (p,) = checks.check_return_shape(out)
    assert p.status is Sample.Status.ABORTED and p.metadata["abort_reason"] == "aborted"
    assert elapsed < 15, f"abort took {elapsed:.1f}s"
    assert len(engine.served) == 1


async def test_group_runs_concurrently_without_blocking_slimes_loop(
    slime_env, qwen_tokenizer, qwen_tokenizer_dir
):
    """A GRPO group runs concurrently as slime runs it; slime's own loop stays responsive."""
    script = AgentScript(qwen_tokenizer)
    engine = await _engine(qwen_tokenizer, script)
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        # What slime's loop must keep doing while agents run: wake up on time.
        while not stop.is_set():
            before = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - before - 0.01)

    args = _args(engine, qwen_tokenizer_dir, n_samples_per_prompt=2)
    # Start the service first: loading a tokenizer holds the GIL for a moment, once per
    # process (slime's own GenerateState does the same on its loop).
    (warm,) = await slime_mod.generate(args, Sample(index=99, metadata={}), SAMPLING)
    assert warm.metadata["abort_reason"] == "invalid_task"
    tick = asyncio.create_task(ticker())
    try:
        group = [_textstats_sample(index=i, group_index=7) for i in (10, 11)]
        outs = await asyncio.gather(*(slime_mod.generate(args, s, SAMPLING) for s in group))
    finally:
        stop.set()
        await tick
        await engine.close()
    assert {g.routing_key for g in engine.served} == {"slime-session-10", "slime-session-11"}
    flat, data = checks.train_pipeline(args, [outs], post_process=slime_mod.reward_post_process)
    assert {s.rollout_id for s in flat} == {10, 11}
    assert data["raw_reward"] == [1.0] * len(flat)
    assert max(lags) < 0.5, f"slime's loop stalled for {max(lags):.2f}s"


async def test_cancelled_generate_closes_its_session_and_sandbox(
    slime_env, qwen_tokenizer, qwen_tokenizer_dir
):
    """If slime cancels the generate task, the rollout on the service loop is cancelled too."""
    import agentrl.slime.service as service_mod

    stall = ScriptedReply(text="Waiting.\n" + _tool_call("Bash", {"command": STALL}))
    engine = await _engine(qwen_tokenizer, AgentScript(qwen_tokenizer, first=stall))
    try:
        args = _args(engine, qwen_tokenizer_dir)
        task = asyncio.ensure_future(
            slime_mod.generate(args, _textstats_sample(index=12), SAMPLING)
        )
        await engine.wait_for(lambda: len(engine.served) == 1, timeout=60)
        service = service_mod._service
        assert service is not None and "slime-session-12" in service._tasks
        assert "slime-session-12" in service.stack.middleware._sessions
        inner = service._tasks["slime-session-12"]  # the rollout, on the service loop

        async def settled() -> None:
            await asyncio.gather(inner, return_exceptions=True)

        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(
            asyncio.wrap_future(asyncio.run_coroutine_threadsafe(settled(), service.loop)), 15
        )
        assert inner.cancelled(), "the rollout kept running after slime cancelled it"
        assert not service._tasks
        assert not service.stack.middleware._sessions
    finally:
        await engine.close()


async def test_codex_rollout_passes_slime_checks(
    slime_env, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """The Codex CLI (OpenAI Responses) through the same entry point: solved, slime-valid."""
    monkeypatch.setenv("SWE_AGENT", "codex")  # slime's name for the harness
    monkeypatch.delenv("AGENTRL_HARNESS")
    monkeypatch.setenv("AGENTRL_CLI_PATH", CodexHarness.host_install(CLI_DIR)[1])
    script = AgentScript(qwen_tokenizer, codex=True)
    engine = await _engine(qwen_tokenizer, script)
    try:
        args = _args(engine, qwen_tokenizer_dir)
        out = await slime_mod.generate(args, _textstats_sample(index=13), SAMPLING)
    finally:
        await engine.close()
    checks.check_return_shape(out)
    meta = out[0].metadata
    assert meta["outcome"] == "solved", (meta.get("abort_reason"), meta.get("error"))
    assert meta["harness"] == "codex"
    assert {t["protocol"] for t in meta["turn_metadata"].values()} == {"openai_responses"}
    assert all(s.reward == 1.0 and s.rollout_id == 13 for s in out)
    trained = sum(sum(s.loss_mask) for s in out)
    assert trained == sum(len(g.output_ids) for g in engine.served)
    checks.train_pipeline(args, [[out]], post_process=slime_mod.reward_post_process)


async def test_codex_configured_from_slime_s_launcher_gets_the_codex_tarball(
    slime_env, monkeypatch, tmp_path, qwen_tokenizer_dir
):
    """slime's launcher exports SLIME_AGENT_CC_TARBALL whatever SWE_AGENT says; with
    SWE_AGENT=codex and both tarballs exported, the service's Codex harness installs the
    Codex tarball and never Claude Code's."""
    import agentrl.slime.service as service_mod

    cc, codex, node = (tmp_path / n for n in ("cc.tgz", "codex.tgz", "node.tar.xz"))
    for path in (cc, codex, node):
        path.write_bytes(b"")
    monkeypatch.delenv("AGENTRL_HARNESS")
    monkeypatch.delenv("AGENTRL_CLI_PATH")
    monkeypatch.setenv("SWE_AGENT", "codex")
    monkeypatch.setenv("SLIME_AGENT_CC_TARBALL", str(cc))
    monkeypatch.setenv("SLIME_AGENT_CODEX_TARBALL", str(codex))
    monkeypatch.setenv("SLIME_AGENT_NODE_TARBALL", str(node))
    engine = ScriptedEngine()
    await engine.start()
    try:
        args = _args(engine, qwen_tokenizer_dir)
        (p,) = await slime_mod.generate(args, Sample(index=0, metadata={}), SAMPLING)
        assert p.metadata["abort_reason"] == "invalid_task"
        harness = service_mod._service.stack.harness
        assert isinstance(harness, CodexHarness)
        assert harness.tarballs == (str(codex),)
        assert harness.node_tarball == str(node)
    finally:
        await engine.close()


async def test_network_mode_serves_tcp_and_tells_sandboxes_the_public_host(
    slime_env, monkeypatch, qwen_tokenizer_dir
):
    """With E2B, the middleware listens on TCP and sandboxes are pointed at the public host."""
    import aiohttp

    import agentrl.slime.service as service_mod

    monkeypatch.delenv("AGENTRL_UNIX_SOCKET")
    monkeypatch.delenv("AGENTRL_SANDBOX_OPTIONS")
    monkeypatch.setenv("AGENTRL_SANDBOX", "e2b")
    monkeypatch.setenv("ADAPTER_PUBLIC_HOST", "10.1.2.3")  # slime's name
    monkeypatch.setenv("ADAPTER_BIND_HOST", "127.0.0.1")
    monkeypatch.setenv("ADAPTER_PORT", "0")
    monkeypatch.setenv("E2B_API_KEY", "e2b_" + "0" * 40)
    monkeypatch.setenv("SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY", "image")
    engine = ScriptedEngine()
    await engine.start()
    try:
        args = _args(engine, qwen_tokenizer_dir)
        (p,) = await slime_mod.generate(args, Sample(index=0, metadata={}), SAMPLING)
        assert p.metadata["abort_reason"] == "invalid_task"
        service = service_mod._service
        port = service.stack.rollout_config.middleware_port
        assert service.stack.rollout_config.middleware_host == "10.1.2.3" and port > 0
        assert service.stack.middleware.url == f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{service.stack.middleware.url}/healthz") as response:
                assert response.status == 200 and (await response.json())["ok"] is True
        sample = _textstats_sample()
        sample.metadata["image"] = "registry/textstats:1"
        sandbox = service.stack.sandbox_factory(service.graders[False].parse_task(task_row(sample)))
        assert sandbox.url_for("10.1.2.3", port) == f"http://10.1.2.3:{port}"
    finally:
        await engine.close()

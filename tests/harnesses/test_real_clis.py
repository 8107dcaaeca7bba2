"""The real Claude Code and Codex CLIs (from npm) against the middleware and a scripted engine.

Each CLI is asked to create a file: the scripted engine answers the first turn with a tool
call that writes it and the second with a final answer. The CLI must exit 0, the file must
exist, and the session must yield one sample whose trained tokens are exactly the two
engine outputs. The CLIs come from ``agentrl install-clis`` (``make test`` runs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_support import git_repo, installed_cli

pytest_plugins = ("middleware_fixtures",)

pytestmark = pytest.mark.slow

PROMPT = "Create a file hello.txt containing hi"


def base_env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TERM": "dumb",
        "LANG": "C.UTF-8",
    }


async def run_cli(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 240):
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,  # `codex exec` waits for stdin EOF otherwise
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")


def hermes_call(name: str, arguments: dict) -> str:
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def assert_one_sample_with_two_outputs(samples, served) -> None:
    assert len(served) == 2, [g.output_ids for g in served]
    assert len(samples) == 1
    sample = samples[0]
    response = sample.tokens[sample.prompt_length :]
    trained = [t for t, m in zip(response, sample.loss_mask, strict=True) if m]
    trained_lps = [lp for lp, m in zip(sample.rollout_logprobs, sample.loss_mask, strict=True) if m]
    assert trained == [t for g in served for t in g.output_ids]
    assert trained_lps == [lp for g in served for lp in g.logprobs]
    assert sample.metadata["trained_turns"] == (1, 2)


@pytest.mark.parametrize("binary", ["claude", "claude-2.1.197"])
async def test_claude_code_writes_a_file_through_the_middleware(
    binary, tmp_path, middleware, scripted_engine
):
    """Claude Code 2.1.332 and 2.1.197 (-p, stream-json) call Write, then answer; exit 0."""
    claude = installed_cli(binary)
    repo = git_repo(tmp_path)
    token = middleware.open_session("claude")
    scripted_engine.queue(
        "I'll create the file.\n"
        + hermes_call("Write", {"file_path": str(repo / "hello.txt"), "content": "hi\n"}),
        session="claude",
    )
    scripted_engine.queue("Created hello.txt.", session="claude")
    env = {
        **base_env(tmp_path / "home"),
        "ANTHROPIC_BASE_URL": middleware.url,
        "ANTHROPIC_AUTH_TOKEN": token,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # bypassPermissions refuses to run as root otherwise
    code, stdout, stderr = await run_cli(
        [
            str(claude),
            "-p",
            PROMPT,
            "--permission-mode",
            "bypassPermissions",
            "--output-format",
            "stream-json",
            "--verbose",
        ],
        cwd=repo,
        env=env,
    )
    assert code == 0, f"claude exited {code}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    assert (repo / "hello.txt").read_text() == "hi\n"
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["type"] == "result" and result["result"] == "Created hello.txt."
    samples = await middleware.finish_session("claude", reward=1.0)
    assert_one_sample_with_two_outputs(samples, scripted_engine.served)


async def test_codex_writes_a_file_through_the_middleware(tmp_path, middleware, scripted_engine):
    """Codex 0.171 (exec --json, Responses API) runs exec_command via the middleware; exit 0."""
    codex = installed_cli("codex")
    repo = git_repo(tmp_path)
    token = middleware.open_session("codex")
    codex_home = tmp_path / "codex_home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "agentrl-policy"\n'
        'model_provider = "agentrl"\n'
        "[model_providers.agentrl]\n"
        'name = "agentrl"\n'
        f'base_url = "{middleware.url}/v1"\n'
        'env_key = "AGENTRL_TOKEN"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
    command = f"printf 'hi\\n' > {repo / 'hello.txt'}"
    scripted_engine.queue(
        hermes_call("exec_command", {"cmd": command, "workdir": str(repo)}), session="codex"
    )
    scripted_engine.queue("Created hello.txt.", session="codex")
    env = {
        **base_env(tmp_path / "home"),
        "CODEX_HOME": str(codex_home),
        "AGENTRL_TOKEN": token,
    }
    code, stdout, stderr = await run_cli(
        [str(codex), "exec", "--json", "--dangerously-bypass-approvals-and-sandbox", PROMPT],
        cwd=repo,
        env=env,
    )
    assert code == 0, f"codex exited {code}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    assert (repo / "hello.txt").read_text() == "hi\n"
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    messages = [
        e["item"].get("text")
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert messages == ["Created hello.txt."]
    samples = await middleware.finish_session("codex", reward=1.0)
    assert_one_sample_with_two_outputs(samples, scripted_engine.served)


async def test_claude_code_reports_an_engine_failure_and_exits_nonzero(
    tmp_path, middleware, scripted_engine
):
    """With the engine failing, Claude Code gets a 502 in Anthropic's shape, says so, exits 1."""
    claude = installed_cli("claude")
    repo = git_repo(tmp_path)
    token = middleware.open_session("claude-down")
    scripted_engine.fail_next(503, "engine is restarting", session="claude-down")
    env = {
        **base_env(tmp_path / "home"),
        "ANTHROPIC_BASE_URL": middleware.url,
        "ANTHROPIC_AUTH_TOKEN": token,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    code, stdout, stderr = await run_cli(
        [str(claude), "-p", PROMPT, "--output-format", "stream-json", "--verbose"],
        cwd=repo,
        env=env,
    )
    assert code != 0
    assert "inference engine failed" in stdout + stderr, stdout[-2000:] + stderr[-2000:]
    assert not middleware.trajectory.has_session("claude-down")


async def test_codex_reports_an_engine_failure_and_exits_nonzero(
    tmp_path, middleware, scripted_engine
):
    """With the engine failing, Codex gets a 502 in OpenAI's shape, reports it, exits non-zero."""
    codex = installed_cli("codex")
    repo = git_repo(tmp_path)
    token = middleware.open_session("codex-down")
    scripted_engine.fail_next(503, "engine is restarting", session="codex-down")
    codex_home = tmp_path / "codex_home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "agentrl-policy"\nmodel_provider = "agentrl"\n[model_providers.agentrl]\n'
        f'name = "agentrl"\nbase_url = "{middleware.url}/v1"\nenv_key = "AGENTRL_TOKEN"\n'
        'wire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
    )
    env = {**base_env(tmp_path / "home"), "CODEX_HOME": str(codex_home), "AGENTRL_TOKEN": token}
    code, stdout, stderr = await run_cli(
        [str(codex), "exec", "--json", "--dangerously-bypass-approvals-and-sandbox", PROMPT],
        cwd=repo,
        env=env,
    )
    assert code != 0
    assert "inference engine failed" in stdout + stderr, stdout[-2000:] + stderr[-2000:]
    assert not middleware.trajectory.has_session("codex-down")

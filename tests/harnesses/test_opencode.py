"""The opencode harness: its config, and the real opencode CLI through the middleware.

The CLI comes from ``agentrl install-clis`` (``$AGENTRL_CLI_DIR`` or ``.cache/clis``); the
real-CLI tests fail, not skip, without it. The scripted engine answers the first turn with a
``write`` tool call and the second with a final answer; opencode runs on the host exactly as
the harness launches it (config, environment, argv, prompt on stdin).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_support import git_repo, installed_cli
from rollout_support import tool_call

from agentrl.harnesses.base import HarnessContext
from agentrl.harnesses.opencode import OpencodeHarness
from agentrl.plugin_options import OptionsError
from agentrl.plugins import get_harness

pytest_plugins = ("middleware_fixtures",)

PROMPT = 'Create a file hello.txt containing "hi"'


def context(**overrides) -> HarnessContext:
    values = {"base_url": "http://127.0.0.1:18001/", "api_key": "tok-123", "workdir": "/w"}
    return HarnessContext(**{**values, **overrides})


def test_opencode_is_registered_and_speaks_chat_completions():
    """The built-in is found by name and declares the OpenAI Chat Completions adapter."""
    assert get_harness("opencode") is OpencodeHarness
    assert OpencodeHarness.protocol == "openai_chat"


def test_opencode_config_routes_every_call_to_the_session():
    """opencode.json: the middleware's /v1, the token from the env, all permissions allowed."""
    harness = OpencodeHarness(cli_path="/x", environ={})
    files = harness.config_files(context(model="policy-7"))
    config = json.loads(files[f"{harness.home}/.config/opencode/opencode.json"])
    provider = config["provider"]["agentrl"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:18001/v1"
    assert provider["options"]["apiKey"] == "{env:AGENTRL_SESSION_TOKEN}"
    assert config["model"] == config["small_model"] == "agentrl/policy-7"
    assert config["permission"] == "allow" and config["autoupdate"] is False
    env = harness.environment(context(), time_budget=60)
    assert env["AGENTRL_SESSION_TOKEN"] == "tok-123"
    assert env["XDG_CONFIG_HOME"] == f"{harness.home}/.config"
    assert env["OPENCODE_DISABLE_PROJECT_CONFIG"] == env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert harness.command(context()) == ["run", "--format", "json", "--auto", "--title", "agentrl"]


def test_opencode_reads_the_prompt_on_stdin():
    """The launch line feeds prompt.txt on stdin: a message argument would reach the model quoted."""
    harness = OpencodeHarness(cli_path="/x", environ={})
    line = harness.shell_command(context())
    assert line.endswith(f"< {harness.prompt_path}")
    assert "$(cat" not in line


def test_opencode_options_shape_the_agent():
    """tools, max_steps, instructions and token limits land in opencode.json; bad ones fail."""
    harness = OpencodeHarness(
        cli_path="/x",
        environ={},
        tools={"webfetch": False},
        max_steps=40,
        instructions="Run the tests before you finish.",
        context_limit=32768,
    )
    files = harness.config_files(context())
    config = json.loads(files[f"{harness.home}/.config/opencode/opencode.json"])
    assert config["tools"] == {"webfetch": False}
    assert config["agent"] == {"build": {"steps": 40}}
    assert config["instructions"] == [harness.instructions_path]
    assert files[harness.instructions_path] == "Run the tests before you finish."
    limit = config["provider"]["agentrl"]["models"]["agentrl-policy"]["limit"]
    assert limit == {"context": 32768, "output": 32000}
    OpencodeHarness.check_options({"max_steps": 3, "tools": {}})
    with pytest.raises(OptionsError, match="max_step"):
        OpencodeHarness.check_options({"max_step": 3})
    with pytest.raises(ValueError, match="max_steps"):
        OpencodeHarness(cli_path="/x", environ={}, max_steps=0)


# -- the real CLI --------------------------------------------------------------------------


def write_files(files: dict[str, str]) -> None:
    for path, content in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)


async def run_opencode(tmp_path: Path, url: str, token: str, **options) -> tuple[int, str, str]:
    """opencode as the harness launches it (config, env, argv, prompt on stdin), on the host."""
    harness = OpencodeHarness(
        cli_path=str(installed_cli("opencode")),
        state_dir=str(tmp_path / "state"),
        environ={},
        **options,
    )
    repo = tmp_path / "repo"
    ctx = context(base_url=url, api_key=token, workdir=str(repo))
    prompt = tmp_path / "prompt.txt"
    write_files({**harness.config_files(ctx), str(prompt): PROMPT})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **harness.environment(ctx, 120)}
    with prompt.open("rb") as stdin:
        process = await asyncio.create_subprocess_exec(
            str(installed_cli("opencode")),
            *harness.command(ctx),
            cwd=repo,
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), 180)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise
    return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")


@pytest.mark.slow
async def test_opencode_writes_a_file_through_the_middleware(
    tmp_path, middleware, scripted_engine, qwen_tokenizer
):
    """opencode 1.18 (run --format json, Chat Completions) writes hello.txt, answers; exit 0.

    The session yields one sample whose trained tokens are exactly the two engine outputs,
    and the user text is the prompt verbatim (no quotes added).
    """
    repo = git_repo(tmp_path)
    token = middleware.open_session("opencode")
    scripted_engine.queue(
        "I'll create the file.\n"
        + tool_call("write", filePath=str(repo / "hello.txt"), content="hi\n"),
        session="opencode",
    )
    scripted_engine.queue("Created hello.txt.", session="opencode")
    code, stdout, stderr = await run_opencode(tmp_path, middleware.url, token)
    assert code == 0, (
        f"opencode exited {code}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    )
    assert (repo / "hello.txt").read_text() == "hi\n"
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    texts = [e["part"]["text"] for e in events if e.get("type") == "text"]
    assert texts == ["I'll create the file.", "Created hello.txt."]
    served = scripted_engine.served
    assert len(served) == 2
    samples = await middleware.finish_session("opencode", reward=1.0)
    assert len(samples) == 1
    sample = samples[0]
    response = sample.tokens[sample.prompt_length :]
    trained = [t for t, m in zip(response, sample.loss_mask, strict=True) if m]
    assert trained == [t for g in served for t in g.output_ids]
    prompt = qwen_tokenizer.decode(sample.tokens[: sample.prompt_length])
    assert PROMPT in prompt and f'"{PROMPT}"' not in prompt


@pytest.mark.slow
async def test_opencode_reports_an_engine_failure_and_exits_nonzero(
    tmp_path, middleware, scripted_engine
):
    """With the engine failing, opencode gets the middleware's error, reports it, exits 1."""
    git_repo(tmp_path)
    token = middleware.open_session("opencode-down")
    scripted_engine.fail_next(503, "engine is restarting", session="opencode-down")
    code, stdout, stderr = await run_opencode(tmp_path, middleware.url, token)
    assert code != 0, stdout[-2000:] + stderr[-2000:]
    assert "inference engine failed" in stdout + stderr, stdout[-2000:] + stderr[-2000:]
    assert not middleware.trajectory.has_session("opencode-down")


@pytest.mark.slow
async def test_opencode_client_setup_reaches_the_session(tmp_path, middleware, scripted_engine):
    """The host instructions (``agentrl serve``) work as printed: opencode with that
    opencode.json and the token variable gets the session's answer; exit 0."""
    git_repo(tmp_path)
    token = middleware.open_session("opencode-host")
    scripted_engine.queue("Hello from the session.", session="opencode-host")
    setup = OpencodeHarness.client_setup(middleware.url, token)
    config_line, run_line = setup.lines
    assignment, binary = run_line.split(" ")
    assert binary == "opencode"
    variable, value = assignment.split("=", 1)
    home = tmp_path / "home"
    prompt = tmp_path / "prompt.txt"
    write_files({str(home / ".config/opencode/opencode.json"): config_line, str(prompt): "Hi"})
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        variable: value,
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    with prompt.open("rb") as stdin:
        process = await asyncio.create_subprocess_exec(
            str(installed_cli("opencode")),
            *["run", "--format", "json", "--title", "host"],
            cwd=tmp_path / "repo",
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 180)
    assert process.returncode == 0, stderr.decode()[-3000:]
    assert "Hello from the session." in stdout.decode()
    assert len(scripted_engine.served) == 1

"""The qwen_code harness: its configuration, and the real Qwen Code CLI run with it.

The real CLI (``@qwen-code/qwen-code`` from ``agentrl install-clis``) runs on this host
with exactly the settings file, environment and argv the harness gives a sandbox, against
the middleware and the scripted engine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rollout_support import CLI_DIR
from test_real_clis import assert_one_sample_with_two_outputs, git_repo, hermes_call, run_cli

from agentrl.harnesses.base import HarnessContext
from agentrl.harnesses.qwen_code import QwenCodeHarness
from agentrl.plugin_options import OptionsError
from agentrl.plugins import get_harness

pytest_plugins = ("middleware_fixtures",)

PROMPT = "Create a file hello.txt containing hi"


def context(**overrides) -> HarnessContext:
    values = dict(base_url="http://127.0.0.1:18001", api_key="tok-123", workdir="/workspace")
    return HarnessContext(**{**values, **overrides})


def qwen() -> Path:
    path = CLI_DIR / "bin" / "qwen"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"qwen CLI not found at {path}; install the pinned CLIs with `agentrl install-clis "
            "--dest .cache/clis` (or set AGENTRL_CLI_DIR to an install holding bin/qwen)"
        )
    return path


def test_qwen_code_is_registered_speaking_chat_completions():
    """The built-in is found by name and speaks OpenAI Chat Completions."""
    cls = get_harness("qwen_code")
    assert cls is QwenCodeHarness and cls.protocol == "openai_chat" and cls.binary == "qwen"


def test_settings_point_every_call_at_the_session_with_side_traffic_off():
    """settings.json: OpenAI auth, the model, usage statistics/telemetry/updates/memory off."""
    harness = QwenCodeHarness(cli_path="/x", environ={})
    files = harness.config_files(context(model="policy-7"))
    settings = json.loads(files[f"{harness.home}/.qwen/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "openai"
    assert settings["model"]["name"] == "policy-7"
    assert settings["model"]["generationConfig"]["timeout"] == 3_600_000
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["memory"] == {"enableManagedAutoMemory": False, "enableManagedAutoDream": False}
    assert "maxSessionTurns" not in settings["model"] and "exclude" not in settings["tools"]
    env = harness.environment(context(), time_budget=60)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:18001/v1"
    assert env["OPENAI_API_KEY"] == "tok-123" and env["HOME"] == harness.home
    assert harness.command(context()) == ["--yolo", "--output-format", "stream-json"]


def test_options_reach_the_settings_and_the_command_line():
    """max_turns, exclude_tools, core_tools, append_system_prompt and extra env are applied."""
    harness = QwenCodeHarness(
        cli_path="/x",
        max_turns=7,
        exclude_tools=["web_fetch"],
        core_tools=["read_file", "edit"],
        append_system_prompt="Be brief.",
        environ={"AGENTRL_QWEN_CODE_EXTRA_ENV": '{"EXTRA_KNOB": "on"}'},
    )
    settings = harness.settings(context())
    assert settings["model"]["maxSessionTurns"] == 7
    assert settings["tools"]["exclude"] == ["web_fetch"]
    assert settings["tools"]["core"] == ["read_file", "edit"]
    assert harness.command(context())[-2:] == ["--append-system-prompt", "Be brief."]
    assert harness.environment(context(), 60)["EXTRA_KNOB"] == "on"


def test_an_unknown_option_lists_the_valid_ones():
    """--harness-options are checked against the harness's fields before anything runs."""
    QwenCodeHarness.check_options({"max_turns": 3, "exclude_tools": ["web_fetch"]})
    with pytest.raises(OptionsError, match="max_turns") as raised:
        QwenCodeHarness.check_options({"max_turn": 3})
    assert "'qwen_code' harness has no option 'max_turn'" in str(raised.value)


def test_client_setup_sets_what_the_sandbox_run_gets():
    """The host instructions set the same URL, token and usage switch as a rollout's run."""
    setup = QwenCodeHarness.client_setup("http://127.0.0.1:8000", "tok-9")
    assigned = dict(
        word.split("=", 1) for line in setup.lines for word in line.split() if "=" in word
    )
    run_env = QwenCodeHarness(cli_path="/x", environ={}).environment(
        context(base_url="http://127.0.0.1:8000", api_key="tok-9"), time_budget=60
    )
    assert assigned == {key: run_env[key] for key in assigned}
    assert set(assigned) == {"OPENAI_BASE_URL", "OPENAI_API_KEY", "QWEN_USAGE_STATISTICS_ENABLED"}


def write_config(harness: QwenCodeHarness, ctx: HarnessContext) -> None:
    for path, content in harness.config_files(ctx).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)


async def run_as_harness(harness: QwenCodeHarness, tmp_path: Path, url: str, token: str):
    """The real qwen on this host with the harness's settings, environment and argv."""
    repo = git_repo(tmp_path)
    ctx = context(base_url=url, api_key=token, workdir=str(repo))
    write_config(harness, ctx)
    env = {**harness.environment(ctx, 240), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = [str(qwen()), *harness.command(ctx), PROMPT]
    return repo, await run_cli(argv, cwd=repo, env=env)


@pytest.mark.slow
async def test_qwen_code_writes_a_file_through_the_middleware(
    tmp_path, middleware, scripted_engine
):
    """Qwen Code 0.24 (stream-json, Chat Completions) calls write_file, then answers; exit 0."""
    token = middleware.open_session("qwen")
    harness = QwenCodeHarness(state_dir=str(tmp_path / "state"), environ={})
    hello = tmp_path / "repo" / "hello.txt"
    scripted_engine.queue(
        "I'll create the file.\n"
        + hermes_call("write_file", {"file_path": str(hello), "content": "hi\n"}),
        session="qwen",
    )
    scripted_engine.queue("Created hello.txt.", session="qwen")
    _, (code, stdout, stderr) = await run_as_harness(harness, tmp_path, middleware.url, token)
    assert code == 0, f"qwen exited {code}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    assert hello.read_text() == "hi\n"
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["type"] == "result" and result["result"] == "Created hello.txt."
    assert not stderr.strip(), stderr  # no yolo warning, no ripgrep fallback notice
    samples = await middleware.finish_session("qwen", reward=1.0)
    assert_one_sample_with_two_outputs(samples, scripted_engine.served)


@pytest.mark.slow
async def test_qwen_code_reports_an_engine_failure_and_exits_nonzero(
    tmp_path, middleware, scripted_engine
):
    """With the engine failing, Qwen Code gets 502s in OpenAI's shape, says so, exits non-zero.

    Qwen Code retries a 5xx itself (seven attempts, backoff from 1.5 s; ``max_retries`` only
    sets the OpenAI SDK's own retries), so this takes about a minute.
    """
    token = middleware.open_session("qwen-down")
    scripted_engine.fail_next(503, "engine is restarting", session="qwen-down")
    harness = QwenCodeHarness(state_dir=str(tmp_path / "state"), max_retries=0, environ={})
    _, (code, stdout, stderr) = await run_as_harness(harness, tmp_path, middleware.url, token)
    assert code != 0
    assert "inference engine failed" in stdout + stderr, stdout[-2000:] + stderr[-2000:]
    assert not middleware.trajectory.has_session("qwen-down")

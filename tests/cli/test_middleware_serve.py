"""`agentrl serve`: the middleware alone, printing how to connect, writing samples when stopped."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import types

import aiohttp
import pytest
from click.testing import CliRunner
from middleware_support import env_without_module

from agentrl import plugins
from agentrl.cli import cli
from agentrl.cli.serve import build_engine, run_server, serve
from agentrl.engines.base import Engine, Generation
from agentrl.engines.sglang import SGLangEngine
from agentrl.harnesses.base import ClientSetup
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.hookspecs import hookimpl

pytest_plugins = ("middleware_fixtures",)


def _announcer():
    """``(lines, serving, announce)``: what the server printed, set once it says "Serving"."""
    lines: list[str] = []
    serving = asyncio.Event()

    def announce(line: str) -> None:
        lines.append(line)
        if line.lstrip().startswith("Serving"):
            serving.set()

    return lines, serving, announce


async def test_serve_prints_tokens_and_writes_the_trajectory_on_stop(
    tmp_path, qwen_tokenizer, sglang_client, scripted_engine, http
):
    """Each client kind gets its own token; a served turn ends up in the JSONL when stopped.

    The prompt mode given (``render``) is the one the turn was made in.
    """
    stop = asyncio.Event()
    lines, serving, announce = _announcer()

    output = tmp_path / "out" / "trajectory.jsonl"
    server = asyncio.create_task(
        run_server(
            engine=sglang_client,
            tokenizer=qwen_tokenizer,
            host="127.0.0.1",
            port=0,
            unix_path=None,
            tool_parser="hermes",
            reasoning_parser="qwen3",
            session_options={"sampling_defaults": {"temperature": 0.6}},
            output=output,
            reward=0.25,
            prompt_mode="render",
            stop=stop,
            announce=announce,
        )
    )
    await asyncio.wait_for(serving.wait(), 30)
    text = "\n".join(lines)
    url = re.search(r"agentrl middleware at (\S+)", text).group(1)
    claude_token = re.search(r"ANTHROPIC_AUTH_TOKEN=(\S+)", text).group(1)
    codex_token = re.search(r"AGENTRL_TOKEN=(\S+) codex", text).group(1)
    assert claude_token != codex_token
    assert f'base_url = "{url}/v1"' in text
    scripted_engine.queue("Hello from the policy.")
    body = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(
        f"{url}/v1/messages", json=body, headers={"x-api-key": claude_token}
    ) as response:
        reply = await response.json()
    assert reply["content"] == [{"type": "text", "text": "Hello from the policy."}]
    assert scripted_engine.generate_requests[0].body["sampling_params"]["temperature"] == 0.6
    stop.set()
    assert await asyncio.wait_for(server, 30) == 1
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 1
    assert rows[0]["session"] == "claude_code" and rows[0]["reward"] == 0.25
    served = scripted_engine.served[0]
    assert rows[0]["tokens"][rows[0]["prompt_length"] :] == list(served.output_ids)
    (metadata,) = rows[0]["metadata"]["turn_metadata"].values()
    assert metadata["prompt_mode"] == "render"


def test_serve_command_is_registered_and_documents_its_options():
    """`agentrl serve --help` lists the engine, tokenizer and output options."""
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0, result.output
    for option in (
        "--engine",
        "--engine-url",
        "--tokenizer",
        "--unix-socket",
        "--output",
        "--prompt-mode",
    ):
        assert option in result.output
    assert serve.name == "serve"


def test_serve_without_engine_url_says_what_to_pass(qwen_tokenizer_dir):
    """`--engine sglang` without `--engine-url` is a usage error naming the option."""
    result = CliRunner().invoke(serve, ["--tokenizer", str(qwen_tokenizer_dir)])
    assert result.exit_code == 2
    assert "--engine-url" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--engine-url", "localhost:30000"], "http(s)://host:port"),
        (["--engine", "transformers", "--model", "/nonexistent/model"], "not a local model"),
    ],
)
def test_serve_reports_a_bad_engine_location_without_a_traceback(
    args, expected, qwen_tokenizer_dir
):
    """A malformed --engine-url or a missing --model directory is a usage error, not a crash."""
    result = CliRunner().invoke(serve, ["--tokenizer", str(qwen_tokenizer_dir), *args])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert not isinstance(result.exception, (ValueError, RuntimeError))


class RemoteEngine(Engine):
    """A plugin engine that runs at a URL, like sglang, with one option of its own."""

    name = "remote"
    location = "url"
    location_hint = "the remote server"

    def __init__(self, url: str, *, api_key: str = "") -> None:
        self.url, self.api_key = url, api_key

    async def generate(self, input_ids, sampling_params, *, rid=None, routing_key=None):
        return Generation(output_ids=(), logprobs=())


class _RemotePlugin:
    @hookimpl
    def register_engines(self, register):
        register(RemoteEngine)


def test_serve_builds_engines_through_their_contract(agentrl_registry):
    """`serve` builds any engine with ``Engine.from_options``: a plugin engine gets the built-ins'
    treatment, and a missing location names serve's own flag (--model, not --model-path)."""
    import click

    agentrl_registry.pm.register(_RemotePlugin())
    engine = build_engine("remote", "http://10.0.0.1:8000", None)
    assert isinstance(engine, RemoteEngine) and engine.url == "http://10.0.0.1:8000"
    with pytest.raises(click.UsageError, match=r"--engine remote needs --engine-url \(the remote"):
        build_engine("remote", None, "/models/q")
    with pytest.raises(click.UsageError, match=r"--engine transformers needs --model \("):
        build_engine("transformers", "http://10.0.0.1:8000", None)


def test_serve_reports_a_missing_tokenizer_directory(tmp_path):
    """--tokenizer pointing nowhere says so and exits 2 instead of raising TokenizerError."""
    result = CliRunner().invoke(serve, ["--tokenizer", str(tmp_path / "nope")])
    assert result.exit_code == 2, result.output
    assert "is not a directory" in result.output


def test_serve_on_a_port_in_use_says_so_in_one_line(qwen_tokenizer_dir):
    """A taken --port is a one-line error naming host:port and --port, not an OSError traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            serve,
            [
                "--tokenizer",
                str(qwen_tokenizer_dir),
                "--engine-url",
                "http://127.0.0.1:9",
                "--port",
                str(port),
            ],
        )
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0]


def _serve_plain(engine, tokenizer, tmp_path, stop, announce, warn):
    """`run_server` with no parsers, no session options, output under ``tmp_path``."""
    return run_server(
        engine=engine,
        tokenizer=tokenizer,
        host="127.0.0.1",
        port=0,
        unix_path=None,
        tool_parser=None,
        reasoning_parser=None,
        session_options={},
        output=tmp_path / "trajectory.jsonl",
        reward=0.0,
        stop=stop,
        announce=announce,
        warn=warn,
    )


async def test_serve_warns_at_start_up_when_the_engine_does_not_answer(tmp_path, qwen_tokenizer):
    """An engine URL nobody answers draws one warning naming it; serving goes on (503 healthz)."""
    stop = asyncio.Event()
    warnings: list[str] = []
    lines, serving, announce = _announcer()

    engine = SGLangEngine("http://127.0.0.1:9")
    server = asyncio.create_task(
        _serve_plain(engine, qwen_tokenizer, tmp_path, stop, announce, warnings.append)
    )
    await asyncio.wait_for(serving.wait(), 30)
    assert len(warnings) == 1
    assert "http://127.0.0.1:9" in warnings[0] and "does not answer" in warnings[0]
    url = re.search(r"agentrl middleware at (\S+)", "\n".join(lines)).group(1)
    async with aiohttp.ClientSession(trust_env=False) as http:
        async with http.get(url + "/healthz") as response:
            assert response.status == 503
    stop.set()
    assert await asyncio.wait_for(server, 30) == 0


SERVE_INSTRUCTIONS = """\
agentrl middleware at URL

Claude Code:
  ANTHROPIC_BASE_URL=URL ANTHROPIC_AUTH_TOKEN=TOKEN-1 \\
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 claude

Codex (in $CODEX_HOME/config.toml, then run with AGENTRL_TOKEN set):
  model = "agentrl-policy"
  model_provider = "agentrl"
  [model_providers.agentrl]
  name = "agentrl"
  base_url = "URL/v1"
  env_key = "AGENTRL_TOKEN"
  wire_api = "responses"
  AGENTRL_TOKEN=TOKEN-2 codex

mini-swe-agent:
  OPENAI_API_KEY=TOKEN-3 MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors \\
  LITELLM_LOCAL_MODEL_COST_MAP=True \\
  mini -m openai/agentrl-policy -c mini.yaml -c model.model_kwargs.api_base=URL/v1

opencode (in ~/.config/opencode/opencode.json, then run with AGENTRL_TOKEN set):
  {"provider": {"agentrl": {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": "URL/v1", "apiKey": "{env:AGENTRL_TOKEN}"}, "models": {"agentrl-policy": {}}}}, "model": "agentrl/agentrl-policy"}
  AGENTRL_TOKEN=TOKEN-4 opencode

Qwen Code:
  OPENAI_BASE_URL=URL/v1 OPENAI_API_KEY=TOKEN-5 \\
  QWEN_USAGE_STATISTICS_ENABLED=false qwen --auth-type openai --model agentrl-policy

OpenAI SDK (Chat Completions or Responses) / Anthropic SDK:
  OPENAI_BASE_URL=URL/v1 OPENAI_API_KEY=TOKEN-6
  ANTHROPIC_BASE_URL=URL ANTHROPIC_API_KEY=TOKEN-6"""


async def test_serve_prints_each_clients_settings_exactly(tmp_path, qwen_tokenizer, sglang_client):
    """The start-up text names, per client, the variables and config that point it here.

    Claude Code's, Codex's, mini-swe-agent's, opencode's and Qwen Code's come from their
    harnesses; the URL and the six session tokens (one per client kind) are replaced by
    placeholders.
    """
    stop = asyncio.Event()
    lines, serving, announce = _announcer()
    server = asyncio.create_task(
        _serve_plain(sglang_client, qwen_tokenizer, tmp_path, stop, announce, lambda line: None)
    )
    await asyncio.wait_for(serving.wait(), 30)
    stop.set()
    await asyncio.wait_for(server, 30)
    text = lines[0]
    url = re.search(r"agentrl middleware at (\S+)", text).group(1)
    tokens = list(dict.fromkeys(re.findall(r"(?:TOKEN|API_KEY)=(\S+)", text)))
    assert len(tokens) == 6
    for number, token in enumerate(tokens, start=1):
        text = text.replace(token, f"TOKEN-{number}")
    assert text.replace(url, "URL") == SERVE_INSTRUCTIONS


class _DescribedHarness(ClaudeCodeHarness):
    """A plugin's harness that says how its CLI on the host is pointed at a middleware."""

    name = "zz_described"

    @classmethod
    def client_setup(cls, base_url, token):
        return ClientSetup(title="Described CLI", lines=(f"URL={base_url} KEY={token} cli",))


class _SilentHarness(ClaudeCodeHarness):
    """A plugin's harness that cannot say (returns None, as the contract's default does)."""

    name = "zz_silent"

    @classmethod
    def client_setup(cls, base_url, token):
        return None


async def test_serve_asks_every_registered_harness_how_its_cli_is_pointed_here(
    tmp_path, qwen_tokenizer, sglang_client, scripted_engine, http
):
    """A plugin's harness gets its own session and section; one that cannot say gets neither.

    The described session's token is one the middleware accepts, and the turn served on it
    is written under that session's name.
    """
    registry = plugins.PluginRegistry(load_entrypoints=False, disabled=())
    module = types.ModuleType("more_harnesses")

    def register_harnesses(register):
        register(_DescribedHarness)
        register(_SilentHarness)

    module.register_harnesses = hookimpl(register_harnesses)
    registry.pm.register(module, name="more-harnesses")
    previous = plugins.reset_registry(registry)
    stop = asyncio.Event()
    warnings: list[str] = []
    lines, serving, announce = _announcer()
    try:
        server = asyncio.create_task(
            _serve_plain(sglang_client, qwen_tokenizer, tmp_path, stop, announce, warnings.append)
        )
        await asyncio.wait_for(serving.wait(), 30)
        text = lines[0]
        titles = re.findall(r"^(\S.*):$", text, re.MULTILINE)
        assert titles[0] == "Claude Code" and titles[1].startswith("Codex (")
        assert titles[2] == "mini-swe-agent"
        assert titles[3].startswith("opencode (")
        assert titles[4] == "Qwen Code"
        assert titles[5:] == [
            "Described CLI",
            "OpenAI SDK (Chat Completions or Responses) / Anthropic SDK",
        ]
        url, token = re.search(r"^  URL=(\S+) KEY=(\S+) cli$", text, re.MULTILINE).groups()
        assert text.startswith(f"agentrl middleware at {url}\n")
        scripted_engine.queue("Hello, described CLI.")
        body = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{url}/v1/messages", json=body, headers={"x-api-key": token}) as r:
            assert r.status == 200, await r.text()
        stop.set()
        assert await asyncio.wait_for(server, 30) == 1
    finally:
        plugins.reset_registry(previous)
    rows = [json.loads(line) for line in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert [row["session"] for row in rows] == ["zz_described"]


async def test_serve_with_a_healthy_engine_warns_nothing(tmp_path, qwen_tokenizer, sglang_client):
    """The start-up check is silent when the engine answers /health."""
    stop = asyncio.Event()
    warnings: list[str] = []

    def announce(line: str) -> None:
        if line.lstrip().startswith("Serving"):
            stop.set()

    await _serve_plain(sglang_client, qwen_tokenizer, tmp_path, stop, announce, warnings.append)
    assert warnings == []


def test_serve_without_jinja2_fails_at_start_up_in_one_line(tmp_path, qwen_tokenizer_dir):
    """No jinja2: `agentrl serve` stops before serving with one line saying to install it.

    Without the check it would serve and answer every request with a 400.
    """
    command = [sys.executable, "-c", "from agentrl.cli import main; main()", "serve"]
    args = ["--tokenizer", str(qwen_tokenizer_dir), "--engine-url", "http://127.0.0.1:9"]
    result = subprocess.run(
        [*command, *args, "--port", "0"],
        env=env_without_module("jinja2", tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "jinja2" in lines[0] and "pip install -U 'jinja2>=3.1'" in lines[0]

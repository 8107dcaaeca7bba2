"""Harness plugins and the workspace helpers, in the real local sandbox.

The install/launch mechanics run a stand-in CLI: a real npm package (``npm pack`` of a
small Node script that reports its argv, cwd, uid and environment) installed with the real
npm inside bubblewrap, so nothing about the launch is mocked. The real Claude Code and
Codex CLIs drive whole rollouts in ``test_rollout.py``; here Codex checks the config.toml
we write with ``--strict-config``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

from agentrl.harnesses.base import HarnessContext, HarnessError, parse_extra_args, parse_extra_env
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.codex import CodexHarness
from agentrl.harnesses.npm import npm_install_specs
from agentrl.harnesses.workspace import capture_diff, ensure_user, prepare_workspace
from agentrl.plugins import get_harness
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import Task

REPO = Path(__file__).resolve().parents[2]
CLI_DIR = Path(os.environ.get("AGENTRL_CLI_DIR", REPO / ".cache" / "clis"))

FAKE_CLI = r"""#!/usr/bin/env node
const fs = require("fs");
const args = process.argv.slice(2);
if (args.includes("--version")) { console.log("9.9.9 (stand-in)"); process.exit(0); }
const keep = ["HOME", "PATH", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "IS_SANDBOX",
  "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "EXTRA_KNOB", "CODEX_HOME", "AGENTRL_PATH"];
const env = Object.fromEntries(keep.filter((k) => k in process.env).map((k) => [k, process.env[k]]));
console.log(JSON.stringify({ args, cwd: process.cwd(), uid: process.getuid(), env }));
console.error("stand-in stderr line");
const sleep = Number(process.env.FAKE_SLEEP || 0);
setTimeout(() => process.exit(Number(process.env.FAKE_EXIT || 0)), sleep * 1000);
"""


@pytest.fixture(scope="module")
def fake_tarball(tmp_path_factory):
    """``npm pack`` of a stand-in package whose ``claude`` and ``codex`` bins report how they ran."""
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed; install Node.js >= 20 with npm")
    src = tmp_path_factory.mktemp("fake-cli")
    (src / "cli.js").write_text(FAKE_CLI)
    (src / "cli.js").chmod(0o755)
    package = {
        "name": "agentrl-stand-in-cli",
        "version": "9.9.9",
        "bin": {"claude": "cli.js", "codex": "cli.js"},
    }
    (src / "package.json").write_text(json.dumps(package))
    out = subprocess.run(
        ["npm", "pack", "--silent", "--pack-destination", str(src)],
        cwd=src,
        check=True,
        capture_output=True,
        text=True,
    )
    return src / out.stdout.strip().splitlines()[-1]


@pytest.fixture
async def sandbox(tmp_path):
    """A started local sandbox whose /workspace is a small repository copy."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (repo / "README.md").write_text("readme\n")
    async with LocalSandbox(repo=str(repo)) as box:
        yield box


def context(**overrides) -> HarnessContext:
    values = {"base_url": "http://127.0.0.1:18001/", "api_key": "tok-123", "workdir": "/workspace"}
    return HarnessContext(**{**values, **overrides})


# -- configuration -----------------------------------------------------------------------


def test_extra_args_prefer_agentrl_variables_over_slime_ones():
    """AGENTRL_* wins over SLIME_*; a JSON list or a shell string both work."""
    names = ClaudeCodeHarness.extra_args_vars
    env = {"SLIME_AGENT_CC_EXTRA_ARGS": '["--max-turns", "7"]'}
    assert parse_extra_args(env, names) == ("--max-turns", "7")
    env["AGENTRL_CLAUDE_CODE_EXTRA_ARGS"] = "--settings '{\"a\": 1}' --debug"
    assert parse_extra_args(env, names) == ("--settings", '{"a": 1}', "--debug")
    with pytest.raises(HarnessError, match="must be a JSON list of strings"):
        parse_extra_args({"AGENTRL_CODEX_EXTRA_ARGS": '{"x": 1}'}, CodexHarness.extra_args_vars)


def test_extra_env_must_be_a_json_object():
    """Extra env is a JSON object; anything else fails naming the variable and the fix."""
    names = CodexHarness.extra_env_vars
    assert parse_extra_env({"SLIME_AGENT_CODEX_EXTRA_ENVS": '{"A": "1", "B": 2}'}, names) == {
        "A": "1",
        "B": "2",
    }
    with pytest.raises(HarnessError, match="AGENTRL_CODEX_EXTRA_ENV is not valid JSON"):
        parse_extra_env({"AGENTRL_CODEX_EXTRA_ENV": "A=1"}, names)
    with pytest.raises(HarnessError, match="must be a JSON object"):
        parse_extra_env({"AGENTRL_CODEX_EXTRA_ENV": "[1]"}, names)


def test_harnesses_are_registered_with_their_protocols():
    """Both built-ins are found by name and declare the adapter they speak."""
    assert get_harness("claude_code").protocol == "anthropic"
    assert get_harness("codex").protocol == "openai_responses"


def test_claude_code_points_at_the_session_headless():
    """Base URL, bearer token, no non-essential traffic, pre-accepted permissions."""
    harness = ClaudeCodeHarness(
        cli_path="/x", environ={"AGENTRL_CLAUDE_CODE_EXTRA_ENV": '{"EXTRA_KNOB": "on"}'}
    )
    env = harness.environment(context(), time_budget=900)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18001"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "tok-123"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["EXTRA_KNOB"] == "on" and "IS_SANDBOX" not in env
    assert harness.environment(context(user="root"), 900)["IS_SANDBOX"] == "1"
    argv = harness.command(context())
    assert argv[:4] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert "bypassPermissions" in argv
    settings = json.loads(harness.config_files(context())[f"{harness.home}/.claude/settings.json"])
    assert settings["permissions"]["defaultMode"] == "bypassPermissions"


def test_codex_config_routes_to_the_middleware():
    """config.toml: inline base_url ending /v1, responses wire API, the token's env_key."""
    harness = CodexHarness(cli_path="/x", environ={})
    config = tomllib.loads(harness.config_toml(context(model="policy-7")))
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:18001/v1"
    assert provider["wire_api"] == "responses" and config["model"] == "policy-7"
    env = harness.environment(context(), time_budget=60)
    assert env[provider["env_key"]] == "tok-123" and env["CODEX_HOME"] == harness.codex_home
    assert harness.command(context())[:3] == [
        "exec",
        "--json",
        "--dangerously-bypass-approvals-and-sandbox",
    ]


def test_the_real_codex_accepts_our_config_strictly(tmp_path):
    """Codex 0.171 with --strict-config loads our config.toml (unknown keys would fail)."""
    codex = CLI_DIR / "bin" / "codex"
    if not codex.exists():
        pytest.fail(f"{codex} is missing; run `agentrl install-clis --dest .cache/clis`")
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(CodexHarness(cli_path="/x").config_toml(context()))
    run = _run_until_turn(codex, tmp_path, home)
    assert "Error loading config" not in run and '"type":"turn.started"' in run
    (home / "config.toml").write_text(
        (home / "config.toml").read_text() + "not_a_codex_setting = 1\n"
    )
    assert "unknown configuration field" in _run_until_turn(codex, tmp_path, home)


def test_claude_code_client_setup_sets_what_the_sandbox_run_gets():
    """The host instructions set the same URL, token and traffic switch as a rollout's run."""
    setup = ClaudeCodeHarness.client_setup("http://127.0.0.1:8000", "tok-9")
    assert setup.title == "Claude Code" and setup.lines[-1].endswith(" claude")
    assigned = dict(
        word.split("=", 1) for line in setup.lines for word in line.split() if "=" in word
    )
    run_env = ClaudeCodeHarness(cli_path="/x", environ={}).environment(
        context(base_url="http://127.0.0.1:8000", api_key="tok-9"), time_budget=60
    )
    assert assigned == {key: run_env[key] for key in assigned}
    assert set(assigned) == {
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    }


def test_codex_client_setup_is_a_config_the_real_codex_accepts(tmp_path):
    """The host instructions' config.toml lines load in Codex 0.171 with --strict-config.

    They name the middleware's /v1 with the responses wire API, and the token variable the
    last line sets.
    """
    codex = CLI_DIR / "bin" / "codex"
    if not codex.exists():
        pytest.fail(f"{codex} is missing; run `agentrl install-clis --dest .cache/clis`")
    setup = CodexHarness.client_setup("http://127.0.0.1:8000", "tok-9")
    *config_lines, run_line = setup.lines
    config = tomllib.loads("\n".join(config_lines))
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:8000/v1"
    assert provider["wire_api"] == "responses"
    assert run_line == f"{provider['env_key']}=tok-9 codex"
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text("\n".join(config_lines) + "\n")
    run = _run_until_turn(codex, tmp_path, home)
    assert "Error loading config" not in run and '"type":"turn.started"' in run


def _run_until_turn(codex: Path, cwd: Path, home: Path) -> str:
    """Start ``codex exec`` and stop it once it has either loaded its config or failed."""
    proc = subprocess.Popen(
        [str(codex), "exec", "--strict-config", "--json", "--skip-git-repo-check", "hi"],
        cwd=cwd,
        env={"PATH": os.environ["PATH"], "HOME": str(cwd), "CODEX_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "turn.started" in line or "configuration field" in line:
                break
    finally:
        proc.kill()
        proc.wait()
    return "".join(seen)


def test_host_install_binds_the_install_at_its_own_path(tmp_path):
    """host_install returns a read-only bind of the resolved dir and the CLI inside it."""
    binds, cli = ClaudeCodeHarness.host_install(CLI_DIR)
    root = str(CLI_DIR.resolve())
    assert binds == {root: root} and cli.startswith(root + "/")
    with pytest.raises(HarnessError, match="agentrl install-clis"):
        CodexHarness.host_install(tmp_path)


def _npm_tarball(path: Path, manifest: dict) -> str:
    data = json.dumps(manifest).encode()
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("package/package.json")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return str(path)


def test_a_platform_package_behind_an_npm_alias_installs_under_the_alias(tmp_path):
    """Codex's platform tarball shares the main package's name: it installs as its alias."""
    main = _npm_tarball(
        tmp_path / "openai-codex-0.171.0.tgz",
        {
            "name": "@openai/codex",
            "version": "0.171.0",
            "optionalDependencies": {
                "@openai/codex-linux-x64": "npm:@openai/codex@0.171.0-linux-x64",
                "@openai/codex-darwin-arm64": "npm:@openai/codex@0.171.0-darwin-arm64",
            },
        },
    )
    platform = _npm_tarball(
        tmp_path / "openai-codex-0.171.0-linux-x64.tgz",
        {"name": "@openai/codex", "version": "0.171.0-linux-x64"},
    )
    assert npm_install_specs([main, platform]) == [
        (main, None),
        (platform, "@openai/codex-linux-x64"),
    ]
    (tmp_path / "junk.tgz").write_bytes(b"not a tarball")
    with pytest.raises(HarnessError, match="not a readable npm package tarball"):
        npm_install_specs([str(tmp_path / "junk.tgz")])


# -- install and run in a sandbox --------------------------------------------------------


async def test_install_from_a_tarball_then_run_as_the_agent(sandbox, fake_tarball):
    """npm installs the tarball; the CLI runs as the agent in the workdir with the session env."""
    harness = ClaudeCodeHarness(
        tarballs=[str(fake_tarball)], extra_args=("--max-turns", "3"), extra_env={}
    )
    installed = await harness.install(sandbox)
    assert installed.startswith(f"{harness.state_dir}/npm/")
    ctx = context()
    await harness.configure(sandbox, ctx)
    code = await harness.run(sandbox, ctx, "fix 'the' $BUG", time_budget=60)
    assert code == 0
    log = await harness.read_log(sandbox)
    report = json.loads(log.splitlines()[0])
    assert report["args"][-3:] == ["--max-turns", "3", "fix 'the' $BUG"]
    assert report["cwd"] == "/workspace" and report["uid"] == sandbox.agent_uid
    assert report["env"]["ANTHROPIC_AUTH_TOKEN"] == "tok-123"
    assert report["env"]["PATH"].startswith(harness.path_prefix())
    assert "[stderr]\nstand-in stderr line" in log
    profile = await sandbox.read_file(f"{harness.home}/.profile")
    assert "AGENTRL_PATH" in profile


async def test_exit_codes_and_the_time_budget(sandbox, fake_tarball):
    """A failing CLI's exit code comes back; one past its budget is killed with -1."""
    harness = CodexHarness(
        tarballs=[str(fake_tarball)], extra_args=(), extra_env={"FAKE_EXIT": "3"}
    )
    await harness.install(sandbox)
    await harness.configure(sandbox, context())
    assert await harness.run(sandbox, context(), "go", time_budget=60) == 3
    harness.extra_env = {"FAKE_SLEEP": "120"}
    assert await harness.run(sandbox, context(), "go", time_budget=2) == -1
    left = await sandbox.exec("ps -eo args | grep -c '[c]li.js'", user="root")
    assert left.stdout.strip() == "0"


async def test_transient_npm_failures_are_retried(sandbox, fake_tarball):
    """ECONNRESET from npm is retried with backoff; E404 fails at once with npm's message."""
    harness = ClaudeCodeHarness(
        tarballs=[str(fake_tarball)], install_backoff=0.01, extra_args=(), extra_env={}
    )
    real_npm = shutil.which("npm")
    wrapper = (
        "#!/bin/sh\n"
        f"n=$(cat {harness.state_dir}/calls 2>/dev/null || echo 0); n=$((n+1)); "
        f"echo $n > {harness.state_dir}/calls\n"
        'if [ "$n" -eq 1 ]; then echo "npm ERR! code $FAIL_WITH" >&2; exit 1; fi\n'
        f'exec {real_npm} "$@"\n'
    )
    await sandbox.write_file(f"{harness.state_dir}/bin/npm", wrapper)
    await sandbox.exec(f"chmod 755 {harness.state_dir}/bin/npm", user="root", check=True)
    sandbox.env["FAIL_WITH"] = "ECONNRESET"
    await harness.install(sandbox)
    assert (await sandbox.read_file(f"{harness.state_dir}/calls")).strip() == "2"

    await sandbox.exec(f"rm -f {harness.state_dir}/calls", user="root", check=True)
    sandbox.env["FAIL_WITH"] = "E404"
    with pytest.raises(HarnessError, match=r"attempt 1/4\).*E404"):
        await harness.install(sandbox)


async def test_a_missing_preinstalled_cli_says_what_to_do(sandbox):
    """No CLI at cli_path: the error names the path and both ways to provide one."""
    harness = ClaudeCodeHarness(cli_path="/opt/nowhere/claude", extra_args=(), extra_env={})
    with pytest.raises(HarnessError, match=r"cli_path=.*tarballs="):
        await harness.install(sandbox)


# -- workspace ---------------------------------------------------------------------------


@pytest.mark.parametrize("already_a_repo", [False, True])
async def test_the_diff_holds_every_change_and_nothing_else(sandbox, already_a_repo):
    """New, binary and deleted files are in the diff; statement, harness files, caches are not."""
    if already_a_repo:
        init = "git init -q && git add -A && git -c user.name=a -c user.email=a@b commit -qm base"
        assert (await sandbox.exec(init, user="root")).exit_code == 0
    task = Task(
        instance_id="t-1",
        problem_statement="Make VALUE 2.",
        pre_commands=("printf 'built\\n' > build.log",),
    )
    baseline = await prepare_workspace(sandbox, task, ignore=("__pycache__/",))
    statement = await sandbox.read_file("/workspace/PROBLEM_STATEMENT.md", user="agent")
    assert statement == "Make VALUE 2."
    script = (
        "set -e; cd /workspace; sed -i 's/1/2/' pkg/mod.py; rm README.md; "
        "printf 'new\\n' > pkg/new.py; printf '\\000\\001\\002' > blob.bin; "
        "mkdir -p .claude pkg/__pycache__; echo x > .claude/state; echo c > pkg/__pycache__/m.pyc; "
        "git add -A && git -c user.name=a -c user.email=a@b commit -qm 'agent commit'"
    )
    assert (await sandbox.exec(script, user="agent")).exit_code == 0
    diff = await capture_diff(
        sandbox, "/workspace", baseline, ("PROBLEM_STATEMENT.md", ".claude"), ("__pycache__/",)
    )
    changed = {line.split(" b/")[-1] for line in diff.splitlines() if line.startswith("diff --git")}
    assert changed == {"pkg/mod.py", "README.md", "pkg/new.py", "blob.bin"}
    assert "GIT binary patch" in diff and "+VALUE = 2" in diff
    assert "build.log" not in diff


async def test_a_failing_pre_command_is_reported(sandbox):
    """A pre-command that fails stops preparation with its exit code and output."""
    task = Task(instance_id="t-2", problem_statement="x", pre_commands=("echo nope >&2; exit 4",))
    with pytest.raises(HarnessError, match=r"pre_command 1/1 of task t-2 exited with code 4.*nope"):
        await prepare_workspace(sandbox, task)


async def test_a_missing_agent_user_is_created_or_explained(sandbox):
    """The existing agent user passes; one that cannot be created names both fixes."""
    await ensure_user(sandbox, "agent")
    await ensure_user(sandbox, "root")
    with pytest.raises(HarnessError, match=r"(?s)no user 'builder'.*agent_user='root'"):
        await ensure_user(sandbox, "builder")  # /etc is read-only in the local sandbox

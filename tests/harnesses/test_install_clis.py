"""`agentrl install-clis` and the CLI finder (agentrl.harnesses.install_clis).

A real npm install of the pinned CLIs is slow and needs the npm registry, so the installer
is driven against a stand-in ``npm`` put first on PATH: it records its argv and lays out
what ``npm install --prefix P PACKAGE@VERSION`` leaves behind (``P/node_modules/.bin/X``
linked into the package's own directory). The real install that ``make test`` made is
checked to be reused as is. The PATH fallback binds the real Claude Code into the real
local sandbox.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner
from wheel_support import build_wheel

from agentrl.cli import cli
from agentrl.harnesses import install_clis
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.codex import CodexHarness
from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.install_clis import find_cli_dir
from agentrl.sandboxes.local import LocalSandbox

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI_DIR = pathlib.Path(os.environ.get("AGENTRL_CLI_DIR", REPO / ".cache" / "clis"))
NPM_FLAGS = [
    "--no-save",
    "--no-audit",
    "--no-fund",
    "--no-package-lock",
    "--engine-strict=false",
    "--loglevel=error",
]

#: Stands in for npm: appends its argv (JSON) to $FAKE_NPM_LOG, fails with $FAKE_NPM_FAIL
#: when set, else installs a tiny CLI that prints its version the way npm lays packages out.
FAKE_NPM = """\
#!{python}
import json, os, pathlib, sys
args = sys.argv[1:]
with open(os.environ["FAKE_NPM_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_NPM_FAIL"):
    sys.exit(os.environ["FAKE_NPM_FAIL"])
prefix = pathlib.Path(args[args.index("--prefix") + 1])
package, version = args[-1].rsplit("@", 1)
binaries = {{"@anthropic-ai/claude-code": "claude", "@openai/codex": "codex"}}
binary = {{**binaries, "@qwen-code/qwen-code": "qwen", "opencode-ai": "opencode"}}[package]
home = prefix / "node_modules" / package
(home / "bin").mkdir(parents=True)
exe = home / "bin" / binary
exe.write_text("#!/bin/sh\\necho " + version + "\\n")
exe.chmod(0o755)
(prefix / "node_modules" / ".bin").mkdir()
os.symlink(f"../{{package}}/bin/{{binary}}", prefix / "node_modules" / ".bin" / binary)
"""


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No install anywhere agentrl looks: empty cache, no AGENTRL_CLI_DIR, no checkout."""
    monkeypatch.delenv("AGENTRL_CLI_DIR", raising=False)
    for var in (
        "CLAUDE_CODE_VERSION",
        "CLAUDE_CODE_NODE18_VERSION",
        "CODEX_VERSION",
        "QWEN_CODE_VERSION",
        "OPENCODE_VERSION",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(install_clis, "_checkout_cli_dir", lambda: None)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    monkeypatch.setenv("PATH", f"{path_dir}:/usr/bin:/bin")
    return path_dir


@pytest.fixture
def fake_npm(isolated, tmp_path, monkeypatch):
    """The stand-in npm on PATH; returns a function giving the argv of every call so far.

    pip, for the Python pin, sees no index but a stand-in wheel of mini-swe-agent 2.4.6.
    """
    monkeypatch.delenv("MINI_SWE_AGENT_VERSION", raising=False)
    build_wheel(tmp_path / "wheels", "mini-swe-agent", "2.4.6", "minisweagent")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    log = tmp_path / "npm.log"
    log.touch()
    npm = isolated / "npm"
    npm.write_text(FAKE_NPM.format(python=sys.executable))
    npm.chmod(0o755)
    monkeypatch.setenv("FAKE_NPM_LOG", str(log))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()]


def _install(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["install-clis", *args])
    return result.exit_code, result.stderr


def test_installs_every_pin_with_npm_then_reuses_them(fake_npm, tmp_path):
    """Five npm installs with the script's flags and layout, mini-swe-agent with pip; a rerun
    calls neither."""
    dest = tmp_path / "clis"
    code, stderr = _install("--dest", str(dest))
    assert code == 0, stderr
    specs = [
        ("claude-2.1.332", "@anthropic-ai/claude-code@2.1.332"),
        ("claude-2.1.197", "@anthropic-ai/claude-code@2.1.197"),
        ("codex-0.171.0", "@openai/codex@0.171.0"),
        ("qwen-0.24.4", "@qwen-code/qwen-code@0.24.4"),
        ("opencode-1.18.33", "opencode-ai@1.18.33"),
    ]
    assert fake_npm() == [
        ["install", "--prefix", str(dest / prefix), *NPM_FLAGS, spec] for prefix, spec in specs
    ]
    for prefix, _ in specs:
        assert (dest / prefix / ".installed").is_file()
    for link, prefix, binary in (
        ("claude", "claude-2.1.332", "claude"),
        ("claude-2.1.197", "claude-2.1.197", "claude"),
        ("codex", "codex-0.171.0", "codex"),
        ("qwen", "qwen-0.24.4", "qwen"),
        ("opencode", "opencode-1.18.33", "opencode"),
    ):
        assert os.readlink(dest / "bin" / link) == str(dest / prefix / "node_modules/.bin" / binary)
    assert "installing @openai/codex@0.171.0" in stderr and "ready in" in stderr
    assert "installing mini-swe-agent==2.4.6" in stderr and "(pip)" in stderr
    assert os.readlink(dest / "bin" / "mini") == "../mini-2.4.6/bin/mini"
    assert (dest / "mini-2.4.6" / "site" / "minisweagent" / "__main__.py").is_file()
    assert (dest / "mini-2.4.6" / ".installed").is_file()

    started = time.monotonic()
    code, stderr = _install("--dest", str(dest))
    assert code == 0 and time.monotonic() - started < 1.0, stderr
    assert len(fake_npm()) == 5
    assert stderr.count("already installed") == len(install_clis.PINS)


def test_version_overrides_and_only(fake_npm, tmp_path, monkeypatch):
    """The script's version variables pick the versions; --only claude leaves Codex out."""
    monkeypatch.setenv("CLAUDE_CODE_VERSION", "9.9.9")
    monkeypatch.setenv("CLAUDE_CODE_NODE18_VERSION", "1.2.3")
    dest = tmp_path / "clis"
    code, stderr = _install("--dest", str(dest), "--only", "claude")
    assert code == 0, stderr
    assert [argv[-1] for argv in fake_npm()] == [
        "@anthropic-ai/claude-code@9.9.9",
        "@anthropic-ai/claude-code@1.2.3",
    ]
    assert sorted(p.name for p in (dest / "bin").iterdir()) == ["claude", "claude-1.2.3"]
    assert (dest / "bin" / "claude").resolve().read_text().endswith("echo 9.9.9\n")


def test_default_destination_is_found_by_the_finder(fake_npm, tmp_path):
    """Without --dest it installs under agentrl's cache, where find_cli_dir then looks."""
    assert find_cli_dir("codex") is None
    code, stderr = _install("--only", "codex")
    assert code == 0, stderr
    dest = tmp_path / "cache" / "clis"
    assert (dest / "codex-0.171.0" / ".installed").is_file()
    assert find_cli_dir("codex") == dest.resolve()
    assert find_cli_dir() == dest.resolve()


def test_missing_npm_is_one_line(isolated, tmp_path, monkeypatch):
    """No npm on PATH: exit 1 with one line saying to install Node.js with npm."""
    monkeypatch.setenv("PATH", str(isolated))
    code, stderr = _install("--dest", str(tmp_path / "clis"), "--only", "codex")
    assert code == 1
    assert stderr.strip().splitlines() == [
        "Error: npm is not on PATH, and @openai/codex@0.171.0 must be installed with it; "
        "install Node.js >= 20 with npm, then rerun agentrl install-clis"
    ]


def test_npm_failure_names_the_package_and_leaves_no_stamp(fake_npm, tmp_path, monkeypatch):
    """A failing npm install is reported with npm's output, once (not transient), unstamped."""
    monkeypatch.setenv("FAKE_NPM_FAIL", "npm error 404 Not Found - @openai/codex@0.171.0")
    dest = tmp_path / "clis"
    code, stderr = _install("--dest", str(dest), "--only", "codex")
    assert code == 1 and "Traceback" not in stderr
    assert "`npm install @openai/codex@0.171.0` failed (exit 1" in stderr
    assert "404 Not Found" in stderr
    assert len(fake_npm()) == 1
    assert not (dest / "codex-0.171.0" / ".installed").exists()
    assert not (dest / "bin" / "codex").exists()


def test_the_real_install_is_reused_without_touching_it(fake_npm):
    """The CLIs `make test` installed are recognised: no npm, under a second, links untouched."""
    missing = [
        c.link for c in install_clis.pinned_clis() if not (CLI_DIR / "bin" / c.link).exists()
    ]
    if missing:
        # Checked before the install runs: the stand-in npm must never write into a real install.
        pytest.fail(f"{missing} not installed in {CLI_DIR}; run agentrl install-clis")
    links = sorted((CLI_DIR / "bin").iterdir())
    before = [(p.name, os.readlink(p), p.lstat().st_mtime_ns) for p in links]
    started = time.monotonic()
    code, stderr = _install("--dest", str(CLI_DIR))
    assert code == 0 and time.monotonic() - started < 1.0, stderr
    assert fake_npm() == []
    assert stderr.count("already installed") == len(install_clis.PINS)
    assert [(p.name, os.readlink(p), p.lstat().st_mtime_ns) for p in links] == before


def test_candidates_include_the_user_cache(isolated, tmp_path):
    """With nothing in $AGENTRL_CLI_DIR or .cache/clis, ~/.cache/agentrl/clis is used."""
    dest = tmp_path / "cache" / "clis"
    (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "claude").write_text("#!/bin/sh\n")
    assert find_cli_dir("claude") == dest.resolve()
    local = pathlib.Path(".cache/clis/bin")
    local.mkdir(parents=True)
    (local / "claude").write_text("#!/bin/sh\n")
    assert find_cli_dir("claude") == local.parent.resolve()


def _npm_global(prefix: pathlib.Path, package: str, binary: str, entry: str, body: str):
    """A global npm install's layout: PREFIX/bin/X -> PREFIX/lib/node_modules/PKG/ENTRY."""
    home = prefix / "lib" / "node_modules" / package
    (home / entry).parent.mkdir(parents=True)
    (home / "package.json").write_text(json.dumps({"name": package, "bin": {binary: entry}}))
    (home / entry).write_text(textwrap.dedent(body))
    (home / entry).chmod(0o755)
    (prefix / "bin").mkdir(exist_ok=True)
    os.symlink(home / entry, prefix / "bin" / binary)
    return home


async def test_path_fallback_binds_the_real_claude_into_the_sandbox(isolated):
    """A `claude` on PATH resolves to its npm package, which the local sandbox binds and runs."""
    real = CLI_DIR / "bin" / "claude"
    if not real.exists():
        pytest.fail(f"the agent CLIs are not installed in {CLI_DIR}; run agentrl install-clis")
    os.symlink(real, isolated / "claude")
    package = find_cli_dir("claude")
    assert package is not None and (package / "package.json").is_file()
    assert json.loads((package / "package.json").read_text())["name"] == "@anthropic-ai/claude-code"
    binds, cli_path = ClaudeCodeHarness.host_install(package)
    assert binds == {str(package): str(package)} and cli_path == str(real.resolve())
    async with LocalSandbox(ro_binds=binds) as sandbox:
        target = await ClaudeCodeHarness(cli_path=cli_path, environ={}).install(sandbox)
    assert target == cli_path


def test_path_cli_of_another_version_warns_and_is_bound(isolated, tmp_path, caplog):
    """A Codex on PATH that is not the pinned version is used, with a warning naming both."""
    home = _npm_global(
        tmp_path / "prefix",
        "@openai/codex",
        "codex",
        "bin/codex.js",
        "#!/bin/sh\necho codex-cli 0.1.0\n",
    )
    os.symlink(tmp_path / "prefix" / "bin" / "codex", isolated / "codex")
    with caplog.at_level("WARNING", logger="agentrl.harnesses.install_clis"):
        found = find_cli_dir("codex")
    assert found == home.resolve()
    assert "version 0.1.0" in caplog.text and "0.171.0" in caplog.text
    binds, cli_path = CodexHarness.host_install(found)
    assert binds == {str(home): str(home)} and cli_path == str(home / "bin" / "codex.js")


def test_path_cli_that_cannot_run_or_be_bound_is_refused(isolated, tmp_path):
    """A PATH CLI whose --version fails, or that lives outside an npm package, is refused."""
    _npm_global(
        tmp_path / "prefix",
        "@openai/codex",
        "codex",
        "bin/codex.js",
        "#!/bin/sh\necho boom >&2\nexit 3\n",
    )
    os.symlink(tmp_path / "prefix" / "bin" / "codex", isolated / "codex")
    with pytest.raises(
        HarnessError, match=r"codex --version` failed \(exit 3: boom\).*agentrl install-clis"
    ):
        find_cli_dir("codex")
    loose = isolated / "claude"
    loose.write_text("#!/bin/sh\necho 2.1.332\n")
    loose.chmod(0o755)
    with pytest.raises(HarnessError, match="not inside an installed @anthropic-ai/claude-code"):
        find_cli_dir("claude")


def test_rollout_default_cli_dir_is_the_harness_cli_on_path(isolated, tmp_path):
    """`agentrl rollout --harness codex` with no install falls back to the codex on PATH."""
    from agentrl.cli.rollout import _default_cli_dir

    home = _npm_global(
        tmp_path / "prefix",
        "@openai/codex",
        "codex",
        "bin/codex.js",
        "#!/bin/sh\necho codex-cli 0.171.0\n",
    )
    os.symlink(tmp_path / "prefix" / "bin" / "codex", isolated / "codex")
    assert _default_cli_dir("codex") == str(home.resolve())
    assert _default_cli_dir("claude_code") is None  # no claude anywhere
    assert _default_cli_dir("no-such-harness") is None  # reported later, with the choices

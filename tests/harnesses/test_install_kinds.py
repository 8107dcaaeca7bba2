"""Install kinds beside npm: a pinned Python CLI (pip) and a CLI the image provides.

The Python kind is installed by the real ``agentrl install-clis`` code with the real pip,
offline, from a small wheel built here (``wheel_support``) (``PIP_NO_INDEX`` / ``PIP_FIND_LINKS``), then bound
into the real local sandbox like an npm install. The image kind is a plugin harness whose
agent is ``python3`` itself.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import ClassVar

import attrs
import pytest
from wheel_support import build_wheel

from agentrl import hookimpl, plugins
from agentrl.harnesses import install_clis
from agentrl.harnesses.base import Harness, HarnessContext
from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.install_clis import PinnedCli, find_cli_dir
from agentrl.harnesses.pip import launcher_script
from agentrl.plugins import PluginRegistry
from agentrl.sandboxes.local import LocalSandbox

TINY = PinnedCli(
    package="tinycli", version="1.0", binary="tiny", link="tiny", kind="python", module="tinycli"
)


@attrs.define(kw_only=True)
class TinyHarness(Harness):
    """A ``python`` harness for the tiny CLI (what a plugin's Python agent states)."""

    name: ClassVar[str] = "tiny"
    protocol: ClassVar[str] = "openai_chat"
    binary: ClassVar[str] = "tiny"
    install_kind: ClassVar[str] = "python"
    python_package: ClassVar[str] = "tinycli"
    python_module: ClassVar[str] = "tinycli"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {}

    def command(self, ctx: HarnessContext) -> list[str]:
        return []

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        return {}


@attrs.define(kw_only=True)
class ImagePythonHarness(TinyHarness):
    """An ``image`` harness: the agent is the image's own ``python3``."""

    name: ClassVar[str] = "image_python"
    binary: ClassVar[str] = "python3"
    install_kind: ClassVar[str] = "image"
    python_package: ClassVar[str] = ""
    python_module: ClassVar[str] = ""
    min_version: ClassVar[str | None] = "3.8"


@pytest.fixture
def offline_pip(tmp_path, monkeypatch):
    """pip sees no index, only a directory holding the tiny wheel."""
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "tinycli", "1.0", "tinycli")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


@pytest.fixture
def installed(offline_pip, tmp_path) -> pathlib.Path:
    dest = tmp_path / "clis"
    install_clis.install_clis(dest, [TINY])
    return dest


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)


def test_a_python_pin_is_installed_with_pip_into_a_self_contained_directory(installed, tmp_path):
    """pip --target puts the package under tiny-1.0/site; bin/tiny links (relatively, inside
    DEST) to a launcher that runs the module with the site first, leaking no PYTHONPATH and
    ignoring a same-named package in the working directory; --version names the version."""
    prefix = installed / "tiny-1.0"
    assert (prefix / "site" / "tinycli" / "__main__.py").is_file()
    assert (prefix / ".installed").is_file()
    assert os.readlink(installed / "bin" / "tiny") == "../tiny-1.0/bin/tiny"
    version = run([str(installed / "bin" / "tiny"), "--version"])
    assert version.returncode == 0 and version.stdout.strip() == "tiny 1.0", version
    cwd = tmp_path / "work"
    (cwd / "tinycli").mkdir(parents=True)
    (cwd / "tinycli" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run([str(installed / "bin" / "tiny"), "a b", "-c"], cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "argv ['a b', '-c']"
    assert lines[1] == "pythonpath "
    assert lines[2] == f"from {(prefix / 'site' / 'tinycli').resolve()}"


def test_a_second_run_reuses_the_python_install_without_pip(installed, monkeypatch):
    """With the install stamped, a rerun with no package source at all succeeds at once."""
    monkeypatch.setenv("PIP_FIND_LINKS", "/nonexistent")
    messages: list[str] = []
    links = install_clis.install_clis(installed, [TINY], report=messages.append)
    assert links == [installed / "bin" / "tiny"]
    assert messages == [f"tinycli==1.0 already installed in {installed / 'tiny-1.0'}"]


def test_a_missing_python_package_fails_naming_it_and_the_fix(offline_pip, tmp_path):
    """A pin pip cannot find: HarnessError naming the spec, pip's reason and the rerun."""
    missing = attrs.evolve(TINY, version="9.9")
    with pytest.raises(HarnessError) as caught:
        install_clis.install_clis(tmp_path / "clis", [missing], attempts=1)
    message = str(caught.value)
    assert "`pip install tinycli==9.9` failed" in message
    assert "No matching distribution" in message and "rerun agentrl install-clis" in message


def test_the_launcher_refuses_another_python_minor_version(installed):
    """A launcher made for Python 3.99 exits 1 naming both versions and how to fix it."""
    launcher = installed / "tiny-1.0" / "bin" / "tiny"
    launcher.write_text(
        launcher_script(
            binary="tiny", package="tinycli", version="1.0", module="tinycli", python=(3, 99)
        )
    )
    out = run([str(installed / "bin" / "tiny"), "--version"])
    assert out.returncode == 1
    here = ".".join(map(str, sys.version_info[:2]))
    assert "this install of tinycli==1.0 is for Python 3.99" in out.stderr
    assert f"is Python {here}" in out.stderr and "agentrl install-clis" in out.stderr


async def test_a_python_install_is_bound_into_the_local_sandbox_and_runs(installed):
    """host_install binds DEST read-only; the harness links the launcher, which runs there
    with the sandbox's own python3."""
    binds, cli_path = TinyHarness.host_install(installed)
    assert binds == {str(installed.resolve()): str(installed.resolve())}
    assert cli_path == str((installed / "tiny-1.0" / "bin" / "tiny").resolve())
    harness = TinyHarness(cli_path=cli_path, environ={})
    async with LocalSandbox(ro_binds=binds) as sandbox:
        assert await harness.install(sandbox) == cli_path
        result = await sandbox.exec(f"{harness.launcher} hello", user="root")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == "argv ['hello']"


async def test_an_image_cli_is_found_on_the_sandbox_path_and_its_version_checked():
    """python3 as the agent: found on the sandbox's PATH, at least 3.8; a minimum the image
    does not meet fails naming the harness, the binary, both versions and the fix."""
    async with LocalSandbox() as sandbox:
        target = await ImagePythonHarness(environ={}).install(sandbox)
        assert pathlib.Path(target).name.startswith("python3")

        too_new = type("TooNew", (ImagePythonHarness,), {"min_version": "99.1"})
        with pytest.raises(HarnessError) as caught:
            await attrs.define(too_new)(environ={}).install(sandbox)
    message = str(caught.value)
    assert message.startswith("image_python: the sandbox's python3 is version 3.")
    assert "older than the 99.1 the harness needs; use an image with a newer one" in message


def test_an_image_harness_needs_no_host_install():
    """No install directory is looked for (not even python3 on PATH, which is no npm package),
    and binding one is refused with the reason."""
    assert find_cli_dir("python3", "image") is None
    with pytest.raises(HarnessError, match="comes from the sandbox's image"):
        ImagePythonHarness.host_install("/usr")


def test_harness_classes_must_state_what_their_kind_needs():
    """An unknown kind, a python kind without its module, and npm tarballs for a Python CLI
    are refused when the harness is built, each naming the harness and the attribute."""
    bad_kind = attrs.define(type("BadKind", (TinyHarness,), {"install_kind": "conda"}))
    with pytest.raises(HarnessError, match="install_kind 'conda' is not one of npm, python"):
        bad_kind(environ={})
    no_module = attrs.define(type("NoModule", (TinyHarness,), {"python_module": ""}))
    with pytest.raises(HarnessError, match=r"tiny: install_kind 'python' needs .*python_module"):
        no_module(environ={})
    with pytest.raises(HarnessError, match=r"tarballs= .* are npm tarballs"):
        TinyHarness(tarballs=(__file__,), environ={})


@pytest.fixture
def image_plugin(monkeypatch, tmp_path):
    """The image harness registered as a plugin; no CLI install anywhere agentrl looks."""
    monkeypatch.delenv("AGENTRL_CLI_DIR", raising=False)
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(install_clis, "_checkout_cli_dir", lambda: None)
    monkeypatch.chdir(tmp_path)
    registry = PluginRegistry(load_entrypoints=False, disabled=())

    class Plugin:
        @hookimpl
        def register_harnesses(self, register):
            register(ImagePythonHarness)

    registry.pm.register(Plugin(), name="image-python-plugin")
    previous = plugins.reset_registry(registry)
    yield
    plugins.reset_registry(previous)


def test_rollout_needs_no_cli_dir_for_an_image_harness(image_plugin):
    """`agentrl rollout --harness image_python` (python3 on PATH is in no npm package) looks
    for no install, with or without cli_path in --harness-options."""
    from agentrl.cli.rollout import _default_cli_dir

    assert _default_cli_dir("image_python") is None
    assert _default_cli_dir("image_python", '{"cli_path": "/usr/bin/python3"}') is None
    assert _default_cli_dir("tiny_missing", '{"cli_path": "/x"}') is None

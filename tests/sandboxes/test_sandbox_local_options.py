"""``LocalOptions`` and the ``local`` sandbox's keyword API, and bubblewrap's command line."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

from agentrl.plugin_options import OptionsError
from agentrl.sandboxes.local import LocalOptions, LocalSandbox, host_python_options
from agentrl.sandboxes.local.bwrap import Mounts, sandbox_args

#: The keywords ``LocalSandbox`` has always taken: ``--sandbox-options`` keys are user API.
_KEYWORDS = {
    "image",
    "repo",
    "workdir",
    "services",
    "env",
    "memory_mb",
    "pids",
    "tmp_size_mb",
    "home_size_mb",
    "agent_uid",
    "overlay",
    "workspace_size_mb",
    "output_size_mb",
    "shm_size_mb",
    "host_uid",
    "ro_binds",
    "max_output_bytes",
    "startup_timeout",
    "bwrap",
    "state_dir",
    "host_python",
}


def test_the_keywords_and_option_names_are_unchanged():
    """Every keyword is an option, less the three ``from_task`` fills from the task."""
    assert LocalOptions.names() == _KEYWORDS
    assert LocalSandbox.option_names() == _KEYWORDS - {"image", "repo", "workdir"}
    LocalSandbox.check_options({"memory_mb": 512, "env": {}, "host_python": True})
    with pytest.raises(OptionsError, match="no option 'memroy_mb' \\(did you mean 'memory_mb'"):
        LocalSandbox.check_options({"memroy_mb": 512})


def test_an_unknown_keyword_is_the_type_error_python_gives():
    """An unknown or positional argument fails as it did with the explicit constructor."""
    with pytest.raises(
        TypeError,
        match=r"^LocalSandbox.__init__\(\) got an unexpected keyword argument 'memroy_mb'$",
    ):
        LocalSandbox(memory_mb=1, memroy_mb=1)
    with pytest.raises(TypeError, match="positional"):
        LocalSandbox("/images/root")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"overlay": "maybe"}, "overlay must be 'auto', 'never' or 'require', got 'maybe'"),
        ({"workdir": "workspace"}, "workdir must be an absolute path of its own, got 'workspace'"),
        ({"workdir": "/tmp/"}, "workdir must be an absolute path of its own, got '/tmp/'"),
        ({"workdir": "/"}, "workdir must be an absolute path of its own, got '/'"),
        ({"workdir": "/.agentrl"}, "workdir must be an absolute path of its own, got '/.agentrl'"),
    ],
)
def test_invalid_values_raise_value_error(keywords, message):
    """A bad ``overlay`` or ``workdir`` is a ValueError quoting the value as given."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        LocalSandbox(**keywords)


def test_values_are_normalised(tmp_path):
    """Trailing slashes, service ports and paths are normalised; the defaults are kept."""
    sandbox = LocalSandbox(
        workdir="/work//", services={"8000": str(tmp_path / "mw.sock")}, state_dir=str(tmp_path)
    )
    assert sandbox.workdir == "/work"
    assert sandbox.services == {8000: tmp_path / "mw.sock"}
    assert sandbox.options.state_dir == tmp_path
    assert (sandbox.options.memory_mb, sandbox.options.pids, sandbox.agent_uid) == (
        4096,
        1024,
        1000,
    )
    assert LocalOptions().state_dir is None and LocalOptions().overlay == "auto"


def test_host_python_adds_binds_that_explicit_ones_override():
    """host_python adds this interpreter's binds and env, explicit ones win, an image skips it."""
    python = host_python_options()
    env_key = next(iter(python["env"]))
    options = LocalOptions(host_python=True, env={env_key: "mine"}, ro_binds={"/x": "/y"})
    env, binds = options.sandbox_env_and_binds()
    assert env == {**python["env"], env_key: "mine"}
    assert binds == {**python["ro_binds"], "/x": "/y"}
    with_image = LocalOptions(host_python=True, image="/images/root", env={"A": "1"})
    assert with_image.sandbox_env_and_binds() == ({"A": "1"}, {})


def test_bwrap_command_line_binds_what_the_options_name(tmp_path):
    """The command line drops capabilities, binds the workspace, extra binds and services,
    sizes the tmpfs mounts and ends read-only in ``init.sh``."""
    for name in ("masked", "passwd", "group"):
        (tmp_path / name).write_text("")
    mounts = Mounts(
        state=tmp_path,
        image_root=None,
        masked=tmp_path / "masked",
        passwd=tmp_path / "passwd",
        group=tmp_path / "group",
        workspace=tmp_path / "workspace",
    )
    options = LocalOptions(
        workdir="/src", services={8000: "/run/mw.sock"}, tmp_size_mb=2, bwrap="/opt/bwrap"
    )
    args = sandbox_args(options, mounts, {"/models": "/data/models"}, info_fd=9)
    joined = " ".join(args)
    assert args[0] == "/opt/bwrap" and mounts.workspace_mode == "copy"
    assert "--unshare-all" in args and "--cap-drop ALL" in joined and "--info-fd 9" in joined
    assert f"--bind {tmp_path / 'workspace'} /src" in joined
    assert "--ro-bind /data/models /models" in joined
    assert "--bind /run/mw.sock /.agentrl/services/8000.sock" in joined
    assert f"--size {2 * 1024 * 1024} --tmpfs /tmp" in joined
    assert "--dev /dev --remount-ro /dev" in joined and "--tmpfs /dev/shm" in joined
    assert "--setenv AGENTRL_SERVICE_PORTS 8000" in joined
    assert args[-6:] == ["--remount-ro", "/", "--chdir", "/", "sh", "/.agentrl/bin/init.sh"]
    assert isinstance(mounts.state, pathlib.Path)


def test_host_python_through_a_linked_venv_directory_is_on_path(tmp_path):
    """A venv reached through a linked directory (``work/.venv -> real/.venv``): PATH names
    the real bin directory, the one bound into the sandbox, so ``python`` is found there."""
    real_bin = tmp_path / "real" / ".venv" / "bin"
    real_bin.mkdir(parents=True)
    (real_bin / "python").symlink_to(sys.executable)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / ".venv").symlink_to(tmp_path / "real" / ".venv")
    options = host_python_options(str(tmp_path / "work" / ".venv" / "bin" / "python"))
    assert options["env"]["PATH"].split(":")[0] == str(real_bin.resolve())

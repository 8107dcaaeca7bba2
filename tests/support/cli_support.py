"""The installed agent CLIs, run by hand on the host: where they are and a repo to run them in.

``installed_cli(binary)`` is ``bin/<binary>`` of the suite's install directory
(``AGENTRL_CLI_DIR``, else ``.cache/clis``, see :data:`rollout_support.CLI_DIR`); a missing
one fails the test with the command that installs it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from rollout_support import CLI_DIR


def installed_cli(binary: str) -> Path:
    """The executable ``bin/<binary>`` of the install directory; fails the test when missing."""
    path = CLI_DIR / "bin" / binary
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{binary} CLI not found at {path}; install the pinned CLIs with "
            "`agentrl install-clis --dest .cache/clis` (needs npm and access to the npm registry)"
        )
    return path


def git_repo(root: Path) -> Path:
    """A fresh git repository with one empty commit at ``root/repo`` (the CLIs want one)."""
    repo = root / "repo"
    repo.mkdir()
    for args in (
        ["init", "-q"],
        ["-c", "user.email=a@b", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "0"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def host_install_of(harness_cls) -> tuple[dict[str, str], str]:
    """``harness_cls.host_install`` of the install directory: the read-only binds and the
    ``cli_path`` a sandbox runs; fails the test when the CLI is not installed there."""
    installed_cli(harness_cls.binary)
    return harness_cls.host_install(CLI_DIR)

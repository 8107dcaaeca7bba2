"""The suite's Docker daemon: one per test session, started by ``scripts/dockerd.sh``.

``dockerd_host`` is the daemon's ``unix://`` address: ``AGENTRL_DOCKER_HOST`` when CI
started one (``.ci/run``), else a private daemon under a short temporary directory,
stopped at the end of the session. Where it cannot start, the tests that need it are
skipped with the reason, except under ``CI=true``, where they fail. ``docker_base_image``
is the offline-built base image (``scripts/docker-base-image.sh``, cached in
``.cache/docker``).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the Docker tests must run in CI: {reason}")
    print(f"\nskipping the Docker tests: {reason}")
    pytest.skip(reason)


def _reachable(host: str) -> bool:
    env = {**os.environ, "DOCKER_HOST": host}
    return (
        subprocess.run(["docker", "version"], env=env, capture_output=True, check=False).returncode
        == 0
    )


@pytest.fixture(scope="session")
def dockerd_host():
    """A running Docker daemon's address (``unix://…``) for the whole session."""
    given = os.environ.get("AGENTRL_DOCKER_HOST")
    if given and shutil.which("docker") and _reachable(given):
        yield given
        return
    if not shutil.which("dockerd") or not shutil.which("docker"):
        _unavailable("dockerd is not installed (apt: docker.io)")
    if os.geteuid() != 0:
        _unavailable("dockerd needs root here")
    workdir = tempfile.mkdtemp(prefix="adk-", dir="/tmp")
    started = subprocess.run(
        [str(SCRIPTS / "dockerd.sh"), "start", workdir], capture_output=True, text=True, check=False
    )
    if started.returncode != 0:
        shutil.rmtree(workdir, ignore_errors=True)
        _unavailable(f"dockerd did not start: {started.stderr.strip()[-500:]}")
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run([str(SCRIPTS / "dockerd.sh"), "stop", workdir], check=False)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_base_image(dockerd_host) -> str:
    """``agentrl-base:KEY``: Debian minbase with python3 and git, imported into the daemon."""
    built = subprocess.run(
        [str(SCRIPTS / "docker-base-image.sh"), str(ROOT / ".cache" / "docker")],
        env={**os.environ, "DOCKER_HOST": dockerd_host},
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        _unavailable(f"the base image did not build: {built.stderr.strip()[-500:]}")
    return built.stdout.strip()


@pytest.fixture
def docker_options(dockerd_host, docker_base_image, tmp_path) -> dict:
    """``docker`` sandbox options for the session's daemon, with the base image as default."""
    return {
        "docker_host": dockerd_host,
        "default_image": docker_base_image,
        "run_id": f"test-{tmp_path.name}"[:60],
    }

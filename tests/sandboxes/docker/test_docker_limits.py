"""The ``docker`` sandbox's limits on a real daemon: the workspace's size, and the process
group of an exec (a fork bomb held by the ``pids`` limit must die with its exec)."""

from __future__ import annotations

import os
import subprocess

import pytest

from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT, EXIT_TIME_BUDGET_EXCEEDED
from agentrl.sandboxes.docker import DockerSandbox
from agentrl.sandboxes.docker.container import create_config
from agentrl.sandboxes.docker.options import DockerOptions
from agentrl.sandboxes.exec import exec_and_wait

pytestmark = pytest.mark.slow

#: A bash fork bomb: every call forks two more, in the background, forever.
FORK_BOMB = "bomb() { bomb | bomb & }; bomb"
#: The processes of the container, counted from /proc (the image has no ps).
COUNT = "n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n"


def _docker(host: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["docker", *args],
        env={**os.environ, "DOCKER_HOST": host},
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.fixture
def workspace_image(dockerd_host, docker_base_image, tmp_path):
    """An image built here from the base image that ships ``/workspace``: a file and a git
    repository with one commit (removed again at the end)."""
    tag = f"agentrl-test/workspace-{os.getpid()}-{tmp_path.name.lower()}"[:120] + ":1"
    dockerfile = (
        f"FROM {docker_base_image}\n"
        "RUN mkdir -p /workspace && cd /workspace && echo shipped > shipped.txt && "
        "git init -q && git add . && "
        "git -c user.email=t@t -c user.name=t commit -qm shipped\n"
    )
    context = tmp_path / "image"
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    _docker(dockerd_host, "build", "-q", "-t", tag, str(context))
    try:
        yield tag
    finally:
        _docker(dockerd_host, "rmi", "-f", tag)


def test_the_workspace_limit_setting_makes_the_workspace_a_sized_tmpfs(monkeypatch):
    """``AGENTRL_DOCKER_WORKSPACE_MB=256`` with no option: the container's workspace is a
    256 MiB tmpfs that can run programs, not an (unlimited) volume; the option wins."""
    monkeypatch.setenv("AGENTRL_DOCKER_WORKSPACE_MB", "256")
    config = create_config(DockerOptions(), "image:1", {})
    mount = config["HostConfig"]["Tmpfs"]["/workspace"]
    assert "size=256m" in mount.split(",") and "exec" in mount.split(",")
    assert config["Volumes"] == {}
    explicit = create_config(DockerOptions(workspace_size_mb=32), "image:1", {})
    assert "size=32m" in explicit["HostConfig"]["Tmpfs"]["/workspace"]


def test_the_workspace_is_limited_by_default_and_0_keeps_the_volume(monkeypatch):
    """With neither the option nor the setting, the workspace is a 2048 MiB tmpfs (a 1 GiB
    write no longer succeeds without bound); ``workspace_size_mb=0`` or the setting ``0``
    keeps the unlimited volume."""
    monkeypatch.delenv("AGENTRL_DOCKER_WORKSPACE_MB", raising=False)
    mount = create_config(DockerOptions(), "image:1", {})["HostConfig"]["Tmpfs"]["/workspace"]
    assert "size=2048m" in mount.split(",")
    unlimited = create_config(DockerOptions(workspace_size_mb=0), "image:1", {})
    assert "/workspace" not in unlimited["HostConfig"].get("Tmpfs", {})
    monkeypatch.setenv("AGENTRL_DOCKER_WORKSPACE_MB", "0")
    from_setting = create_config(DockerOptions(), "image:1", {})
    assert "/workspace" not in from_setting["HostConfig"].get("Tmpfs", {})


async def test_a_write_past_the_workspace_limit_fails_and_the_sandbox_stays_usable(
    docker_options, workspace_image, tmp_path
):
    """``workspace_size_mb=64``: the image's shipped workspace (a file, a git repository) and
    the task's repository are there, the agent's; writing 100 MiB fails with ENOSPC inside
    the sandbox; after removing it, files are written and git commits as before."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "task.py").write_text("print('task')\n")
    options = {**docker_options, "workspace_size_mb": 64}
    async with DockerSandbox(image=workspace_image, repo=str(repo), **options) as sandbox:
        seen = await sandbox.exec(
            "cat shipped.txt task.py && git log --format=%s && stat -c %U . shipped.txt",
            user="agent",
        )
        assert seen.stdout.split() == ["shipped", "print('task')", "shipped", "agent", "agent"]
        full = await sandbox.exec(
            "head -c 100M /dev/zero > big", user="agent", check=False, timeout=60
        )
        assert full.exit_code != 0
        assert "No space left on device" in full.stderr
        after = await sandbox.exec(
            "rm big && python3 task.py > out.txt && git add -A && "
            "git -c user.email=t@t -c user.name=t commit -qm agent && git log --format=%s",
            user="agent",
        )
        assert after.stdout.split() == ["agent", "shipped"]


async def test_a_fork_bomb_dies_with_its_timed_out_exec_and_the_next_exec_runs(docker_options):
    """A fork bomb under ``pids=64`` (no new process can start in the container, not even
    a kill exec) times out after 3 s: its whole process group is killed, the next exec
    runs and the container holds as many processes as before the bomb."""
    async with DockerSandbox(pids=64, **docker_options) as sandbox:
        before = int((await sandbox.exec(COUNT)).stdout)
        bombed = await sandbox.exec(f"{FORK_BOMB}; sleep 600", timeout=3, check=False)
        assert bombed.exit_code == EXIT_EXEC_TIMEOUT
        after = await sandbox.exec(COUNT, timeout=30)
        assert int(after.stdout) == before


async def test_what_an_exec_leaves_in_its_group_dies_when_it_ends(docker_options):
    """An exec that starts a fork bomb (or a sleeper) in the background and returns: its
    exit code comes back at once, nothing of its group survives it, and the next exec runs
    (also through ``exec_and_wait``, whose time budget kills a bomb the same way)."""
    async with DockerSandbox(pids=64, **docker_options) as sandbox:
        before = int((await sandbox.exec(COUNT)).stdout)
        left = await sandbox.exec("sleep 600 > /dev/null 2>&1 & echo started", timeout=30)
        assert left.stdout == "started\n"
        assert int((await sandbox.exec(COUNT)).stdout) == before
        bombed = await sandbox.exec(FORK_BOMB, timeout=30, check=False)
        assert bombed.exit_code == 0
        assert int((await sandbox.exec(COUNT, timeout=30)).stdout) == before
        waited = await exec_and_wait(sandbox, f"{FORK_BOMB}; sleep 600", time_budget=3)
        assert waited.exit_code == EXIT_TIME_BUDGET_EXCEEDED
        assert int((await sandbox.exec(COUNT, timeout=30)).stdout) == before

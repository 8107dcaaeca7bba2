"""The ``docker`` sandbox against a real dockerd: isolation, limits, images, and cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from aiohttp import web

from agentrl.plugins import get_sandbox
from agentrl.retry import RetryPolicy
from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.boot import Booter, BootError
from agentrl.sandboxes.docker import DockerSandbox, MissingImageError
from agentrl.sandboxes.docker.labels import RUN_KEY
from agentrl.types import Task

pytestmark = pytest.mark.slow


async def _containers(host: str, run_id: str) -> list[str]:
    import aiodocker

    docker = aiodocker.Docker(url=host)
    try:
        found = await docker.containers.list(
            all="1", filters=json.dumps({"label": [f"{RUN_KEY}={run_id}"]})
        )
        return [c.id for c in found]
    finally:
        await docker.close()


def test_docker_is_a_registered_built_in_sandbox():
    """``--sandbox docker`` finds the built-in class."""
    assert get_sandbox("docker") is DockerSandbox


async def test_no_network_and_no_host_files(docker_options, tmp_path):
    """The container has only a loopback interface, reaches no address, and sees no host file."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("secret")
    async with DockerSandbox(**docker_options) as box:
        links = await box.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
        assert links.stdout.split() == ["lo"]
        reach = await box.exec(
            "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 3)\"",
            timeout=20,
        )
        assert reach.exit_code != 0 and "unreachable" in reach.stderr.lower()
        assert (await box.exec(f"test -e {secret}")).exit_code != 0
        assert (await box.exec("touch /usr/x", user="root")).exit_code != 0  # read-only root


async def test_limits_are_enforced(docker_options):
    """The pids limit stops a fork bomb's growth; the memory limit kills a hog, not the host."""
    async with DockerSandbox(**{**docker_options, "pids": 64, "memory_mb": 64}) as box:
        forks = await box.exec(
            "python3 -c 'import os, time\n"
            "n = 0\n"
            "for i in range(200):\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        break\n"
            "    if pid == 0:\n"
            "        time.sleep(3)\n"
            "        os._exit(0)\n"
            "    n += 1\n"
            "print(n)'",
            timeout=30,
        )
        assert 0 < int(forks.stdout) < 64, forks
        await asyncio.sleep(3.5)
        hog = await box.exec(
            "python3 -c \"b = bytearray(256 << 20); print('survived')\"", timeout=60
        )
        assert hog.exit_code != 0 and "survived" not in hog.stdout
        assert (await box.exec("echo alive")).stdout == "alive\n"


async def test_middleware_is_reached_through_the_socket_directory(docker_options, tmp_path):
    """A host service on a unix socket answers at 127.0.0.1:PORT inside, also after the server
    recreates its socket file (the directory, not the file, is bound)."""

    async def hello(request):
        return web.json_response({"path": request.path})

    sock = tmp_path / "svc" / "mw.sock"
    sock.parent.mkdir()
    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.UnixSite(runner, str(sock))
    await site.start()
    try:
        async with DockerSandbox(**docker_options, services={8931: str(sock)}) as box:
            url = box.url_for("127.0.0.1", 8931)
            get = f"python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}/ping').read().decode())\""
            first = await box.exec(get, user="agent")
            assert json.loads(first.stdout) == {"path": "/ping"}, first
            await site.stop()
            sock.unlink(missing_ok=True)
            site = web.UnixSite(runner, str(sock))
            await site.start()
            again = await box.exec(get, user="agent")
            assert json.loads(again.stdout) == {"path": "/ping"}, again
    finally:
        await runner.cleanup()


async def test_missing_image_is_a_clear_error_naming_it(docker_options):
    """A task whose image is not on the daemon fails fast with the image's name, never a pull."""
    task = Task(instance_id="t", problem_statement="", image="agentrl-test/absent:1")
    booter = Booter(policy=RetryPolicy(attempts=1), timeout=30)
    started = asyncio.get_running_loop().time()
    with pytest.raises(BootError) as info:
        await booter.boot(lambda t: DockerSandbox.from_task(t, **docker_options), task)
    assert isinstance(info.value.last, MissingImageError)
    assert "agentrl-test/absent:1" in str(info.value)
    assert asyncio.get_running_loop().time() - started < 10
    report = await DockerSandbox.image_report([task], **docker_options)
    problem = report.problem_of("t")
    assert problem is not None and "agentrl-test/absent:1" in problem


async def test_nothing_is_left_after_close_or_the_run_sweep(docker_options, dockerd_host):
    """``aclose`` removes the container; ``sweep`` removes a run's containers still there."""
    run_id = docker_options["run_id"]
    async with DockerSandbox(**docker_options) as box:
        assert await _containers(dockerd_host, run_id) == [box.container_id]
    assert await _containers(dockerd_host, run_id) == []
    leaked = DockerSandbox(**docker_options)
    await leaked.start()
    leaked._closed = True  # as if its owner lost it: no close will come
    removed = await DockerSandbox.sweep(docker_host=dockerd_host, run_id=run_id)
    assert removed == [leaked.container_id]
    assert await _containers(dockerd_host, run_id) == []
    await leaked._docker.close()


_OWNER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from agentrl.sandboxes.docker import DockerSandbox
    options = json.loads(sys.argv[1])
    async def main():
        box = DockerSandbox(**options)
        await box.start()
        print(box.container_id, flush=True)
        if sys.argv[2] == "hold":
            await asyncio.sleep(600)
        await box.aclose()
    asyncio.run(main())
    """
)


def _owner(options: dict, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _OWNER, json.dumps(options), mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


async def test_a_killed_owners_containers_are_swept_at_the_next_start(docker_options, dockerd_host):
    """SIGKILL the process holding a container: the next process's first start removes it."""
    run_id = docker_options["run_id"]
    owner = _owner(docker_options, "hold")
    container = await asyncio.to_thread(owner.stdout.readline)
    assert container.strip() in await _containers(dockerd_host, run_id)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    later = _owner({**docker_options, "run_id": run_id + "-b"}, "close")
    assert (await asyncio.to_thread(later.communicate, None, 120))[0].strip()
    assert await _containers(dockerd_host, run_id) == []


async def test_a_missing_service_socket_is_refused_before_any_container(docker_options, tmp_path):
    """A service socket that does not exist is a SandboxError before the daemon is asked."""
    box = DockerSandbox(**docker_options, services={1: str(tmp_path / "nope.sock")})
    with pytest.raises(SandboxError, match="does not exist"):
        await box.start()


async def test_an_image_that_cannot_relay_the_services_fails_its_start_at_once(
    docker_options, dockerd_host, docker_base_image, tmp_path
):
    """An image with neither python3 nor socat cannot reach the middleware: the start fails
    within seconds, saying why, instead of waiting out the startup timeout."""
    image = "agentrl-test/no-relay:1"
    dockerfile = (
        f"FROM {docker_base_image}\n"
        "RUN rm -f /usr/bin/python3* /usr/bin/python /usr/local/bin/python3* /usr/bin/socat\n"
    )
    await asyncio.to_thread(
        subprocess.run,
        ["docker", "build", "--network", "none", "-q", "-t", image, "-"],
        input=dockerfile,
        env={**os.environ, "DOCKER_HOST": dockerd_host, "DOCKER_BUILDKIT": "0"},
        check=True,
        capture_output=True,
        text=True,
    )
    sock = tmp_path / "svc.sock"
    sock.touch()
    box = DockerSandbox(**docker_options, image=image, services={8000: str(sock)})
    started = asyncio.get_running_loop().time()
    with pytest.raises(SandboxError, match="neither python3 nor socat"):
        await box.start()
    assert asyncio.get_running_loop().time() - started < 20

"""The ``docker`` sandbox's parts that need no daemon: options, the container's config,
output capping, the agent's account files, the labels' stale check."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from agentrl.sandboxes.base import SandboxError, cap_output
from agentrl.sandboxes.docker import DockerOptions, DockerSandbox
from agentrl.sandboxes.docker.container import SERVICES_DIR, create_config
from agentrl.sandboxes.docker.execs import Capped, _Collector
from agentrl.sandboxes.docker.labels import container_labels, process_label, stale
from agentrl.sandboxes.docker.users import with_agent
from agentrl.types import Task


def test_a_task_without_an_image_runs_the_default_and_one_with_never_does():
    """``default_image`` serves image-less tasks only; grader candidates come before ``image``."""
    assert DockerOptions(default_image="base:1").candidates() == ("base:1",)
    named = DockerOptions(image="row:1", images=("sweb.eval.x:latest",), default_image="base:1")
    assert named.candidates() == ("sweb.eval.x:latest", "row:1")


def test_from_task_takes_the_graders_candidates_from_the_task():
    """``metadata.docker_images`` (the swebench grader's instance image) reaches the options."""
    task = Task(
        instance_id="t",
        problem_statement="",
        image="hub/row:1",
        workdir="/testbed",
        metadata={"docker_images": ["sweb.eval.x86_64.t:latest"]},
    )
    box = DockerSandbox.from_task(task, docker_host="unix:///nowhere.sock")
    assert box.options.candidates() == ("sweb.eval.x86_64.t:latest", "hub/row:1")
    assert box.workdir == "/testbed"


def test_unknown_options_and_bad_values_are_refused():
    """A misspelt option is a TypeError naming it; a non-positive limit a ValueError."""
    with pytest.raises(TypeError, match="memroy_mb"):
        DockerSandbox(memroy_mb=1)
    with pytest.raises(ValueError, match="pids"):
        DockerOptions(pids=0)
    with pytest.raises(ValueError, match="workdir"):
        DockerOptions(workdir="/tmp")


def test_the_container_has_no_network_limits_init_and_a_read_only_root(tmp_path):
    """The create body: network none, init, limits, read-only root, the socket's directory."""
    sock = tmp_path / "mw" / "mw.sock"
    options = DockerOptions(
        services={8000: str(sock)}, memory_mb=512, pids=100, cpus=1.5, ro_binds={"/opt/x": "/x"}
    )
    config = create_config(options, "img:1", {"agentrl.run": "r"}, {"/h/passwd": "/etc/passwd"})
    host = config["HostConfig"]
    assert host["NetworkMode"] == "none" and config["NetworkDisabled"] is True
    assert host["Init"] is True and host["ReadonlyRootfs"] is True
    assert host["Memory"] == host["MemorySwap"] == 512 << 20
    assert host["PidsLimit"] == 100 and host["NanoCpus"] == 1_500_000_000
    assert f"{sock.parent}:{SERVICES_DIR}/8000:ro" in host["Binds"]
    assert "/opt/x:/x:ro" in host["Binds"] and "/h/passwd:/etc/passwd:ro" in host["Binds"]
    assert "ALL" in host["CapDrop"] and "SYS_ADMIN" not in host["CapAdd"]
    assert config["Labels"] == {"agentrl.run": "r"}
    # The workspace is a tmpfs of at most half the memory limit, not an unlimited volume.
    assert config["Volumes"] == {} and "size=256m" in host["Tmpfs"]["/workspace"].split(",")


@pytest.mark.parametrize("size", [0, 10, 64, 65, 1000, 5000])
def test_capped_streams_keep_what_cap_output_keeps(size):
    """Fed in odd-sized pieces, ``Capped`` returns exactly what ``cap_output`` would."""
    data = bytes((i * 7) % 251 for i in range(size))
    capped = Capped(64)
    for start in range(0, size, 13):
        capped.feed(data[start : start + 13])
    assert capped.text() == cap_output(data, 64)
    assert capped.total == size and len(capped.head) <= 64 and len(capped.tail) <= 32


def test_the_process_group_line_is_split_off_stdout():
    """The wrapper's first stdout line (the group id) is not part of the command's output."""
    collector = _Collector(1 << 10)
    for piece in (b"4", b"2\nhel", b"lo\n"):
        collector.feed(SimpleNamespace(stream=1, data=piece))
    collector.feed(SimpleNamespace(stream=2, data=b"err"))
    assert collector.pgid == 42
    assert collector.stdout.text() == "hello\n" and collector.stderr.text() == "err"


def test_the_agent_replaces_any_agent_entry_of_the_image():
    """The account files keep the image's users and have exactly one ``agent``."""
    passwd = "root:x:0:0::/root:/bin/sh\nagent:x:5:5::/nope:/bin/false\n"
    out = with_agent("passwd", passwd, 1000, "/home/agent")
    assert out.splitlines() == [
        "root:x:0:0::/root:/bin/sh",
        "agent:x:1000:1000:agent:/home/agent:/bin/sh",
    ]
    assert with_agent("group", "", 1000, "/home/agent") == "agent:x:1000:\n"


def test_only_a_dead_processs_containers_of_this_owner_are_stale():
    """Live owners, other deployments and unlabelled containers are never swept."""
    live = container_labels("run", None)
    assert not stale(live, None)
    host = socket.gethostname()
    dead = {**live, "agentrl.process": f"{host}:999999999:1"}
    assert stale(dead, None)
    assert not stale({**dead, "agentrl.owner": "elsewhere"}, None)
    assert not stale({"agentrl.process": dead["agentrl.process"]}, None)
    assert process_label().startswith(f"{host}:")


def test_a_task_without_any_image_is_refused_before_the_first_rollout(monkeypatch):
    """No image in the row and no default: one clear error up front, not one per rollout."""
    monkeypatch.delenv("AGENTRL_DOCKER_BASE_IMAGE", raising=False)
    task = Task(instance_id="t", problem_statement="")
    with pytest.raises(SandboxError, match="default_image"):
        DockerSandbox.check_task(task)
    DockerSandbox.check_task(task, default_image="base:1")

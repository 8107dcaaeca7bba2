"""A Ray node dies mid-rollout with ``docker`` sandboxes: the driver removes its containers.

A real two-node Ray cluster on this machine (``LocalRayCluster``: a head and ``node2``),
the real Docker daemon of the suite (both nodes use it, as two hosts sharing one daemon
would), the real Claude Code CLI bound into the containers, and the scripted SGLang engine
in this process as the policy. The driver is the real ``agentrl rollout --ray`` command.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
from ray_support import SessionScript, rows, start, start_local_cluster
from rollout_support import CLI_DIR, example_task_file

from agentrl.sandboxes.docker import DockerSandbox
from agentrl.sandboxes.docker.labels import process_label

pytestmark = pytest.mark.slow

#: Seconds every first dispatch waits for its first reply: long enough that node2 dies
#: while both rollouts are in flight and the head's container is still there after.
HOLD = 20.0


def _containers(host: str, owner: str) -> dict[str, int]:
    """This test's containers on the daemon: id -> pid of the process that created it."""
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=agentrl.owner={owner}",
            "--format",
            '{{.ID}} {{.Label "agentrl.process"}}',
        ],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    found = {}
    for line in filter(None, listed):
        cid, process = line.split(" ", 1)
        found[cid] = int(process.split(":")[1])
    return found


def _remove(host: str, ids: list[str]) -> None:
    if ids:
        subprocess.run(
            ["docker", "rm", "-f", *ids],
            env={**os.environ, "DOCKER_HOST": host},
            capture_output=True,
            check=False,
        )


@pytest.fixture
def ray_cluster():
    """A head and ``node2`` on this machine, stopped (by their process groups) after."""
    cluster = start_local_cluster("node2")
    try:
        yield cluster
    finally:
        cluster.stop()


async def _until(predicate, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} within {timeout:g}s")
        await asyncio.sleep(0.2)


async def test_a_dead_nodes_containers_are_removed_and_its_rollout_counted_rescheduled(
    ray_cluster, dockerd_host, docker_base_image, scripted_engine, qwen_tokenizer_dir, tmp_path
):
    """Two rollouts, one on each node, both in their first turn (held): node2 is SIGKILLed.
    The driver removes node2's container by its labels while the head's (same host, same
    daemon, alive) stays; node2's rollout runs again on the head; both are solved, node2's
    row says where it was lost, the summary counts one rescheduled rollout (summary.json
    and the table), and no container of the run is left."""
    script = scripted_engine.responder = SessionScript(lambda index, first: HOLD if first else 0)
    owner = f"test-node-death-{uuid.uuid4().hex[:12]}"
    options = {"docker_host": dockerd_host, "default_image": docker_base_image, "owner": owner}
    out = tmp_path / "out"
    args = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "rollout",
        str(example_task_file(tmp_path)),
        "--sandbox",
        "docker",
        "--sandbox-options",
        json.dumps(options),
        "--engine-url",
        scripted_engine.url,
        "--tokenizer",
        str(qwen_tokenizer_dir),
        "--cli-dir",
        str(CLI_DIR),
        "--out",
        str(out),
        "-n",
        "2",
        "--ray",
        ray_cluster.address,
        "--concurrency-per-node",
        "2",
    ]
    names = ray_cluster.node_ids()
    proc = await start(args, tmp_path)
    try:
        await scripted_engine.wait_for(lambda: len(script.sessions) >= 2, 180)
        (node2_actor,) = ray_cluster.actor_pids("node2")
        (head_actor,) = ray_cluster.actor_pids("head")
        before = _containers(dockerd_host, owner)
        assert sorted(before.values()) == sorted([head_actor, node2_actor]), before
        ray_cluster.kill_node("node2")
        lost = [cid for cid, pid in before.items() if pid == node2_actor]
        await _until(
            lambda: not set(lost) & set(_containers(dockerd_host, owner)),
            HOLD / 2,
            "node2's container was not removed",
        )
        kept = [cid for cid, pid in before.items() if pid == head_actor]
        assert set(kept) <= set(_containers(dockerd_host, owner)), "a live container went"
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 240)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        left = _containers(dockerd_host, owner)
        _remove(dockerd_host, list(left))
    assert proc.returncode == 0, stderr.decode()[-3000:]
    final = rows(out / "rollouts.jsonl")
    assert {r["outcome"] for r in final} == {"solved"} and len(final) == 2, final
    assert {r["node_id"] for r in final} == {names["head"]}, final
    assert sorted(len(r["rescheduled"]) for r in final) == [0, 1], final
    (moved,) = [r for r in final if r["rescheduled"]]
    assert moved["rescheduled"][0]["node_id"] == names["node2"]
    assert json.loads((out / "summary.json").read_text())["rescheduled"] == 1
    assert "rescheduled (node or actor lost)" in stdout.decode()
    assert left == {}, "containers of the run outlived it"


def _labelled(host: str, image: str, owner: str, process: str) -> str:
    """A stopped container carrying agentrl's labels as ``process`` of ``owner`` made it."""
    labels = {
        "agentrl.sandbox": "docker",
        "agentrl.run": f"run-{uuid.uuid4().hex[:8]}",
        "agentrl.owner": owner,
        "agentrl.process": process,
    }
    argv = ["docker", "create", *(f"--label={k}={v}" for k, v in labels.items()), image, "true"]
    return subprocess.run(
        argv,
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()[:12]


def _dead_process() -> str:
    """The ``process_label`` of a process of this host that has exited."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return f"{socket.gethostname()}:{gone.pid}:1"


def _run_of(host: str, cid: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "--format", '{{index .Config.Labels "agentrl.run"}}', cid],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


async def test_a_starting_node_sweeps_only_containers_of_dead_processes(
    dockerd_host, docker_base_image
):
    """What a node runs when its stack is up (``sweep_orphans``): of this owner's containers
    on the host's daemon, the one whose creating process is dead goes; the one of a live
    process (this one: a run still going) stays, and so does a dead one of another owner."""
    owner, other = f"test-orphans-{uuid.uuid4().hex[:8]}", f"test-other-{uuid.uuid4().hex[:8]}"
    dead = _dead_process()
    made: dict[str, str] = {}
    try:
        made["dead"] = _labelled(dockerd_host, docker_base_image, owner, dead)
        made["live"] = _labelled(dockerd_host, docker_base_image, owner, process_label())
        made["other"] = _labelled(dockerd_host, docker_base_image, other, dead)
        removed = await DockerSandbox.sweep_orphans(docker_host=dockerd_host, owner=owner)
        assert [cid[:12] for cid in removed] == [made["dead"]]
        assert set(_containers(dockerd_host, owner)) == {made["live"]}
        assert set(_containers(dockerd_host, other)) == {made["other"]}
    finally:
        _remove(dockerd_host, list(made.values()))


async def test_a_lost_nodes_daemon_on_another_hosts_socket_is_not_this_hosts_to_sweep(
    dockerd_host, docker_base_image
):
    """``sweep`` given the keywords a node on another host reported (its daemon a
    ``unix://`` socket there) removes nothing here, even where a daemon of that address
    holds containers of that run and process; from this host, the same keywords do."""
    owner = f"test-remote-{uuid.uuid4().hex[:8]}"
    cid = _labelled(dockerd_host, docker_base_image, owner, process_label())
    try:
        keywords = DockerSandbox.sweep_keywords(docker_host=dockerd_host, owner=owner)
        keywords["run_id"] = _run_of(dockerd_host, cid)
        elsewhere = {**keywords, "from_host": f"not-{socket.gethostname()}"}
        assert await DockerSandbox.sweep(**elsewhere) == []
        assert set(_containers(dockerd_host, owner)) == {cid}
        removed = await DockerSandbox.sweep(**keywords)
        assert [c[:12] for c in removed] == [cid]
    finally:
        _remove(dockerd_host, [cid])

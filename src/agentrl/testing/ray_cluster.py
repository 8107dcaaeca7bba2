"""A real Ray cluster of several nodes on this machine, for tests and benchmarks.

Each node is one ``ray start --block`` process started here in its own process group,
with its own ``--temp-dir`` and a custom resource naming it (``agentrl_head``,
``agentrl_node2``, …), so where an actor ran is observable. It is stopped by the process
groups it started (never ``ray stop``, which would stop every cluster of the machine), and
then any process still naming its temporary directory is killed too.

::

    with LocalRayCluster(num_cpus=2, nodes=("node2",)) as cluster:   # head + a node
        cluster.add_node("node3")                     # one more node, same machine
        cluster.address                               # "127.0.0.1:PORT" for --ray
        cluster.node_ids()                            # {"head": NODE_ID, "node2": NODE_ID}
        cluster.kill_node("node2")                    # SIGKILL: a node that dies
        cluster.alive_actors()                        # actors not DEAD, cluster-wide
        cluster.rollout_actors()                      # agentrl's node actors: node id, pid
        cluster.actor_pids("head")                    # their processes, found from /proc

``RAY_AUTH_MODE=disabled`` is set for every process it starts; the GCS declares a silent
node dead within about two seconds (instead of Ray's ~30).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["LocalRayCluster", "RayStartError"]

#: The environment of every process of the cluster (and of drivers the tests start).
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
    # A node that stops answering is declared dead in ~2 s, so fault tests stay short.
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}


class RayStartError(RuntimeError):
    """A node of the cluster did not start (its output is in the message)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray_binary() -> str:
    found = pathlib.Path(sys.executable).with_name("ray")
    return str(found) if found.exists() else "ray"


class LocalRayCluster:
    """A head (``agentrl_head``) and the nodes added to it, on this machine."""

    def __init__(
        self,
        *,
        num_cpus: int = 2,
        object_store_bytes: int = 100_000_000,
        env: Mapping[str, str] | None = None,
        nodes: tuple[str, ...] = (),
        start_timeout: float = 90.0,
    ) -> None:
        self.num_cpus = num_cpus
        self.object_store_bytes = object_store_bytes
        self.start_timeout = start_timeout
        #: Short, so the nodes' unix socket paths stay under the length limit.
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="agentrl-ray-", dir="/tmp"))
        self.env = {**os.environ, **RAY_ENV, **(env or {})}
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._nodes = tuple(nodes)

    def __enter__(self) -> LocalRayCluster:
        try:
            self.start(self._nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, nodes: tuple[str, ...] = ()) -> None:
        """Start the head node and then ``nodes`` (see ``add_node``); wait until all serve."""
        self._launch(
            "head",
            "--head",
            f"--port={self.port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-port={free_port()}",
            "--include-dashboard=false",
        )
        self._wait("head")
        for name in nodes:
            self._launch(name, f"--address={self.address}")
        for name in nodes:
            self._wait(name)

    def add_node(self, name: str, *, num_cpus: int | None = None) -> None:
        """Start a node ``name`` (resource ``agentrl_<name>``) joined to the head."""
        self._launch(name, f"--address={self.address}", num_cpus=num_cpus)
        self._wait(name)

    def _launch(self, name: str, *args: str, num_cpus: int | None = None) -> None:
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True, exist_ok=True)
        log = (self.root / f"{name}.log").open("wb")
        command = [
            _ray_binary(),
            "start",
            "--block",
            *args,
            f"--num-cpus={self.num_cpus if num_cpus is None else num_cpus}",
            f"--resources={json.dumps({f'agentrl_{name}': 1})}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ]
        proc = subprocess.Popen(
            command,
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc

    def _wait(self, name: str) -> None:
        proc = self.procs[name]
        deadline = time.monotonic() + self.start_timeout
        while b"Ray runtime started" not in self._output(name):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RayStartError(
                    f"ray node {name!r} did not start (exit {proc.poll()}):\n"
                    + self._output(name).decode(errors="replace")[-3000:]
                )
            time.sleep(0.2)

    def _output(self, name: str) -> bytes:
        path = self.root / f"{name}.log"
        return path.read_bytes() if path.exists() else b""

    # -- looking at it -----------------------------------------------------
    def query(self, code: str, timeout: float = 60.0) -> Any:
        """Run ``code`` in a fresh driver connected to the cluster; the JSON it prints."""
        script = (
            "import json, ray\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"{code}\n"
            "ray.shutdown()\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ray query failed: {done.stderr.decode(errors='replace')[-2000:]}")
        return json.loads(done.stdout.decode().strip().splitlines()[-1])

    def node_ids(self) -> dict[str, str]:
        """The alive nodes' ids, by the name each was started with."""
        nodes = self.query(
            "print(json.dumps([[n['NodeID'], n['Alive'], n['Resources']] for n in ray.nodes()]))"
        )
        names: dict[str, str] = {}
        for node_id, alive, resources in nodes:
            for resource in resources:
                if alive and resource.startswith("agentrl_"):
                    names[resource.removeprefix("agentrl_")] = node_id
        return names

    def alive_actors(self) -> list[dict[str, Any]]:
        """Every actor of the cluster that is not dead (any job's)."""
        actors = self.query(
            "from ray._private import state\n"
            "print(json.dumps([{'actor_id': k, 'state': v['State'], 'class': "
            "v.get('ActorClassName', '')} for k, v in state.actors().items()]))"
        )
        return [actor for actor in actors if actor["state"] != "DEAD"]

    def rollout_actors(self) -> list[dict[str, Any]]:
        """The node actors of ``agentrl rollout --ray`` alive now: name, node id, pid."""
        return self.query(
            "found = []\n"
            "for actor in ray.util.list_named_actors(all_namespaces=True):\n"
            "    if actor['namespace'] == 'agentrl':\n"
            "        handle = ray.get_actor(actor['name'], namespace='agentrl')\n"
            "        found.append({'name': actor['name'], **ray.get(handle.where.remote())})\n"
            "print(json.dumps(found))"
        )

    def actor_pids(self, node: str | None = None, title: str = "ray::NodeRollouts") -> list[int]:
        """Pids of this cluster's worker processes running an actor of class ``title`` (on
        ``node``, or any), found from their raylet (no driver needed)."""
        raylets = {}
        for pid in self.processes():
            with contextlib.suppress(OSError):
                cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"/raylet/raylet" in cmdline.split(b"\0")[0]:
                    raylets[pid] = cmdline
        if node is not None:
            mark = f"{self.root / node}/".encode()
            raylets = {pid: cmd for pid, cmd in raylets.items() if mark in cmd}
        found = []
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                if not (entry / "cmdline").read_bytes().startswith(title.encode()):
                    continue
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid in raylets:
                    found.append(int(entry.name))
        return found

    def processes(self) -> list[int]:
        """Pids of every process on this machine that names this cluster's directory."""
        needle = str(self.root).encode()
        found = []
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
        return found

    # -- stopping it -------------------------------------------------------
    def kill_node(self, name: str) -> None:
        """SIGKILL node ``name``'s process group: a machine that dies."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        """Kill every node by the process group started here, then any straggler."""
        for name in list(self.procs):
            self.kill_node(name)
        deadline = time.monotonic() + 15
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        shutil.rmtree(self.root, ignore_errors=True)

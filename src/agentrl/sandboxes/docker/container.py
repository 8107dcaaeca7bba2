"""What a ``docker`` sandbox's container is created with: limits, mounts, labels, main process.

The container has no network (``NetworkMode: none``); each host service's unix socket is
reached through its *directory*, bound read-only at ``/run/agentrl/services/<port>`` (a
bound socket file would go stale when the server recreates the socket), and relayed to
``127.0.0.1:<port>`` by the main process (``python3``, else ``socat``, from the image).
The root is read-only where asked; the workspace is an anonymous volume (seeded by the
daemon from the image's own ``workdir``), or, with a size limit, a tmpfs of that size
(seeded by the sandbox after the start: ``seed_archive``); ``/tmp``, ``/run`` and the
homes are tmpfs.
``Init`` runs docker's init as pid 1, so a stop is instant and zombies are reaped.
"""

from __future__ import annotations

import io
import os
import pathlib
import shlex
import tarfile
from collections.abc import Mapping
from typing import Any

from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.docker.options import DockerOptions

__all__ = [
    "AGENT_HOME",
    "READY_LINE",
    "READY_MARKER",
    "SERVICES_DIR",
    "create_config",
    "main_script",
    "repo_tarball",
    "seed_archive",
]

SERVICES_DIR = "/run/agentrl/services"
READY_MARKER = "/run/agentrl/ready"
#: The line the main process prints once the workspace is the agent's and the relays listen.
READY_LINE = "agentrl-ready"
AGENT_HOME = "/home/agent"

#: The TCP → unix socket relay: ``python3 -c RELAY PORT=SOCKET ...``.
RELAY = r"""
import asyncio, sys

async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except Exception:
        pass

async def main():
    for spec in sys.argv[1:]:
        port, path = spec.split("=", 1)

        async def handle(reader, writer, path=path):
            try:
                up_reader, up_writer = await asyncio.open_unix_connection(path)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            up_writer.close()
            writer.close()

        await asyncio.start_server(handle, "127.0.0.1", int(port))
    open("/run/agentrl/ready", "w").close()
    print("agentrl-ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _inside_socket(port: int, sock: pathlib.Path) -> str:
    return f"{SERVICES_DIR}/{port}/{sock.name}"


def main_script(options: DockerOptions) -> str:
    """The container's main process: give the workspace to the agent, start the relays,
    print ``READY_LINE``, then sleep forever (the python relay itself, when it runs)."""
    specs = " ".join(
        shlex.quote(f"{port}={_inside_socket(port, sock)}")
        for port, sock in sorted(options.services.items())
    )
    uid = options.agent_uid
    lines = [
        "mkdir -p /run/agentrl",
        f"chown -R {uid}:{uid} {shlex.quote(options.workdir)} || "
        "echo 'agentrl: could not give the workspace to the agent' >&2",
    ]
    if specs:
        socat = " ".join(
            f"socat TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork "
            f"UNIX-CONNECT:{shlex.quote(_inside_socket(port, sock))} &"
            for port, sock in sorted(options.services.items())
        )
        lines.append(
            "py=$(command -v python3 || command -v python) || py=''\n"
            # The relay is the main process: if it fails, the container exits and the
            # start fails at once with its error.
            f'if [ -n "$py" ]; then exec "$py" -c {shlex.quote(RELAY)} {specs}\n'
            f"elif command -v socat >/dev/null 2>&1; then {socat} sleep 0.2; "
            f"touch {READY_MARKER}; echo {READY_LINE}\n"
            "else echo 'agentrl: the image has neither python3 nor socat to relay the "
            "host services' >&2; exit 1; fi"
        )
    else:
        lines.append(f"touch {READY_MARKER}; echo {READY_LINE}")
    lines.append("exec sleep 2147483647")
    return "\n".join(lines)


def _tmpfs(size_mb: int, mode: str, uid: int = 0) -> str:
    return f"rw,nosuid,nodev,size={size_mb}m,mode={mode},uid={uid},gid={uid}"


def create_config(
    options: DockerOptions,
    image: str,
    labels: dict[str, str],
    file_binds: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Engine API body of ``POST /containers/create`` for one sandbox; ``file_binds``
    (``{host_file: container_path}``, read-only) are the sandbox's own generated files."""
    uid = options.agent_uid
    binds = [
        f"{sock.parent}:{SERVICES_DIR}/{port}:ro" for port, sock in sorted(options.services.items())
    ]
    binds += [f"{host}:{inside}:ro" for host, inside in sorted(options.ro_binds.items())]
    binds += [f"{host}:{inside}:ro" for host, inside in sorted((file_binds or {}).items())]
    host_config: dict[str, Any] = {
        "NetworkMode": "none",
        "Init": True,
        "ReadonlyRootfs": options.read_only_root,
        "CapDrop": ["ALL"],
        "CapAdd": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID"],
        "SecurityOpt": ["no-new-privileges"],
        "Tmpfs": {
            "/tmp": _tmpfs(options.tmp_size_mb, "1777"),
            "/run": _tmpfs(64, "755"),
            AGENT_HOME: _tmpfs(options.home_size_mb, "700", uid),
            "/root": _tmpfs(options.home_size_mb, "700"),
        },
        "Binds": binds,
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}},
    }
    volumes: dict[str, Any] = {options.workdir: {}}
    workspace_mb = options.workspace_limit_mb
    if workspace_mb is not None:
        # No quota on the daemon's disk (overlay2 needs xfs with pquota for one): a tmpfs.
        host_config["Tmpfs"][options.workdir] = (
            f"rw,exec,nosuid,nodev,size={workspace_mb}m,mode=755"
        )
        volumes = {}
    if options.memory_mb is not None:
        host_config["Memory"] = options.memory_mb << 20
        host_config["MemorySwap"] = options.memory_mb << 20
    if options.pids is not None:
        host_config["PidsLimit"] = options.pids
    if options.cpus is not None:
        host_config["NanoCpus"] = int(options.cpus * 1e9)
    return {
        "Image": image,
        "Cmd": ["sh", "-c", main_script(options)],
        "Entrypoint": [],
        "User": "0:0",
        "WorkingDir": options.workdir,
        "Env": [f"{key}={value}" for key, value in options.env.items()],
        "Labels": labels,
        "NetworkDisabled": True,
        "Volumes": volumes,
        "HostConfig": host_config,
    }


def seed_archive(image_content: tarfile.TarFile | None, repo: bytes | None) -> bytes:
    """One plain tarball of what a size-limited workspace starts with: ``image_content``
    (the image's ``workdir`` as the daemon archives it, under the directory's own name,
    which is stripped) and then the task's ``repo`` (a tarball, compressed or not)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        if image_content is not None:
            for member in image_content.getmembers():
                _, sep, rest = member.name.partition("/")
                if not sep or not rest:
                    continue  # the workspace directory itself: the tmpfs is its own root
                data = image_content.extractfile(member) if member.isfile() else None
                member.name = rest
                if member.islnk():
                    member.linkname = member.linkname.partition("/")[2]
                out.addfile(member, data)
        if repo:
            with tarfile.open(fileobj=io.BytesIO(repo), mode="r:*") as source:
                for member in source.getmembers():
                    out.addfile(member, source.extractfile(member) if member.isfile() else None)
    return buffer.getvalue()


def repo_tarball(repo: pathlib.Path) -> bytes:
    """A tarball of ``repo``'s contents (a tarball itself is sent as it is)."""
    if not repo.exists():
        raise SandboxError(f"the task's repository {repo} does not exist on this machine")
    if repo.is_file():
        return repo.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for entry in sorted(os.listdir(repo)):
            tar.add(repo / entry, arcname=entry)
    return buffer.getvalue()

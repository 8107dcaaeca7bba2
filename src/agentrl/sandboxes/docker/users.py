"""The ``agent`` user of a container: ``/etc/passwd`` and ``/etc/group`` with it added.

A read-only root cannot gain a user at run time, and tools (the harness's ``id -u agent``,
``git``, ``ssh``) look users up by name. So before the sandbox's container is created,
the image's own two files are read from a created (never started) container of that
image — image content, not anything a sandbox wrote — and written with an ``agent``
entry (``agent_uid``, home ``/home/agent``) to a host directory bound read-only over
them. The files are cached per image id.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Mapping
from typing import Any

from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.docker.client import sandbox_error

__all__ = ["MAX_ACCOUNT_FILE", "account_files", "with_agent"]

#: The most of an image's ``/etc/passwd`` or ``/etc/group`` that is read.
MAX_ACCOUNT_FILE = 1 << 20
_FILES = ("passwd", "group")
_cache: dict[tuple[str, int], dict[str, str]] = {}


def with_agent(name: str, text: str, uid: int, home: str) -> str:
    """``text`` (a passwd or group file) without any ``agent`` entry, plus ours."""
    lines = [line for line in text.splitlines() if line and not line.startswith("agent:")]
    entry = f"agent:x:{uid}:{uid}:agent:{home}:/bin/sh" if name == "passwd" else f"agent:x:{uid}:"
    return "\n".join([*lines, entry]) + "\n"


async def _read(container: Any, path: str) -> str:
    from aiodocker.exceptions import DockerError

    try:
        tar = await container.get_archive(path)
    except DockerError as exc:
        if exc.status == 404:
            return ""
        raise sandbox_error(exc, f"read of the image's {path}") from exc
    with tar:
        for member in tar.getmembers():
            if member.isfile() and member.size <= MAX_ACCOUNT_FILE:
                handle = tar.extractfile(member)
                if handle is not None:
                    return handle.read(MAX_ACCOUNT_FILE).decode("utf-8", errors="replace")
    return ""


async def _image_files(
    docker: Any, image: str, uid: int, home: str, labels: Mapping[str, str]
) -> dict[str, str]:
    from aiodocker.exceptions import DockerError

    info = await docker.images.inspect(image)
    key = (str(info.get("Id") or image), uid)
    if key in _cache:
        return _cache[key]
    try:
        probe = await docker.containers.create(
            {
                "Image": image,
                "Cmd": ["true"],
                "Entrypoint": [],
                "NetworkDisabled": True,
                "HostConfig": {"NetworkMode": "none"},
                "Labels": dict(labels),
            }
        )
    except DockerError as exc:
        raise sandbox_error(exc, f"probe container of {image}") from exc
    try:
        files = {
            name: with_agent(name, await _read(probe, f"/etc/{name}"), uid, home) for name in _FILES
        }
    finally:
        try:
            await probe.delete(force=True, v=True)
        except DockerError:
            pass
    _cache[key] = files
    return files


async def account_files(
    docker: Any,
    image: str,
    *,
    uid: int,
    home: str,
    directory: pathlib.Path,
    labels: Mapping[str, str],
) -> dict[str, str]:
    """Write the image's passwd and group with ``agent`` into ``directory``; the binds
    (``{host_path: container_path}``). ``labels`` mark the probe container as the sandbox's."""
    files = await _image_files(docker, image, uid, home, labels)
    return await asyncio.to_thread(_write, files, directory)


def _write(files: Mapping[str, str], directory: pathlib.Path) -> dict[str, str]:
    binds = {}
    for name, text in files.items():
        path = directory / name
        try:
            path.write_text(text)
            path.chmod(0o644)
        except OSError as exc:
            raise SandboxError(f"could not write {path}: {exc}") from exc
        binds[str(path)] = f"/etc/{name}"
    return binds

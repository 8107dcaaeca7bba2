"""The daemon's images: one listing says which of a run's images are missing; pulls.

A reference is compared the way the daemon resolves it: a missing tag is ``latest``,
Docker Hub's ``docker.io/`` and ``library/`` prefixes are dropped, a digest reference
matches a ``RepoDigests`` entry, and an image id (or a prefix of at least 12 hex digits)
matches the image's ``Id``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.docker.client import connect, sandbox_error
from agentrl.sandboxes.images import ImageReport, group_needs

__all__ = ["held_images", "pull", "reference_key", "report"]

_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")
_IMAGE_ID = re.compile(r"^(?:sha256:)?([0-9a-f]{12,64})$")


def reference_key(name: str) -> str:
    """``name`` as the daemon lists it: ``repo:tag`` (tag ``latest`` when none) or
    ``repo@digest``, without Docker Hub's ``docker.io/`` and ``library/`` prefixes.

    >>> reference_key("docker.io/library/python:3.12@sha256:ab")
    'python@sha256:ab'
    """
    repo, at, digest = name.strip().partition("@")
    slash, colon = repo.rfind("/"), repo.rfind(":")
    # ``repo:tag@digest`` is the digest alone (the daemon ignores the tag).
    repo, tag = (repo[:colon], repo[colon + 1 :]) if colon > slash else (repo, "latest")
    first, _, rest = repo.partition("/")
    if rest and first in _HUB_HOSTS:
        repo = rest
    if repo.startswith("library/") and repo.count("/") == 1:
        repo = repo.removeprefix("library/")
    return f"{repo}@{digest}" if at else f"{repo}:{tag}"


def _holder(listing: Iterable[dict[str, Any]]) -> Callable[[str], bool]:
    """Whether a name refers to an image of ``listing`` (the daemon's ``/images/json``)."""
    keys: set[str] = set()
    ids: list[str] = []
    for image in listing:
        for ref in (image.get("RepoTags") or []) + (image.get("RepoDigests") or []):
            if not ref.startswith("<none>"):
                keys.add(reference_key(ref))
        ids.append(str(image.get("Id", "")).removeprefix("sha256:"))

    def held(name: str) -> bool:
        by_id = _IMAGE_ID.match(name.strip())
        if by_id and any(image_id.startswith(by_id.group(1)) for image_id in ids):
            return True
        return reference_key(name) in keys

    return held


async def held_images(docker: Any) -> Callable[[str], bool]:
    """One listing of the daemon's images, as a test of whether it holds a name."""
    try:
        listing = await docker.images.list()
    except Exception as exc:
        raise sandbox_error(exc, "listing of the images") from exc
    return _holder(listing)


async def report(host: str, task_images: Iterable[tuple[str, tuple[str, ...]]]) -> ImageReport:
    """The images of ``(task id, candidates)`` pairs and which the daemon at ``host`` lacks."""
    docker = connect(host)
    try:
        held = await held_images(docker)
    finally:
        await docker.close()
    return ImageReport(backend="docker", where=host, needs=group_needs(task_images, held))


async def pull(host: str, name: str) -> None:
    """Pull image ``name`` into the daemon at ``host``; ``SandboxError`` saying why not."""
    docker = connect(host)
    try:
        try:
            progress = await docker.images.pull(name)
        except Exception as exc:
            raise SandboxError(f"pull of {name} failed: {getattr(exc, 'message', exc)}") from exc
        errors = [
            str(line.get("error"))
            for line in progress or ()
            if isinstance(line, dict) and line.get("error")
        ]
        if errors:
            raise SandboxError(f"pull of {name} failed: {errors[-1]}")
        if not (await held_images(docker))(name):
            raise SandboxError(f"pull of {name} ended, but the daemon does not list it")
    finally:
        await docker.close()

"""The Docker client: aiodocker connections and the daemon's errors as sandbox errors.

aiodocker is imported only here and only when a sandbox talks to a daemon, so
``import agentrl.sandboxes`` loads no aiohttp client code it does not need.
"""

from __future__ import annotations

from typing import Any

from agentrl.extras import install_hint
from agentrl.sandboxes.base import SandboxError, SandboxGoneError

__all__ = ["MissingImageError", "connect", "image_present", "sandbox_error"]


class MissingImageError(SandboxError):
    """None of a sandbox's candidate images is on the daemon (a sandbox never pulls)."""

    def __init__(self, images: tuple[str, ...], host: str) -> None:
        self.images = images
        names = ", ".join(images) or "(none: the task names no image and no default_image is set)"
        super().__init__(
            f"docker image not present on the daemon at {host}: {names}; get it before the "
            "run with `agentrl images pull TASKS` (or `docker pull IMAGE` / `docker build "
            "-t IMAGE .`): a sandbox never pulls"
        )


def connect(host: str) -> Any:
    """An ``aiodocker.Docker`` for daemon ``host`` (closed by the caller)."""
    try:
        import aiodocker
    except ImportError:
        raise SandboxError(
            f"the docker sandbox needs aiodocker; install it with: {install_hint('docker')}"
        ) from None
    try:
        return aiodocker.Docker(url=host)
    except Exception as exc:
        raise SandboxError(f"cannot use the docker daemon at {host}: {exc}") from exc


def sandbox_error(exc: BaseException, what: str) -> SandboxError:
    """A daemon error as a ``SandboxError`` (``SandboxGoneError`` when the container is gone)."""
    status = getattr(exc, "status", None)
    message = getattr(exc, "message", None) or str(exc)
    if status == 404 or (status == 409 and "not running" in message):
        return SandboxGoneError(f"the docker container is gone ({what}): {message}")
    return SandboxError(f"docker {what} failed: {type(exc).__name__}: {message}")


async def image_present(docker: Any, name: str) -> bool:
    """Whether image ``name`` is on the daemon."""
    from aiodocker.exceptions import DockerError

    try:
        await docker.images.inspect(name)
    except DockerError as exc:
        if exc.status == 404:
            return False
        raise sandbox_error(exc, f"inspect of image {name}") from exc
    return True

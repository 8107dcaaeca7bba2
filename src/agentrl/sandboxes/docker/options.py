"""Options of the ``docker`` sandbox: what ``DockerSandbox(**options)`` takes, validated once.

The keyword names are user API (``--sandbox-options`` JSON keys), so a field is never
renamed. Validation raises ``ValueError``; an unknown key raises ``TypeError`` worded as
Python words it for a keyword-only constructor.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import attrs

from agentrl import settings

__all__ = ["DEFAULT_DOCKER_HOST", "DockerOptions"]

#: The daemon agentrl talks to when neither the option nor the environment names one.
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def _own_workdir(value: str) -> str:
    if not value.startswith("/") or value.rstrip("/") in ("", "/tmp", "/run", "/proc", "/dev"):
        raise ValueError(f"workdir must be an absolute path of its own, got {value!r}")
    return value.rstrip("/")


def _services(value: Mapping[int, str | os.PathLike[str]] | None) -> dict[int, pathlib.Path]:
    return {int(port): pathlib.Path(sock) for port, sock in (value or {}).items()}


def _strings(value: Mapping[str, str] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def _positive_or_none(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, (int, float)) or value <= 0):
        raise ValueError(f"{attribute.name} must be a positive number or null, got {value!r}")


def _non_negative_or_none(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or value < 0):
        raise ValueError(f"{attribute.name} must be a whole number ≥ 0 or null, got {value!r}")


def _positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


#: The workspace's size limit in MiB when neither the option nor the setting gives one.
DEFAULT_WORKSPACE_MB = 2048


@attrs.frozen(kw_only=True)
class DockerOptions:
    """Everything a ``docker`` sandbox is configured with.

    ``image``: the image the container runs (the task's ``image``; ``default_image`` only
    when the task names none). ``images``: candidates preferred to ``image``, tried in order
    (the first present on the daemon wins): the task's ``metadata.docker_images``, which
    the swebench grader fills with swebench's ``sweb.eval.*`` instance image name. ``repo``: a host directory or tarball copied into
    ``workdir`` at start. ``services``: ``{port: unix_socket_path}``; each socket's
    *directory* is bound in read-only and relayed to ``127.0.0.1:port`` inside.
    ``memory_mb`` / ``pids`` / ``cpus``: the container's limits (None: unlimited).
    ``workspace_size_mb``: the workspace's size limit (default ``AGENTRL_DOCKER_WORKSPACE_MB``,
    else 2048 but at most half of ``memory_mb``): the workspace is a tmpfs of that size,
    counted in ``memory_mb`` (a full workspace is ENOSPC, not the OOM killer), seeded with what the image ships there and the task's repository; a write past
    it fails with ENOSPC. ``0``: no limit, the workspace is a volume on the daemon's disk.
    ``read_only_root``: mount the image read-only (the workspace, ``/tmp``, ``/run`` and
    the homes stay writable); turn it off for an image whose tests write elsewhere.
    ``ro_binds``: ``{host_path: container_path}`` bound read-only (host CLIs, node).
    ``docker_host``: the daemon (default ``AGENTRL_DOCKER_HOST`` / ``DOCKER_HOST``, else
    the system socket). ``run_id``: the run label every container carries (the stack sets
    one per run; default: one per process). ``agent_uid``: the unprivileged user the
    ``agent`` user maps to.
    """

    image: str | None = None
    images: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    default_image: str | None = None
    repo: str | None = None
    workdir: str = attrs.field(default="/workspace", converter=_own_workdir)
    services: dict[int, pathlib.Path] = attrs.field(factory=dict, converter=_services)
    env: dict[str, str] = attrs.field(factory=dict, converter=_strings)
    ro_binds: dict[str, str] = attrs.field(factory=dict, converter=_strings)
    memory_mb: int | None = attrs.field(default=4096, validator=_positive_or_none)
    pids: int | None = attrs.field(default=1024, validator=_positive_or_none)
    cpus: float | None = attrs.field(default=None, validator=_positive_or_none)
    tmp_size_mb: int = attrs.field(default=1024, validator=_positive)
    home_size_mb: int = attrs.field(default=1024, validator=_positive)
    workspace_size_mb: int | None = attrs.field(default=None, validator=_non_negative_or_none)
    agent_uid: int = 1000
    read_only_root: bool = True
    max_output_bytes: int | None = None
    startup_timeout: float = attrs.field(default=60.0, validator=_positive)
    docker_host: str | None = None
    run_id: str | None = None
    owner: str | None = None

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every keyword ``DockerSandbox`` takes."""
        return frozenset(attrs.fields_dict(cls))

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> DockerOptions:
        """``DockerOptions(**keywords)``, refusing an unknown key as a constructor would."""
        for key in keywords:
            if key not in attrs.fields_dict(cls):
                raise TypeError(
                    f"DockerSandbox.__init__() got an unexpected keyword argument {key!r}"
                )
        return cls(**keywords)

    @property
    def host(self) -> str:
        """The daemon's address: the option, else the environment, else the system socket."""
        if self.docker_host:
            return self.docker_host
        return settings.get("AGENTRL_DOCKER_HOST") or DEFAULT_DOCKER_HOST

    @property
    def workspace_limit_mb(self) -> int | None:
        """The workspace's size limit in MiB, or None for no limit (``0``): the option, else
        the environment, else :data:`DEFAULT_WORKSPACE_MB` but at most half of ``memory_mb``
        (the tmpfs counts in it: a full workspace must be ENOSPC, not the OOM killer)."""
        size = self.workspace_size_mb
        if size is None:
            size = settings.get("AGENTRL_DOCKER_WORKSPACE_MB")
        if size is None:
            size = DEFAULT_WORKSPACE_MB
            if self.memory_mb is not None:
                size = max(1, min(size, self.memory_mb // 2))
        return size or None

    def candidates(self) -> tuple[str, ...]:
        """The images to try, in order, without repeats: ``images``, then ``image``; or, for
        a task that names none, ``default_image`` (else ``AGENTRL_DOCKER_BASE_IMAGE``)."""
        named = [name for name in (*self.images, self.image) if name]
        if not named:
            default = self.default_image or settings.get("AGENTRL_DOCKER_BASE_IMAGE")
            named = [default] if default else []
        return tuple(dict.fromkeys(named))

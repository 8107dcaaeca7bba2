"""Options of the ``local`` sandbox: what ``LocalSandbox(**options)`` takes, validated once.

The keyword names are user API (``--sandbox-options`` JSON keys, ``option_names``), so a
field is never renamed. Validation raises ``ValueError`` as the constructor always has; an
unknown key raises ``TypeError`` worded as Python words it for a keyword-only constructor.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import attrs

from agentrl.sandboxes.local.fs import host_python_options

__all__ = ["OVERLAY_MODES", "LocalOptions"]

#: The values ``overlay`` takes: overlayfs when it mounts here, never, or overlayfs or fail.
OVERLAY_MODES = ("auto", "never", "require")


def _own_workdir(value: str) -> str:
    """``value`` without trailing slashes, once it is an absolute directory of its own."""
    if not value.startswith("/") or value.rstrip("/") in ("", "/tmp", "/.agentrl"):
        raise ValueError(f"workdir must be an absolute path of its own, got {value!r}")
    return value.rstrip("/")


def _services(value: Mapping[int, str | os.PathLike[str]] | None) -> dict[int, pathlib.Path]:
    return {int(port): pathlib.Path(sock) for port, sock in (value or {}).items()}


def _strings(value: Mapping[str, str] | None) -> dict[str, str]:
    return dict(value or {})


def _optional_path(value: str | os.PathLike[str] | None) -> pathlib.Path | None:
    return pathlib.Path(value) if value else None


def _positive(instance: LocalOptions, attribute: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive number of MiB, got {value!r}")


def _overlay_mode(instance: LocalOptions, attribute: attrs.Attribute, value: str) -> None:
    if value not in OVERLAY_MODES:
        raise ValueError(f"overlay must be 'auto', 'never' or 'require', got {value!r}")


@attrs.frozen(kw_only=True)
class LocalOptions:
    """Everything a ``local`` sandbox is configured with.

    ``image``: None for the host's system directories (read-only), or a root filesystem
    directory / tarball. ``repo``: a directory or tarball that appears at ``workdir``;
    edits never reach it. ``services``: ``{port: unix_socket_path}``; each socket is bound
    in and relayed to ``127.0.0.1:port`` inside. ``memory_mb`` / ``pids``: limits for the
    whole sandbox (None: unlimited). ``tmp_size_mb`` / ``home_size_mb``: tmpfs sizes.
    ``overlay``: one of ``OVERLAY_MODES``. ``state_dir``: where host-side state lives
    (None: the system temp directory). ``host_python``: with the host's root (no image),
    bind this machine's Python interpreter in and put it first on PATH (see
    ``host_python_options``); ``ro_binds`` and ``env`` given here win over what it adds.
    ``workspace_size_mb``: what the workspace may grow by (the overlay's upper layer, or the
    copy beyond the repository's size); ``output_size_mb``: the area every exec's output
    and ``read_file`` go through; ``shm_size_mb``: ``/dev/shm``. ``host_uid``: on a root
    host, the unprivileged host id the sandbox runs as (default: root's first subordinate
    id, or 100000, plus ``agent_uid``); ignored on a host that is not root.
    """

    image: str | None = None
    repo: str | None = None
    workdir: str = attrs.field(default="/workspace", converter=_own_workdir)
    services: dict[int, pathlib.Path] = attrs.field(factory=dict, converter=_services)
    env: dict[str, str] = attrs.field(factory=dict, converter=_strings)
    memory_mb: int | None = 4096
    pids: int | None = 1024
    tmp_size_mb: int = 1024
    home_size_mb: int = 1024
    agent_uid: int = 1000
    overlay: str = attrs.field(default="auto", validator=_overlay_mode)
    ro_binds: dict[str, str] = attrs.field(factory=dict, converter=_strings)
    max_output_bytes: int | None = None
    startup_timeout: float = 30.0
    bwrap: str = "bwrap"
    state_dir: pathlib.Path | None = attrs.field(default=None, converter=_optional_path)
    host_python: bool = False
    workspace_size_mb: int = attrs.field(default=4096, validator=_positive)
    output_size_mb: int = attrs.field(default=256, validator=_positive)
    shm_size_mb: int = attrs.field(default=64, validator=_positive)
    host_uid: int | None = None

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every keyword ``LocalSandbox`` takes."""
        return frozenset(attrs.fields_dict(cls))

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> LocalOptions:
        """``LocalOptions(**keywords)``, refusing an unknown key as ``LocalSandbox()`` has."""
        for key in keywords:
            if key not in attrs.fields_dict(cls):
                raise TypeError(
                    f"LocalSandbox.__init__() got an unexpected keyword argument {key!r}"
                )
        return cls(**keywords)

    def sandbox_env_and_binds(self) -> tuple[dict[str, str], dict[str, str]]:
        """``env`` and ``ro_binds`` plus what ``host_python`` adds (the explicit ones win)."""
        if not self.host_python or self.image is not None:
            return dict(self.env), dict(self.ro_binds)
        python = host_python_options()
        return {**python["env"], **self.env}, {**python["ro_binds"], **self.ro_binds}

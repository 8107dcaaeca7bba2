"""The labels every container of the ``docker`` sandbox carries, and the sweeps that use them.

``agentrl.sandbox`` marks agentrl's containers, ``agentrl.run`` the run (one id per process
by default, or per stack when the stack passes ``run_id``), ``agentrl.owner`` the
deployment (``owner``, default this host's name) and ``agentrl.process`` the creating
process (``host:pid:start``). The daemon filters by label, so:

- ``sweep_run``: at the close of a run, every container of the run still there (of one
  creating process only, given ``process``: what a Ray driver removes of a node it lost);
- ``sweep_stale``: on the first start in a process, this deployment's containers whose
  creating process on this host is gone (the owner was killed before it could close them).

A container without these labels is never touched; every step is best-effort (a failed
listing or removal is logged, never raised).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any

from agentrl.sandboxes.base import process_alive, process_label

__all__ = [
    "OWNER_KEY",
    "PROCESS_KEY",
    "RUN_KEY",
    "SANDBOX_KEY",
    "container_labels",
    "process_alive",
    "process_label",
    "process_run_id",
    "remove_all",
    "stale",
    "sweep_run",
    "sweep_stale",
]

logger = logging.getLogger(__name__)

SANDBOX_KEY = "agentrl.sandbox"
RUN_KEY = "agentrl.run"
OWNER_KEY = "agentrl.owner"
PROCESS_KEY = "agentrl.process"

_run_ids: dict[int, str] = {}


def process_run_id() -> str:
    """This process's run id: one per process (a forked child gets its own)."""
    return _run_ids.setdefault(os.getpid(), uuid.uuid4().hex)


def container_labels(run_id: str | None, owner: str | None) -> dict[str, str]:
    """The labels of one new container."""
    return {
        SANDBOX_KEY: "docker",
        RUN_KEY: run_id or process_run_id(),
        OWNER_KEY: owner or socket.gethostname(),
        PROCESS_KEY: process_label(),
    }


def stale(labels: Mapping[str, str], owner: str | None) -> bool:
    """Whether a listed container is a dead process's leftover of this deployment."""
    if labels.get(SANDBOX_KEY) != "docker":
        return False
    if labels.get(OWNER_KEY) != (owner or socket.gethostname()):
        return False
    return process_alive(labels.get(PROCESS_KEY, "")) is False


async def _list(docker: Any, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
    found = await docker.containers.list(all="1", filters=json.dumps(filters))
    return [{"Id": c.id, "Labels": c["Labels"] or {}} for c in found]


async def remove_all(docker: Any, ids: list[str], why: str) -> list[str]:
    """Force-remove the containers ``ids`` (and their anonymous volumes); the ids removed."""
    from aiodocker.exceptions import DockerError

    removed = []
    for cid in ids:
        try:
            await docker.containers.container(cid).delete(force=True, v=True)
            removed.append(cid)
        except DockerError as exc:
            if exc.status == 404:
                continue
            logger.warning("could not remove docker container %s (%s): %s", cid[:12], why, exc)
    if removed:
        logger.info("removed %d docker container(s) %s", len(removed), why)
    return removed


async def sweep_run(
    docker: Any, run_id: str, owner: str | None, process: str | None = None
) -> list[str]:
    """Remove every container of run ``run_id`` of this deployment still there (only those
    ``process`` created, given one: a ``process_label``)."""
    selector = {SANDBOX_KEY: "docker", RUN_KEY: run_id, OWNER_KEY: owner or socket.gethostname()}
    if process:
        selector[PROCESS_KEY] = process
    try:
        found = await _list(docker, selector)
    except Exception as exc:
        logger.warning("the docker sweep of run %s failed: %s", run_id, exc)
        return []
    return await remove_all(docker, [c["Id"] for c in found], f"left by run {run_id}")


async def sweep_stale(docker: Any, owner: str | None) -> list[str]:
    """Remove this deployment's containers whose creating process on this host is gone."""
    try:
        found = await _list(docker, {SANDBOX_KEY: "docker"})
    except Exception as exc:
        logger.warning("the docker sweep of stale containers failed: %s", exc)
        return []
    ids = [c["Id"] for c in found if stale(c.get("Labels") or {}, owner)]
    return await remove_all(docker, ids, "left by a process that is gone")

"""Find and kill the E2B sandboxes a run created but no longer holds.

Every sandbox agentrl creates carries run labels in its metadata: ``agentrl-run`` (the
run: one id per process by default, or per stack when the stack passes ``run_id``),
``agentrl-owner`` (the deployment: ``owner``, default this host's name),
``agentrl-process`` (host, pid and start time of the creating process) and
``agentrl-boot`` (the boot's idempotency key). The provider's list API filters by
metadata, so what a lost answer created is found again:

- ``reap_boot``: after a failed start, the sandboxes created under that boot's key;
- ``sweep_run``: at the close of a run, every sandbox of the run still alive;
- ``sweep_stale``: on restart (only when asked), this deployment's sandboxes of other
  runs whose creating process is gone (on another host it cannot be checked: the owner
  label then says they are this deployment's, so they are killed).

A sandbox without ``agentrl-owner`` and ``agentrl-run`` is never touched. Every step is
best-effort (a failed listing or kill is logged, never raised), and what it missed ends
when its lifetime runs out.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from agentrl.retry import retry
from agentrl.sandboxes.base import process_alive as _process_alive
from agentrl.sandboxes.base import process_label
from agentrl.sandboxes.e2b.errors import Verdict, classify, reset_sdk_transports
from agentrl.sandboxes.e2b.options import E2BOptions

__all__ = [
    "BOOT_KEY",
    "OWNER_KEY",
    "PROCESS_KEY",
    "RUN_KEY",
    "owner_of",
    "process_label",
    "process_run_id",
    "reap_boot",
    "run_labels",
    "stale_reason",
    "sweep_run",
    "sweep_stale",
    "sweep_stale_once",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

RUN_KEY = "agentrl-run"
OWNER_KEY = "agentrl-owner"
PROCESS_KEY = "agentrl-process"
BOOT_KEY = "agentrl-boot"

#: Sandboxes asked for per list call (the API's largest page).
_PAGE_SIZE = 100
_run_ids: dict[int, str] = {}


def process_run_id() -> str:
    """This process's run id: one per process (a forked child gets its own)."""
    return _run_ids.setdefault(os.getpid(), uuid.uuid4().hex)


def owner_of(options: E2BOptions) -> str:
    """The deployment label: ``options.owner``, else this host's name."""
    return options.owner or socket.gethostname()


def run_labels(options: E2BOptions, boot_key: str) -> dict[str, str]:
    """The metadata every sandbox of this run carries."""
    return {
        RUN_KEY: options.run_id or process_run_id(),
        OWNER_KEY: owner_of(options),
        PROCESS_KEY: process_label(),
        BOOT_KEY: boot_key,
    }


def stale_reason(metadata: Mapping[str, str], options: E2BOptions) -> str | None:
    """Why a listed sandbox is an earlier run's leftover to kill, or None to leave it be."""
    run = metadata.get(RUN_KEY)
    if metadata.get(OWNER_KEY) != owner_of(options) or not run:
        return None  # not this deployment's, or not agentrl's
    if run == (options.run_id or process_run_id()):
        return None
    alive = _process_alive(metadata.get(PROCESS_KEY, ""))
    if alive:
        return None
    return "its process is gone" if alive is False else "it was created on another host"


async def _with_retries(options: E2BOptions, attempt_once: Callable[[], Awaitable[T]]) -> T:
    def transient(exc: Exception) -> bool:
        return classify(exc) is Verdict.TRANSIENT

    return await retry(
        attempt_once,
        policy=options.retry_policy,
        retryable=transient,
        on_retry=lambda *_: reset_sdk_transports(),
        rng=random.Random(),
    )


async def _list(sdk: Any, options: E2BOptions, metadata: dict[str, str]) -> list[Any]:
    """Every sandbox (running or paused) whose metadata includes ``metadata``."""
    query = sdk.SandboxQuery(metadata=metadata)
    paginator = sdk.AsyncSandbox.list(query=query, limit=_PAGE_SIZE, **options.sdk_params())
    found: list[Any] = []
    while paginator.has_next:
        found.extend(await _with_retries(options, paginator.next_items))
    return found


async def _kill(sdk: Any, options: E2BOptions, sandbox_ids: list[str], why: str) -> list[str]:
    """Kill each sandbox; the ids of those that were killed (or already gone)."""
    killed: list[str] = []
    for sandbox_id in sandbox_ids:
        kill = functools.partial(sdk.AsyncSandbox.kill, sandbox_id, **options.sdk_params())
        try:
            await _with_retries(options, kill)
        except Exception as exc:
            logger.warning("could not kill e2b sandbox %s (%s): %s", sandbox_id, why, exc)
            continue
        logger.info("killed e2b sandbox %s (%s)", sandbox_id, why)
        killed.append(sandbox_id)
    return killed


async def reap_boot(sdk: Any, options: E2BOptions, boot_key: str) -> list[str]:
    """Kill what a failed start created under ``boot_key``; the ids killed."""
    run = options.run_id or process_run_id()
    try:
        found = await _list(sdk, options, {BOOT_KEY: boot_key, RUN_KEY: run})
    except Exception as exc:
        logger.warning(
            "could not look for sandboxes created under boot key %s (%s); the run's close "
            "sweep kills them",
            boot_key,
            exc,
        )
        return []
    ids = [info.sandbox_id for info in found]
    return await _kill(sdk, options, ids, f"created under lost answers for boot {boot_key}")


async def sweep_run(sdk: Any, options: E2BOptions, run_id: str) -> list[str]:
    """Kill every sandbox of run ``run_id`` still alive; the ids killed."""
    try:
        found = await _list(sdk, options, {RUN_KEY: run_id, OWNER_KEY: owner_of(options)})
    except Exception as exc:
        logger.warning("the e2b sweep of run %s failed: %s", run_id, exc)
        return []
    ids = [info.sandbox_id for info in found]
    return await _kill(sdk, options, ids, f"left by run {run_id} at its close")


async def sweep_stale(sdk: Any, options: E2BOptions) -> list[str]:
    """Kill this deployment's sandboxes left by earlier runs (``stale_reason``); the ids."""
    try:
        found = await _list(sdk, options, {OWNER_KEY: owner_of(options)})
    except Exception as exc:
        logger.warning("the stale e2b sweep of %s failed: %s", owner_of(options), exc)
        return []
    killed: list[str] = []
    for info in found:
        reason = stale_reason(info.metadata or {}, options)
        if reason is not None:
            run = info.metadata.get(RUN_KEY)
            killed += await _kill(sdk, options, [info.sandbox_id], f"stale: run {run}, {reason}")
    return killed


_stale_swept: set[tuple[str, str | None, str | None, int]] = set()


async def sweep_stale_once(sdk: Any, options: E2BOptions) -> None:
    """``sweep_stale`` once per process and E2B target (the first creation waits for it)."""
    target = (owner_of(options), options.api_url, options.domain, hash(options.api_key))
    if target in _stale_swept:
        return
    _stale_swept.add(target)
    killed = await sweep_stale(sdk, options)
    if killed:
        logger.info("killed %d stale e2b sandbox(es) of %s", len(killed), owner_of(options))

"""The one boot loop: start a sandbox from a factory with retry, a timeout and a semaphore.

Every sandbox agentrl starts goes through a :class:`Booter`: the rollout's agent sandbox
and the grader's fresh sandbox alike, so ``boot_concurrency`` bounds grading boots too.
A failed boot (``SandboxError``, ``OSError`` or no start within ``timeout``) is retried
with a new sandbox from the factory: nothing has run in the failed one, so a retry cannot
change what happens next. Built only on the sandbox contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import attrs

from agentrl.retry import RetryPolicy, retry
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.types import Task

__all__ = ["BOOT_RETRYABLE", "BootError", "Booter", "SandboxFactory"]

logger = logging.getLogger(__name__)

#: Builds a fresh (not yet started) sandbox for a task.
SandboxFactory = Callable[[Task], Sandbox]

#: Boot failures worth a new sandbox: the backend's, the host's, and a start that hung.
BOOT_RETRYABLE: tuple[type[BaseException], ...] = (SandboxError, OSError, asyncio.TimeoutError)


class BootError(SandboxError):
    """No attempt started a sandbox; ``attempts`` says why each one failed, ``last`` is the last error."""

    def __init__(self, what: str, attempts: tuple[str, ...], last: Exception) -> None:
        super().__init__(
            f"the {what} did not boot ({len(attempts)} attempt(s)): " + "; ".join(attempts)
        )
        self.attempts = attempts
        self.last = last


@attrs.define(kw_only=True)
class Booter:
    """Starts sandboxes: ``policy`` for retries, ``timeout`` per start, ``semaphore`` shared.

    ``semaphore`` bounds how many sandboxes start at once across everything that shares
    this booter (the agent's and the grader's boots); only ``start()`` holds it.
    ``timeout`` None lets a start take as long as it takes.
    """

    policy: RetryPolicy = attrs.field(factory=lambda: RetryPolicy(attempts=3, base=2.0))
    timeout: float | None = 300.0
    semaphore: asyncio.Semaphore | None = None

    async def boot(self, factory: SandboxFactory, task: Task, *, what: str = "sandbox") -> Sandbox:
        """A started sandbox from ``factory(task)``; raises ``BootError`` when every attempt failed.

        A sandbox whose start failed (or was cancelled) is closed before the next attempt.
        """
        failures: list[str] = []

        async def attempt_once() -> Sandbox:
            try:
                return await self._start(factory, task)
            except Exception as exc:
                failures.append(f"attempt {len(failures) + 1}: {self._describe(exc)}")
                raise

        def on_retry(attempt: int, exc: Exception, delay: float) -> None:
            logger.warning(
                "%s for %s failed to boot (%s); retry %d of %d in %.1fs",
                what,
                task.instance_id,
                failures[-1],
                attempt,
                self.policy.retries,
                delay,
            )

        try:
            return await retry(
                attempt_once, policy=self.policy, retryable=BOOT_RETRYABLE, on_retry=on_retry
            )
        except Exception as exc:
            raise BootError(what, tuple(failures), exc) from exc

    def _describe(self, exc: Exception) -> str:
        detail = str(exc)
        if not detail and isinstance(exc, asyncio.TimeoutError) and self.timeout is not None:
            detail = f"no start within {self.timeout:g}s"
        return f"{type(exc).__name__}: {detail or 'no detail'}"

    async def _start(self, factory: SandboxFactory, task: Task) -> Sandbox:
        sandbox = factory(task)
        try:
            async with self.semaphore or contextlib.nullcontext():
                await asyncio.wait_for(sandbox.start(), self.timeout)
        except BaseException:
            await sandbox.aclose()
            raise
        return sandbox

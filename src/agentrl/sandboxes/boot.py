"""The one boot loop: start a sandbox from a factory with retry, a timeout and a semaphore.

Every sandbox agentrl starts goes through a :class:`Booter`: the rollout's agent sandbox
and the grader's fresh sandbox alike, so ``boot_concurrency`` bounds grading boots too.
A failed boot (``SandboxError``, ``OSError`` or no start within ``timeout``) is retried
with a new sandbox from the factory: nothing has run in the failed one, so a retry cannot
change what happens next. Built only on the sandbox contract.

Each boot has one :class:`BootKey`, current (``current_boot_key()``) while its attempts
run: a backend whose provider creates idempotently sends it with every create, so a
re-attempt after a lost answer gets back the sandbox the provider already made.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import uuid
from collections.abc import Callable

import attrs

from agentrl.retry import RetryPolicy, retry
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.types import Task

__all__ = [
    "BOOT_RETRYABLE",
    "BootError",
    "BootKey",
    "Booter",
    "PrewarmedBooter",
    "SandboxFactory",
    "current_boot_key",
]

logger = logging.getLogger(__name__)

#: Builds a fresh (not yet started) sandbox for a task.
SandboxFactory = Callable[[Task], Sandbox]

#: Boot failures worth a new sandbox: the backend's, the host's, and a start that hung.
BOOT_RETRYABLE: tuple[type[BaseException], ...] = (SandboxError, OSError, asyncio.TimeoutError)


@attrs.define(kw_only=True)
class BootKey:
    """One boot's identity across all its attempts: what an idempotent create sends.

    ``value`` stays the same from attempt to attempt; a backend that killed the sandbox
    created under it calls ``retire`` so the next attempt creates a fresh one instead of
    getting the killed one back.
    """

    boot_id: str = attrs.field(factory=lambda: str(uuid.uuid4()))
    generation: int = 0

    @property
    def value(self) -> str:
        """The key (lowercase letters, digits and hyphens)."""
        return f"{self.boot_id}-{self.generation}" if self.generation else self.boot_id

    def retire(self) -> None:
        """Move to a new key: what the current one created is gone."""
        self.generation += 1


_current_boot_key: contextvars.ContextVar[BootKey | None] = contextvars.ContextVar(
    "agentrl_boot_key", default=None
)


def current_boot_key() -> BootKey | None:
    """The key of the boot under way in this context (None outside ``Booter.boot``)."""
    return _current_boot_key.get()


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
        Every attempt runs under this boot's one ``BootKey`` (``current_boot_key()``).
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

        token = _current_boot_key.set(BootKey())
        try:
            return await retry(
                attempt_once, policy=self.policy, retryable=BOOT_RETRYABLE, on_retry=on_retry
            )
        except Exception as exc:
            raise BootError(what, tuple(failures), exc) from exc
        finally:
            _current_boot_key.reset(token)

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


@attrs.define(kw_only=True)
class PrewarmedBooter(Booter):
    """A ``Booter`` whose first boot hands out the sandbox ``prewarm`` is booting (or
    booted); later boots, and a prewarm that failed, boot as usual."""

    prewarm: asyncio.Future[Sandbox] | None = None

    async def boot(self, factory: SandboxFactory, task: Task, *, what: str = "sandbox") -> Sandbox:
        future, self.prewarm = self.prewarm, None
        if future is not None:
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:
                self.prewarm = future  # the rollout's cleanup closes it
                raise
            if not future.cancelled() and future.exception() is None:
                return future.result()
            logger.info(
                "the prewarmed %s for %s did not boot; booting another", what, task.instance_id
            )
        return await super().boot(factory, task, what=what)

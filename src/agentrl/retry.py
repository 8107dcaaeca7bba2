"""One retry policy for everything agentrl re-tries: sandbox boots, npm installs, e2b calls.

The delay after failed attempt ``n`` (1-based) is drawn from
``[ceiling * (1 - jitter), ceiling]`` with ``ceiling = min(cap, base * 2 ** (n - 1))``:
exponential, capped, and jittered so that many clients failing together do not retry
together. ``jitter=1`` (the default) is "full jitter", ``uniform(0, ceiling)``;
``jitter=0`` waits exactly the ceiling.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

__all__ = ["OnRetry", "RetryPolicy", "Retryable", "retry"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: What may be retried: exception classes, or a predicate on the exception.
Retryable = type[BaseException] | tuple[type[BaseException], ...] | Callable[[Exception], bool]
#: Called before each retry's sleep with (the attempt that failed, its error, the delay).
OnRetry = Callable[[int, Exception, float], None]


def _at_least(minimum: float) -> Callable[[Any, attrs.Attribute, float], None]:
    def check(instance: Any, attribute: attrs.Attribute, value: float) -> None:
        if value < minimum:
            raise ValueError(f"RetryPolicy.{attribute.name} must be >= {minimum}, got {value!r}")

    return check


def _fraction(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"RetryPolicy.jitter must be between 0 and 1, got {value!r}")


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How often to try (``attempts`` in all, the first included) and how long to wait between.

    ``base`` is the ceiling of the first delay in seconds; each later ceiling doubles, up
    to ``cap``. ``jitter`` is the fraction of the ceiling that is random.
    """

    attempts: int = attrs.field(default=3, validator=_at_least(1))
    base: float = attrs.field(default=1.0, validator=_at_least(0.0))
    cap: float = attrs.field(default=30.0, validator=_at_least(0.0))
    jitter: float = attrs.field(default=1.0, validator=_fraction)

    @classmethod
    def from_retries(cls, retries: int, **fields: Any) -> RetryPolicy:
        """The policy for ``retries`` re-tries after the first attempt (``retries + 1`` in all)."""
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries!r}")
        return cls(attempts=retries + 1, **fields)

    @property
    def retries(self) -> int:
        """How many re-tries follow a failed first attempt."""
        return self.attempts - 1

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed attempt ``attempt`` (1-based)."""
        return min(self.cap, self.base * 2 ** max(attempt - 1, 0))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based), before the next one."""
        ceiling = self.ceiling(attempt)
        draw = (rng or random).random()
        return ceiling * (1.0 - self.jitter + self.jitter * draw)


def _is_retryable(retryable: Retryable, exc: Exception) -> bool:
    if isinstance(retryable, type | tuple):
        return isinstance(exc, retryable)
    return bool(retryable(exc))


async def retry(
    operation: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    retryable: Retryable,
    on_retry: OnRetry | None = None,
    rng: random.Random | None = None,
) -> T:
    """Await ``operation()`` until it succeeds, re-trying retryable errors by ``policy``.

    A retryable error is followed by ``on_retry`` (if given) and a sleep of
    ``policy.delay(attempt)``, then the next attempt; the last attempt's error, and any
    error that is not retryable, is raised unchanged. Cancellation is never retried.
    """
    attempt = 1
    while True:
        try:
            return await operation()
        except Exception as exc:
            if attempt >= policy.attempts or not _is_retryable(retryable, exc):
                raise
            delay = policy.delay(attempt, rng)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            else:
                logger.debug("attempt %d failed (%r); retrying in %.2fs", attempt, exc, delay)
            await asyncio.sleep(delay)
            attempt += 1

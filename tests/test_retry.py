"""The one retry policy: attempts, capped jittered delays, what is and is not retried."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentrl.retry import RetryPolicy, retry


def test_delays_double_from_base_up_to_the_cap():
    """Ceiling n is min(cap, base * 2**(n-1)); full jitter draws each delay from [0, ceiling]."""
    policy = RetryPolicy(attempts=7, base=0.5, cap=3.0)
    assert [policy.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    rng = random.Random(11)
    delays = [policy.delay(n, rng) for n in range(1, 7)]
    assert all(0.0 <= d <= policy.ceiling(n) for n, d in enumerate(delays, start=1))
    assert len(set(delays)) == 6  # jittered: no two retries wait alike


def test_jitter_is_the_random_fraction_of_the_ceiling():
    """jitter=0 waits exactly the ceiling; jitter=0.5 never less than half of it."""
    assert RetryPolicy(base=2.0, jitter=0.0).delay(2) == 4.0
    half = RetryPolicy(base=2.0, jitter=0.5)
    rng = random.Random(5)
    assert all(2.0 <= half.delay(2, rng) <= 4.0 for _ in range(200))


def test_from_retries_counts_the_first_attempt_apart():
    """``from_retries(2)`` is three attempts in all; bad values name the field."""
    policy = RetryPolicy.from_retries(2, base=0.1)
    assert (policy.attempts, policy.retries, policy.base) == (3, 2, 0.1)
    with pytest.raises(ValueError, match="retries must be >= 0"):
        RetryPolicy.from_retries(-1)
    with pytest.raises(ValueError, match=r"RetryPolicy\.attempts must be >= 1"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match=r"RetryPolicy\.jitter must be between 0 and 1"):
        RetryPolicy(jitter=1.5)


async def test_retryable_errors_are_retried_until_the_attempts_run_out():
    """Every attempt fails retryably: ``attempts`` calls, ``on_retry`` before each retry with
    the capped delay, and the last error is raised unchanged."""
    calls: list[int] = []
    retries: list[tuple[int, str, float]] = []

    async def always_fails() -> None:
        calls.append(len(calls) + 1)
        raise OSError(f"down {len(calls)}")

    policy = RetryPolicy(attempts=4, base=0.001, cap=0.002)
    with pytest.raises(OSError, match="down 4"):
        await retry(
            always_fails,
            policy=policy,
            retryable=OSError,
            on_retry=lambda n, exc, delay: retries.append((n, str(exc), delay)),
        )
    assert calls == [1, 2, 3, 4]
    assert [(n, error) for n, error, _ in retries] == [(1, "down 1"), (2, "down 2"), (3, "down 3")]
    assert all(0.0 <= delay <= policy.ceiling(n) <= 0.002 for n, _, delay in retries)


async def test_success_after_a_retry_returns_the_value():
    """A transient failure, then success: the value comes back after one retry."""
    outcomes = [ConnectionResetError("reset"), "ok"]

    async def flaky() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert await retry(flaky, policy=RetryPolicy(base=0.001), retryable=(OSError,)) == "ok"
    assert outcomes == []


async def test_an_error_that_is_not_retryable_raises_at_once():
    """A non-retryable error (by class or by predicate) is raised after one call, no retry."""
    calls = []

    async def broken() -> None:
        calls.append(1)
        raise ValueError("bad request")

    retried = []
    with pytest.raises(ValueError, match="bad request"):
        await retry(
            broken,
            policy=RetryPolicy(attempts=5, base=0.001),
            retryable=OSError,
            on_retry=lambda *args: retried.append(args),
        )
    with pytest.raises(ValueError, match="bad request"):
        await retry(
            broken,
            policy=RetryPolicy(attempts=5, base=0.001),
            retryable=lambda exc: "transient" in str(exc),
        )
    assert calls == [1, 1] and retried == []


async def test_cancellation_is_never_retried():
    """A cancelled operation propagates CancelledError on the first attempt."""
    calls = []

    async def cancelled() -> None:
        calls.append(1)
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await retry(cancelled, policy=RetryPolicy(attempts=3, base=0.001), retryable=BaseException)
    assert calls == [1]

"""Generations that survive an engine abort: each one is continued from what was sampled.

An engine aborts a generation when its trainer asks (a weight update, slime's abort of an
over-sampled batch): the generation comes back with ``finish_reason`` ``"abort"`` and the
ids and log-probs sampled before it. Shown to the client as it is, that is half an
answer (half a tool call, as text) and a real CLI ends its session. While the rollout
still wants the turn (``wanted()``: its session is not closed), :func:`generate` continues
it instead: the prompt and the output so far go back to the engine under a fresh rid,
with ``max_new_tokens`` lowered by what was already sampled (nothing left: the turn
finishes with ``length``). The parts are joined into one :class:`Generation`: every id
and log-prob exactly as sampled, the last attempt's finish reason. Each resume point is
kept for the turn's trajectory metadata (``engine_resumes``)::

    [{"at": 37, "weight_version": "12"}]   # output tokens before it; the resumed attempt's

A turn the engine aborts ``max_aborts`` times in a row fails with
:class:`~agentrl.engines.base.EngineAbortedError`; ``max_aborts=0`` continues nothing (an
aborted generation is returned as it is). Between attempts the turn waits a short jittered
backoff (:data:`ABORT_BACKOFF`, at most a few seconds in all): an engine being drained —
slime aborts every request until its servers are idle — aborts a continuation sent at once
again, and meanwhile the rollout that is being cancelled closes its session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from agentrl.engines.base import EngineAbortedError, Generation
from agentrl.retry import RetryPolicy

__all__ = [
    "ABORT_BACKOFF",
    "DEFAULT_MAX_ENGINE_ABORTS",
    "Continued",
    "check_max_engine_aborts",
    "generate",
    "join",
]

logger = logging.getLogger(__name__)

#: Engine aborts in a row that fail a turn (each one before that is continued).
DEFAULT_MAX_ENGINE_ABORTS = 8
#: The wait before continuing after abort ``n``: up to 0.05 s doubling to 2 s, fully
#: jittered; the seven waits before an eighth abort take 2.6 s on average, at most 5.2 s.
ABORT_BACKOFF = RetryPolicy(base=0.05, cap=2.0)
#: Meta taken from the first attempt (the rest describe the last): its prompt is the turn's.
_FIRST_ATTEMPT_META = ("prompt_tokens", "cached_tokens")

#: One engine call: ``(input ids, sampling parameters) -> Generation``.
Attempt = Callable[[Sequence[int], Mapping[str, Any]], Awaitable[Generation]]


def check_max_engine_aborts(value: int) -> int:
    """``value`` when it is a whole number of aborts (0 or more); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"max_engine_aborts: expected an integer >= 0 (0: continue no aborted "
            f"generation), got {value!r}"
        )
    return value


@attrs.frozen(kw_only=True)
class Continued:
    """A turn's whole generation and where it was resumed after an engine abort."""

    generation: Generation
    #: ``{"at": output tokens before the resume, "weight_version": …}`` per resume; the
    #: weight version is the resumed attempt's, when the engine reported one.
    resumes: tuple[dict[str, Any], ...] = ()


def join(parts: Sequence[Generation], finish_reason: str | None = None) -> Generation:
    """One generation from consecutive attempts: ids and log-probs in order, the last
    attempt's finish reason (or ``finish_reason``), its meta with the first attempt's
    prompt counts, the summed latency and the total completion tokens."""
    last = parts[-1]
    if len(parts) == 1 and finish_reason is None:
        return last
    meta = dict(last.meta)
    for key in _FIRST_ATTEMPT_META:
        meta.pop(key, None)
        if key in parts[0].meta:
            meta[key] = parts[0].meta[key]
    latencies = [part.meta["latency_s"] for part in parts if "latency_s" in part.meta]
    if latencies:
        meta["latency_s"] = sum(latencies)
    output_ids = [token for part in parts for token in part.output_ids]
    if "completion_tokens" in meta:
        meta["completion_tokens"] = len(output_ids)
    return Generation(
        output_ids=output_ids,
        logprobs=[logprob for part in parts for logprob in part.logprobs],
        finish_reason=finish_reason or last.finish_reason,
        meta=meta,
    )


async def generate(
    attempt: Attempt,
    prompt_ids: Sequence[int],
    params: Mapping[str, Any],
    *,
    wanted: Callable[[], bool],
    max_aborts: int = DEFAULT_MAX_ENGINE_ABORTS,
    backoff: RetryPolicy = ABORT_BACKOFF,
    what: str = "a turn",
) -> Continued:
    """The whole generation of ``prompt_ids``, each engine abort continued while ``wanted()``.

    ``params["max_new_tokens"]`` is the turn's budget, all attempts together. Raises
    :class:`EngineAbortedError` at the ``max_aborts``-th abort in a row; ``what`` names
    the turn in the log and the error.
    """
    parts: list[Generation] = []
    resumes: list[dict[str, Any]] = []
    sampled: list[int] = []
    budget = params.get("max_new_tokens")
    while True:
        ids, sent = prompt_ids, params
        if parts:
            ids = [*prompt_ids, *sampled]
            if budget is not None:
                sent = {**params, "max_new_tokens": budget - len(sampled)}
        generation = await attempt(ids, sent)
        parts.append(generation)
        sampled.extend(generation.output_ids)
        if len(parts) > 1 and "weight_version" in generation.meta:
            resumes[-1]["weight_version"] = generation.meta["weight_version"]
        if generation.finish_reason != "abort" or max_aborts == 0 or not wanted():
            break
        if budget is not None and len(sampled) >= budget:
            logger.info("%s: aborted with its whole budget sampled; finishing with 'length'", what)
            return Continued(generation=join(parts, "length"), resumes=tuple(resumes))
        aborts = len(parts)
        if aborts >= max_aborts:
            raise EngineAbortedError(
                f"the inference engine aborted {what}'s generation {aborts} times in a row "
                f"(max_engine_aborts={max_aborts}) after {len(sampled)} tokens",
                aborts=aborts,
                sampled=len(sampled),
            )
        delay = backoff.delay(aborts)
        logger.info(
            "%s: the engine aborted the generation after %d tokens (abort %d in a row; "
            "%d fail the turn); continuing it in %.2fs",
            what,
            len(sampled),
            aborts,
            max_aborts,
            delay,
        )
        await asyncio.sleep(delay)
        if not wanted():
            break
        resumes.append({"at": len(sampled)})
    return Continued(generation=join(parts), resumes=tuple(resumes))

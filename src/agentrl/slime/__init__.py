"""slime integration: a custom generate function and fan-out-aware reward helpers.

Point slime at them with::

    --custom-generate-function-path agentrl.slime.generate
    --custom-reward-post-process-path agentrl.slime.reward_post_process
    --dynamic-sampling-filter-path agentrl.slime.check_reward_nonzero_std   # optional

``generate`` runs one coding-agent rollout (sandbox, agent CLI, grading) per slime sample
and returns one slime ``Sample`` per trajectory chain, all sharing ``rollout_id``. The
agent side is configured with ``AGENTRL_*`` environment variables (see
``agentrl.slime.config.ENV_VARS`` and docs/slime.md); the model side comes from slime's
``args``. Importing this module imports neither slime nor torch: samples are built from
the incoming sample's own class.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from agentrl.slime.config import ENV_VARS, SlimeConfig, SlimeConfigError
from agentrl.slime.rewards import (
    check_reward_nonzero_std,
    check_reward_nonzero_std_with_fallback,
    normalize_rewards,
)
from agentrl.slime.samples import (
    abort_placeholder,
    eval_placeholder,
    non_generation_seconds,
    result_metadata,
    session_id_of,
    task_row,
    to_slime_samples,
)
from agentrl.slime.service import RolloutOutput, get_service, shutdown_service

__all__ = [
    "ENV_VARS",
    "SlimeConfig",
    "SlimeConfigError",
    "check_reward_nonzero_std",
    "check_reward_nonzero_std_with_fallback",
    "generate",
    "reward_post_process",
    "shutdown_service",
]

logger = logging.getLogger(__name__)

#: Extra seconds past the rollout guard before slime's side gives up on a rollout.
_GUARD_SLACK = 60.0


def _slime_aborting(args: Any) -> bool:
    """Whether slime's rollout loop has started aborting the batch (``GenerateState.aborted``).

    Reads the already-created singleton without importing slime or creating the state.
    """
    module = sys.modules.get("slime.rollout.sglang_rollout")
    state_cls = getattr(module, "GenerateState", None) if module is not None else None
    if state_cls is None:
        return False
    instances = getattr(state_cls, "_instances", None) or {}
    state = instances.get(state_cls) if isinstance(instances, dict) else None
    return bool(getattr(state, "aborted", False))


def _instance_hint(sample: Any) -> str:
    metadata = getattr(sample, "metadata", None) or {}
    for value in (
        metadata.get("instance_id"),
        (metadata.get("remote_env_info") or {}).get("instance_id")
        if isinstance(metadata.get("remote_env_info"), dict)
        else None,
        getattr(sample, "label", None),
    ):
        if isinstance(value, str) and value and len(value) < 256:
            return value
    return f"sample-{getattr(sample, 'index', None)}"


async def generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> list:
    """Run one agent rollout for ``sample``; always a non-empty list of slime samples.

    Training: one sample per trajectory chain (sub-agents and compaction fork chains),
    each with the rollout's reward, sharing ``rollout_id`` (the incoming ``rollout_id``,
    else ``index``). Infra and grader failures and aborts: one untrained ABORTED
    placeholder (``remove_sample``, reward 0.0, ``metadata["abort_reason"]``).
    Evaluation: one untrained COMPLETED sample whose ``reward`` is the score.
    ``sampling_params`` is copied, never changed. Misconfiguration raises
    ``SlimeConfigError`` naming what to set.
    """
    service = get_service(args)
    await asyncio.wrap_future(service.ready)
    config = service.config
    instance_hint = _instance_hint(sample)
    if _slime_aborting(args):
        return abort_placeholder(sample, "aborted", {"instance_id": instance_hint})

    session_id = session_id_of(sample, instance_hint)
    started = time.monotonic()
    future = asyncio.wrap_future(
        service.submit(
            session_id,
            service.rollout(
                task_row(sample),
                evaluation=bool(evaluation),
                sampling_params=copy.deepcopy(dict(sampling_params or {})),
                session_id=session_id,
                fallback_instance_id=instance_hint,
            ),
        )
    )
    deadline = asyncio.get_running_loop().time() + config.rollout_guard + _GUARD_SLACK
    stop_reason: str | None = None
    try:
        while not future.done():
            await asyncio.wait({future}, timeout=config.abort_poll_interval)
            if future.done():
                break
            if _slime_aborting(args):
                stop_reason = "aborted"
            elif service.engine_aborted(session_id):
                stop_reason = "engine_abort"
            elif asyncio.get_running_loop().time() > deadline:
                stop_reason = "wall_clock_timeout"
            else:
                continue
            # Cancelling closes the session (no new engine calls) and the sandboxes; wait a
            # bounded time for that so no request of ours outlives slime's abort.
            service.cancel(session_id)
            await asyncio.wait({future}, timeout=config.drain_timeout)
            break
    except asyncio.CancelledError:
        service.cancel(session_id)
        raise

    where = {"instance_id": instance_hint, "session_id": session_id}
    if stop_reason is not None:
        return abort_placeholder(sample, stop_reason, where)
    if future.cancelled():
        return abort_placeholder(sample, "cancelled", where)
    exc = future.exception()
    if isinstance(exc, SlimeConfigError):
        raise exc
    if exc is not None:
        logger.error("rollout %s failed inside agentrl", instance_hint, exc_info=exc)
        return abort_placeholder(
            sample, f"exception:{type(exc).__name__}", {**where, "error": str(exc)[:2000]}
        )
    return _convert(sample, future.result(), session_id, bool(evaluation), started)


def _convert(
    sample: Any, out: RolloutOutput, session_id: str, evaluation: bool, started: float
) -> list:
    if out.abort_reason is not None:
        where = {"instance_id": out.instance_id, "session_id": session_id}
        if out.error:
            where["error"] = out.error
        return abort_placeholder(sample, out.abort_reason, where)
    result = out.result
    metadata = result_metadata(result, session_id=session_id)
    if out.engine_aborted:
        return abort_placeholder(sample, "engine_abort", metadata)
    if result.remove_sample:
        return abort_placeholder(sample, metadata["outcome"], metadata)
    if evaluation:
        return eval_placeholder(sample, float(result.reward), metadata)
    samples = to_slime_samples(
        sample,
        result.samples,
        metadata=metadata,
        responses=out.responses,
        non_generation_time=non_generation_seconds(result),
    )
    if not samples:
        return abort_placeholder(sample, "no_trainable_samples", metadata)
    logger.info(
        "rollout %s: outcome=%s reward=%.3f chains=%d turns=%s exit=%s %.1fs",
        out.instance_id,
        metadata["outcome"],
        metadata["reward"],
        len(samples),
        metadata["rollout_turns"],
        metadata["agent_exit_code"],
        time.monotonic() - started,
    )
    return samples


def reward_post_process(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """``--custom-reward-post-process-path``: GRPO-style normalisation per ``group_index``.

    Returns ``(raw_rewards, rewards)`` in ``samples`` order, as slime's
    ``_post_process_rewards`` does. Statistics are taken over rollouts (a rollout that
    fanned out counts once) and aborted placeholders are left out of them.
    """
    return normalize_rewards(args, samples)

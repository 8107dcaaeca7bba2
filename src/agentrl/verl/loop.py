"""verl's ``agentrl`` agent loop: one agentrl rollout per dataset row, served by verl.

verl imports this module when ``agent_loop_config_path`` names it (``_target_:
agentrl.verl.loop.AgentrlAgentLoop``) and builds one ``AgentrlAgentLoop`` per row. Each
agent-loop worker process keeps one rollout ``Stack`` (middleware, sandboxes, harness,
grader) on its event loop, started by the first row; its engine is a ``VerlEngine`` over
the worker's ``server_manager``, so verl keeps its servers, weight syncs and load
balancing. ``run`` parses the row's task, calls ``agentrl.rollout.run_rollout`` (the path
``agentrl rollout`` and ``agentrl.slime`` use) and returns a token-exact
``AgentLoopOutput`` (``agentrl.verl.outputs`` says what maps how).
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from agentrl.verl import SUPPORTED_VERL
from agentrl.verl.engine import VerlEngine
from agentrl.verl.options import VerlLoopConfigError, VerlLoopOptions
from agentrl.verl.outputs import excluded_output, rollout_output

__all__ = ["AgentrlAgentLoop", "close_stacks"]

logger = logging.getLogger(__name__)

#: The constructor arguments verl passes to every agent loop (``AgentLoopWorker``).
_BASE_KWARGS = (
    "trainer_config",
    "server_manager",
    "tokenizer",
    "processor",
    "dataset_cls",
    "data_config",
    "hf_model_type",
)

#: Keys verl's hydra call adds beside the YAML entry's own (the base class takes them).
_VERL_KWARGS = ("name", "tools")


class _WorkerStack:
    """The rollout stack of one verl worker's event loop, started by its first row."""

    def __init__(self, options: VerlLoopOptions, engine: VerlEngine, tokenizer: str, context: int):
        from agentrl.rollout.stack import Stack, StackOptions

        self.options, self.engine = options, engine
        self.semaphore = (
            asyncio.Semaphore(options.max_concurrent_rollouts)
            if options.max_concurrent_rollouts
            else None
        )
        self.stack = Stack(
            StackOptions(
                harness=options.harness,
                sandbox=options.sandbox,
                grader=options.grader,
                engine="verl",
                engine_instance=engine,
                tokenizer=tokenizer,
                tool_parser=options.tool_parser,
                reasoning_parser=options.reasoning_parser,
                prompt_mode=options.prompt_mode,
                harness_options=dict(options.harness_options),
                sandbox_options=dict(options.sandbox_options),
                host_python=False,
                unix_path=options.unix_socket,
                bind_host=options.bind_host,
                port=options.port,
                public_host=_public_host(options.public_host),
                max_context_tokens=context,
                fork_threshold_tokens=options.fork_threshold_tokens,
                max_engine_aborts=options.max_engine_aborts,
                boot_concurrency=options.boot_concurrency,
                rollout=dict(options.rollout),
            )
        )
        self.grader: Any = None
        self.started = asyncio.Event()
        self.failed: BaseException | None = None

    async def start(self) -> None:
        try:
            await self.stack.__aenter__()
            self.grader = self.stack.grader
        except BaseException as exc:
            self.failed = exc
            raise
        finally:
            self.started.set()


#: One stack per (event loop, server manager): verl runs each worker on one loop.
_stacks: dict[tuple[int, int], _WorkerStack] = {}


async def close_stacks() -> None:
    """Close the stacks started on the running loop (tests; a worker's exit closes them too)."""
    loop_id = id(asyncio.get_running_loop())
    for key in [key for key in _stacks if key[0] == loop_id]:
        worker = _stacks.pop(key)
        await worker.stack.aclose()


@register("agentrl")
class AgentrlAgentLoop(AgentLoopBase):
    """Runs one coding-agent rollout per row and returns it as a verl ``AgentLoopOutput``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k not in _BASE_KWARGS}
        for key in _VERL_KWARGS:
            options.pop(key, None)
        super().__init__(*args, **kwargs)
        _check_verl_version()
        self.options = VerlLoopOptions.from_mapping(options)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    def _tokenizer_path(self) -> str:
        path = self.options.tokenizer or self.config.actor_rollout_ref.model.path
        if not path:
            raise VerlLoopConfigError(
                "no tokenizer: set actor_rollout_ref.model.path (verl's model) or the agent "
                "loop's `tokenizer` option to a local Hugging Face directory"
            )
        return str(path)

    async def _worker_stack(self) -> _WorkerStack:
        key = (id(asyncio.get_running_loop()), id(self.server_manager))
        worker = _stacks.get(key)
        if worker is None:
            worker = _stacks[key] = _WorkerStack(
                self.options,
                VerlEngine(self.server_manager, eos_token_ids=_eos_ids(self.tokenizer)),
                self._tokenizer_path(),
                self.prompt_length + self.response_length,
            )
            await worker.start()
        await worker.started.wait()
        if worker.failed is not None:
            raise VerlLoopConfigError(
                f"the agentrl rollout stack failed to start: {worker.failed}"
            ) from worker.failed
        return worker

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One rollout of the row's task; an excluded (untrained) output when it cannot train."""
        worker = await self._worker_stack()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        grader = worker.grader
        try:
            tasks_dir = pathlib.Path(self.options.tasks_dir) if self.options.tasks_dir else None
            task = grader.resolve_paths(grader.parse_task(self.options.task_row(kwargs)), tasks_dir)
        except (VerlLoopConfigError, ValueError, KeyError, TypeError) as exc:
            fields = excluded_output(
                "invalid_task",
                pad_token_id=pad,
                facts={"agentrl_error": f"{type(exc).__name__}: {exc}"[:2000]},
            )
            return AgentLoopOutput(metrics=AgentLoopMetrics(), **fields)
        reason = await asyncio.to_thread(grader.check, task)
        if reason:
            fields = excluded_output(
                f"unevaluable:{reason}",
                pad_token_id=pad,
                facts={"agentrl_instance_id": task.instance_id},
            )
            return AgentLoopOutput(metrics=AgentLoopMetrics(), **fields)
        session_id = f"verl-{task.instance_id[:64]}-{uuid.uuid4().hex[:12]}"
        result = await self._rollout(worker, task, grader, sampling_params, session_id)
        fields = rollout_output(
            result,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            pad_token_id=pad,
            steps=worker.engine.pop_steps(session_id),
        )
        return AgentLoopOutput(metrics=_metrics(result), **fields)

    async def _rollout(self, worker, task, grader, sampling_params, session_id):
        from agentrl.rollout import run_rollout

        stack = worker.stack
        sampling = {k: v for k, v in sampling_params.items() if k != "logprobs"}
        call = run_rollout(
            task,
            harness=stack.harness,
            grader=grader,
            sandbox_factory=stack.sandbox_factory,
            middleware=stack.middleware,
            config=stack.rollout_config,
            sampling_params=sampling,
            session_id=session_id,
            boot_semaphore=stack.boot_semaphore,
        )
        if worker.semaphore is None:
            return await call
        async with worker.semaphore:
            return await call


def _check_verl_version() -> None:
    """Warn once when the running verl is not a version this loop is tested against."""
    global _version_checked
    if _version_checked:
        return
    _version_checked = True
    from importlib.metadata import PackageNotFoundError, version

    try:
        running = version("verl")
    except PackageNotFoundError:
        running = "unknown"
    if running not in SUPPORTED_VERL:
        logger.warning(
            "verl %s: agentrl's agent loop is tested against verl %s; AgentLoopOutput and the "
            "server manager's generate contract may differ (install agentrl[verl])",
            running,
            ", ".join(SUPPORTED_VERL),
        )


_version_checked = False


def _public_host(configured: str | None) -> str | None:
    """The address sandboxes dial: as configured, or (``auto``) this Ray node's address.

    verl places agent-loop workers on any node, so one config serves them all with ``auto``.
    """
    if configured != "auto":
        return configured
    import ray

    return str(ray.util.get_node_ip_address())


def _eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's end-of-sequence id(s) (an int, a list, or None)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(t) for t in eos) if isinstance(eos, list | tuple) else (int(eos),)


def _metrics(result: Any) -> AgentLoopMetrics:
    """verl's timing metrics: engine seconds as ``generate_sequences``, the rest as tool time."""
    engine = sum(turn.engine_seconds or 0.0 for turn in result.turn_facts)
    total = float(result.timings.get("total", 0.0))
    return AgentLoopMetrics(generate_sequences=engine, tool_calls=max(0.0, total - engine))

"""TRL's ``rollout_func`` over agentrl rollouts: ``GRPOTrainer(..., rollout_func=AgentrlRollouts(...))``.

TRL calls ``rollout_func(prompts, trainer)`` once per generation batch, with each prompt
already repeated ``num_generations`` times. Each prompt here is a task row (the JSON
object a grader parses, as a string or a mapping); every entry runs one real agentrl
rollout: a sandbox, the harness, the middleware, grading in a fresh sandbox. The engine
is the embedded ``transformers`` engine over ``trainer.model`` itself
(``TransformersEngine.from_model``: eval mode, no gradients, concurrent turns decoded as
one batch), so every rollout is on-policy with no weight sync. The rollout ``Stack``
lives on a background event loop started by the first call and kept for the run.

The rows are token-exact (``agentrl.trl.outputs``): ``prompt_ids``, ``completion_ids``,
``env_mask`` (agentrl's loss mask), ``logprobs`` (the sampled ones) and the grader's
reward and outcome as extra keys, read by :func:`agentrl.trl.rewards.grader_reward`.
Sampling follows the trainer's own arguments (``temperature``, ``top_p``, ``top_k``,
``min_p``), so TRL's recomputed log-probs are those of the distribution that sampled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from agentrl.trl.outputs import ROW_KEYS, rollout_row

__all__ = ["AgentrlRollouts", "TrlRolloutOptions"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class TrlRolloutOptions:
    """The agent side of a TRL run: which harness, sandbox and grader, and their budgets."""

    harness: str = "tiny_agent"
    sandbox: str = "local"
    grader: str = "scaleswe"
    tool_parser: str | None = "hermes"
    #: A local tokenizer directory; default: the trained model's ``name_or_path``.
    tokenizer: str | None = None
    harness_options: dict[str, Any] = attrs.field(factory=dict)
    sandbox_options: dict[str, Any] = attrs.field(factory=dict)
    #: ``RolloutConfig`` fields (budgets, ``max_turns``, ``prompt_template``).
    rollout: dict[str, Any] = attrs.field(factory=dict)
    #: Tokens one turn may sample (default: the trainer's ``max_completion_length``).
    max_new_tokens: int | None = None
    #: The session's context cap (prompt plus every turn), so a sample always fits.
    max_context_tokens: int = 4096
    #: Completion tokens a row may keep (the end is cut, ``agentrl_truncated``); None: all.
    max_completion_tokens: int | None = None
    #: Concurrent rollouts (0: the whole generation batch at once).
    max_concurrent_rollouts: int = 0
    boot_concurrency: int = 16
    #: Turns decoded together by the embedded engine, and how long the first one waits.
    batch_size: int = 64
    batch_wait: float = 0.25
    #: A directory to write every rollout to (``agentrl view`` opens it), or None.
    run_dir: str | None = None


class AgentrlRollouts:
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` (see the module docstring).

    ``on_results(step, results)`` (optional) sees each call's ``RolloutResult``s in order.
    Call :meth:`close` when training ends (it stops the stack and its event loop).
    """

    def __init__(
        self,
        options: TrlRolloutOptions | None = None,
        *,
        on_results: Callable[[int, list[Any]], None] | None = None,
    ) -> None:
        self.options = options or TrlRolloutOptions()
        self.on_results = on_results
        self.stack: Any = None
        self.runner: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._calls = 0
        self._pad_id = 0

    # -- TRL's entry point ---------------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """One rollout per prompt entry; TRL's columns (``ROW_KEYS``), one value per entry."""
        if self._loop is None:
            self._start(trainer)
        assert self._loop is not None
        step = int(getattr(getattr(trainer, "state", None), "global_step", self._calls))
        rows = [_task_row(prompt) for prompt in prompts]
        future = asyncio.run_coroutine_threadsafe(
            self._rollouts(rows, self._calls, _sampling(trainer.args, self.options)), self._loop
        )
        results = future.result()
        self._calls += 1
        if self.on_results is not None:
            self.on_results(step, results)
        columns: dict[str, list[Any]] = {key: [] for key in ROW_KEYS}
        for result in results:
            row = rollout_row(
                result,
                pad_token_id=self._pad_id,
                max_completion_tokens=self.options.max_completion_tokens,
            )
            for key in ROW_KEYS:
                columns[key].append(row[key])
        return columns

    # -- the stack on its own loop ---------------------------------------------------------
    def _start(self, trainer: Any) -> None:
        from agentrl.engines.transformers import TransformersEngine
        from agentrl.rollout.stack import Stack, StackOptions

        o = self.options
        args = trainer.args
        if getattr(args, "bf16", False) or getattr(args, "fp16", False):
            logger.warning(
                "agentrl.trl: the trainer autocasts to %s (GRPOConfig's default bf16=True), so "
                "its log-probs of the sampled tokens differ from the engine's (up to 0.65 nat "
                "seen on SmolLM2-135M); pass bf16=False for float32 on-policy training on CPU",
                "bfloat16" if getattr(args, "bf16", False) else "float16",
            )
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = o.tokenizer or str(getattr(model, "name_or_path", "") or "")
        if not tokenizer:
            raise ValueError(
                "agentrl.trl: no tokenizer directory; pass TrlRolloutOptions(tokenizer=...)"
            )
        processing = getattr(trainer, "processing_class", None)
        pad = getattr(processing, "pad_token_id", None)
        self._pad_id = int(pad) if pad is not None else 0
        engine = TransformersEngine.from_model(
            model, batch_size=o.batch_size, batch_wait=o.batch_wait
        )
        self.stack = Stack(
            StackOptions(
                harness=o.harness,
                sandbox=o.sandbox,
                grader=o.grader,
                engine="transformers",
                engine_instance=engine,
                tokenizer=tokenizer,
                tool_parser=o.tool_parser,
                harness_options=dict(o.harness_options),
                sandbox_options=dict(o.sandbox_options),
                max_context_tokens=o.max_context_tokens,
                boot_concurrency=o.boot_concurrency,
                rollout=dict(o.rollout),
            )
        )
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=loop.run_forever, name="agentrl-trl-rollouts", daemon=True
        )
        self._thread.start()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self.stack.__aenter__(), loop).result()
        if o.run_dir is not None:
            from agentrl.rollout.runner import Runner

            self.runner = Runner(
                self._run_one,
                o.run_dir,
                concurrency=o.max_concurrent_rollouts or 1_000_000,
                decode=self.stack.decode,
                tokenizer=tokenizer,
            )

    async def _run_one(self, task: Any, index: int) -> Any:
        result = await self.stack.rollout(task, index)
        self._results[(task.instance_id, index)] = result
        return result

    async def _rollouts(
        self, rows: list[dict[str, Any]], call: int, sampling: dict[str, Any]
    ) -> list[Any]:
        from agentrl.rollout.runner import RolloutJob

        stack = self.stack
        stack.options = attrs.evolve(stack.options, sampling=sampling)
        grader = stack.grader
        tasks = [grader.parse_task(row) for row in rows]
        # Unique per call and entry: the runner's keys (and the view) tell steps apart.
        jobs = [RolloutJob(task=t, index=call * len(tasks) + k) for k, t in enumerate(tasks)]
        self._results: dict[tuple[str, int], Any] = {}
        if self.runner is not None:
            await self.runner.run(jobs)
        else:
            limit = self.options.max_concurrent_rollouts or len(jobs)
            semaphore = asyncio.Semaphore(max(1, limit))

            async def one(job: RolloutJob) -> Any:
                async with semaphore:
                    return await self._run_one(job.task, job.index)

            await asyncio.gather(*(one(job) for job in jobs))
        return [self._results[(job.task.instance_id, job.index)] for job in jobs]

    def close(self) -> None:
        """Close the stack (middleware, sandboxes) and stop the background loop."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.stack.aclose(), loop).result(timeout=120)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
            loop.close()


def _task_row(prompt: Any) -> dict[str, Any]:
    """The task row a prompt carries: a mapping, or its JSON text."""
    if isinstance(prompt, Mapping):
        return dict(prompt)
    if isinstance(prompt, str):
        try:
            row = json.loads(prompt)
        except ValueError:
            row = None
        if isinstance(row, dict):
            return row
    raise ValueError(
        f"agentrl.trl: each prompt must be a task row (a JSON object or its text), got "
        f"{str(prompt)[:200]!r}; put json.dumps(row) in the dataset's prompt column"
    )


def _sampling(args: Any, options: TrlRolloutOptions) -> dict[str, Any]:
    """The engine's sampling parameters from the trainer's own (SGLang names)."""
    top_k = getattr(args, "top_k", None)
    params: dict[str, Any] = {
        "temperature": float(getattr(args, "temperature", 1.0)),
        "top_p": float(getattr(args, "top_p", 1.0) or 1.0),
        "top_k": int(top_k) if top_k else -1,
        "max_new_tokens": int(
            options.max_new_tokens or getattr(args, "max_completion_length", None) or 256
        ),
    }
    if getattr(args, "min_p", None):
        params["min_p"] = float(args.min_p)
    return params

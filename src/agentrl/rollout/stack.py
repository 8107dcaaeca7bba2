"""Wire the layers into one rollout stack: engine, tokenizer, middleware, harness, grader, sandboxes.

``agentrl rollout`` and ``agentrl demo`` build a ``Stack`` from ``StackOptions`` and call
``stack.rollout(task, index)`` for every job; the runner does the rest. Everything is looked
up through the plugin registry and asked through its contract (``Engine.from_options``,
``Sandbox.reaches_middleware_over_unix_socket``, ``Grader.from_options``), so plugin
engines, sandboxes, harnesses and graders get the built-ins' treatment here.

How the agent inside a sandbox reaches the middleware:

* over a unix socket (a backend with no network, such as ``local``, always; any backend
  that binds sockets when ``unix_path`` is set): the socket is bound into every sandbox
  and relayed to ``127.0.0.1:sandbox_port`` inside.
* over the network (every other case): the middleware listens on TCP at ``bind_host:port``
  and the agent dials ``public_host`` (which must be routable from the sandbox) at that port.

``agentrl.slime`` builds the same ``Stack`` inside slime's rollout manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl import plugins
from agentrl.engines.base import EngineLocation, MissingEngineOptionError
from agentrl.harnesses.kinds import needs_host_install
from agentrl.observers import TrackError, Tracking, TrackOptions
from agentrl.plugin_options import OptionsError, check_option_keys
from agentrl.rollout.config import RolloutConfig
from agentrl.serve.aborts import DEFAULT_MAX_ENGINE_ABORTS
from agentrl.serve.recipe import MiddlewareRecipe, check_shardable
from agentrl.serve.shard_wire import tune_gc
from agentrl.types import Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.engines.base import Engine
    from agentrl.graders.base import Grader
    from agentrl.harnesses.base import Harness
    from agentrl.rollout.run import RolloutResult
    from agentrl.sandboxes.base import Sandbox
    from agentrl.serve.middleware import Middleware
    from agentrl.serve.shards import ShardedMiddleware

__all__ = ["Stack", "StackError", "StackOptions", "merge_sandbox_options"]

logger = logging.getLogger(__name__)

#: Where the local sandbox relays the middleware's unix socket inside the sandbox.
DEFAULT_SANDBOX_PORT = 18001

#: The ``agentrl rollout`` flags for the generic engine options, named in its errors.
ENGINE_FLAGS: Mapping[EngineLocation, str] = {"url": "--engine-url", "model_path": "--model-path"}

#: ``RolloutConfig`` fields the stack fills itself (from ``max_context_tokens`` and where
#: the middleware listens), so never rollout options.
_STACK_ROLLOUT_FIELDS = frozenset(
    {"max_context_tokens", "max_sample_tokens", "middleware_host", "middleware_port"}
)


class StackError(ValueError):
    """The requested combination cannot be built; the message says what to change."""


def merge_sandbox_options(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """Merge sandbox option dicts; mapping-valued options (binds, env, services) are unioned."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged


def rollout_config(value: RolloutConfig | Mapping[str, Any] | None) -> RolloutConfig | None:
    """``StackOptions.rollout`` from a ``RolloutConfig`` or a mapping of its fields (the CLIs').

    Raises ``StackError`` for a key ``RolloutConfig`` has not, one the stack fills itself,
    or a value it refuses.
    """
    if value is None or isinstance(value, RolloutConfig):
        return value
    accepted = {field.name for field in attrs.fields(RolloutConfig)} - _STACK_ROLLOUT_FIELDS
    try:
        check_option_keys("the rollout", value, accepted)
        return RolloutConfig(**value)
    except (OptionsError, ValueError, TypeError) as exc:
        raise StackError(f"rollout options: {exc}") from None


@attrs.frozen(kw_only=True)
class StackOptions:
    """Everything ``agentrl rollout`` can be told; defaults are the embedded local setup."""

    harness: str = "claude_code"
    sandbox: str = "local"
    grader: str = "scaleswe"
    engine: str = "sglang"
    #: Where the engine runs, for engines that say so (``Engine.location``).
    engine_url: str | None = None
    model_path: str | None = None
    tokenizer: str | None = None
    #: Parser plugin names, or parser classes.
    tool_parser: str | type | None = "hermes"
    reasoning_parser: str | type | None = None
    #: ``splice`` (extend each chain's exact ids) or ``render`` (render every prompt in full).
    prompt_mode: str = "splice"
    engine_options: dict[str, Any] = attrs.field(factory=dict)
    #: An engine the caller built (a trainer's own client, e.g. ``agentrl.verl``'s): served
    #: as it is, ``engine`` only names it in logs. Needs ``workers=1`` (one process).
    engine_instance: Engine | None = None
    #: A host directory holding bin/claude and bin/codex (agentrl install-clis).
    cli_dir: str | None = None
    harness_options: dict[str, Any] = attrs.field(factory=dict)
    sandbox_options: dict[str, Any] = attrs.field(factory=dict)
    #: Image-less tasks: bind this machine's Python (with pytest) in read-only, where the
    #: sandbox backend can (``Sandbox.with_host_python``).
    host_python: bool = True
    bind_host: str = "127.0.0.1"
    port: int = 0
    public_host: str | None = None
    #: Serve over this unix socket (default for socket-only sandboxes: a fresh temporary path).
    unix_path: str | None = None
    sandbox_port: int = DEFAULT_SANDBOX_PORT
    sampling: dict[str, Any] = attrs.field(factory=dict)
    max_context_tokens: int = 0
    fork_threshold_tokens: int = 1024
    reward_split: str = "full"
    boot_concurrency: int = 4
    #: Middleware worker processes (sessions sharded by token, each one sticky to one
    #: worker); 1 serves in this process.
    workers: int = 1
    #: Engine aborts in a row that fail a turn; each one before is continued (0: none is).
    max_engine_aborts: int = DEFAULT_MAX_ENGINE_ABORTS
    #: Budgets and prompt of every rollout: a ``RolloutConfig`` or a mapping of its fields.
    #: Its ``eval_timeout`` is the graders' budget; None: ``RolloutConfig()`` and each
    #: grader's own default budget.
    rollout: RolloutConfig | None = attrs.field(default=None, converter=rollout_config)
    #: Experiment trackers every rollout is logged to (None or no trackers: none).
    track: TrackOptions | None = None

    @property
    def over_unix_socket(self) -> bool:
        """Whether sandboxes reach the middleware through a bound unix socket."""
        sandbox_cls = plugins.get_sandbox(self.sandbox)
        socket_only = getattr(sandbox_cls, "reaches_middleware_over_unix_socket", False)
        return self.unix_path is not None or socket_only

    def check(self) -> None:
        """Fail early, before anything starts, on combinations that cannot work."""
        self.check_engine()
        if self.workers < 1:
            raise StackError(f"--workers: expected >= 1, got {self.workers}")
        try:
            if self.engine_instance is None:
                check_shardable(self.engine, self.workers)
        except ValueError as exc:
            raise StackError(str(exc)) from None
        if not (self.tokenizer or self.model_path):
            raise StackError("pass --tokenizer PATH (a local tokenizer directory)")
        if not self.over_unix_socket and not self.public_host:
            raise StackError(
                f"the {self.sandbox!r} sandbox reaches the middleware over the network: pass "
                "--public-host, an address of this machine the sandboxes can route to"
            )
        self.check_option_keys()

    def check_engine(self) -> None:
        """Raise ``StackError`` when the engine cannot be built (``Engine.check_options``)."""
        if self.engine_instance is not None:
            if self.workers != 1:
                raise StackError(
                    f"workers={self.workers}: a caller's engine is served by one process"
                )
            return
        try:
            plugins.get_engine(self.engine).check_options(
                self.engine_options, url=self.engine_url, model_path=self.model_path
            )
        except MissingEngineOptionError as exc:
            raise StackError(exc.for_flags(ENGINE_FLAGS)) from None
        except OptionsError as exc:
            raise StackError(f"engine options: {exc}") from None

    def check_option_keys(self) -> None:
        """Raise ``StackError`` for an option key the sandbox or harness does not take.

        Each plugin class says what it accepts (its ``check_options`` classmethod; by
        default its constructor's keyword parameters). A class without ``check_options``
        gets its options unchecked. Unknown plugin names raise ``PluginError``.
        """
        checks: Sequence[tuple[str, type, Mapping[str, Any]]] = (
            ("--sandbox-options", plugins.get_sandbox(self.sandbox), self.sandbox_options),
            ("--harness-options", plugins.get_harness(self.harness), self.harness_options),
        )
        for flag, cls, options in checks:
            check = getattr(cls, "check_options", None)
            try:
                if check is not None:
                    check(options)
            except OptionsError as exc:
                raise StackError(f"{flag}: {exc}") from None


class Stack:
    """The long-lived parts of many rollouts, built once and shared."""

    def __init__(self, options: StackOptions) -> None:
        options.check()
        self.options = options
        self.engine: Engine | None = None
        self.middleware: Middleware | ShardedMiddleware | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        #: The grader of every task (None for ``auto``: each task's own, see ``grader_for``).
        self.grader: Grader | None = None
        self.harness: Harness | None = None
        self.sandbox_options: dict[str, Any] = {}
        self.rollout_config: RolloutConfig = options.rollout or RolloutConfig()
        #: Bounds the sandboxes booting at once (made on start, in the loop that uses it).
        self.boot_semaphore: asyncio.Semaphore | None = None
        self._sandbox_cls: type[Sandbox] = plugins.get_sandbox(options.sandbox)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        #: The experiment trackers, registered as observers while the stack is up.
        self.tracking: Tracking | None = None

    async def __aenter__(self) -> Stack:
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def middleware_recipe(self) -> MiddlewareRecipe:
        """The middleware every worker builds (``workers > 1``), as picklable values."""
        o = self.options
        return MiddlewareRecipe(
            engine=o.engine,
            engine_url=o.engine_url,
            model_path=o.model_path,
            engine_options=dict(o.engine_options),
            tokenizer=o.tokenizer or o.model_path,
            tool_parser=o.tool_parser,
            reasoning_parser=o.reasoning_parser,
            prompt_mode=o.prompt_mode,
            trajectory={
                "fork_threshold_tokens": o.fork_threshold_tokens,
                "reward_split": o.reward_split,
            },
            middleware={"max_engine_aborts": o.max_engine_aborts},
        )

    def _build_middleware(self) -> Middleware | ShardedMiddleware:
        from agentrl.serve.middleware import Middleware
        from agentrl.serve.shards import ShardedMiddleware
        from agentrl.trajectory import TrajectoryManager

        o = self.options
        if o.workers > 1:
            return ShardedMiddleware(workers=o.workers, build=self.middleware_recipe())
        self.engine = o.engine_instance or plugins.get_engine(o.engine).from_options(
            o.engine_options, url=o.engine_url, model_path=o.model_path
        )
        return Middleware(
            engine=self.engine,
            tokenizer=self.tokenizer,
            tool_parser=o.tool_parser,
            reasoning_parser=o.reasoning_parser,
            prompt_mode=o.prompt_mode,
            trajectory=TrajectoryManager(
                fork_threshold_tokens=o.fork_threshold_tokens, reward_split=o.reward_split
            ),
            max_engine_aborts=o.max_engine_aborts,
        )

    async def _start(self) -> None:
        from agentrl.tokenizers import load_tokenizer

        o = self.options
        harness_cls = plugins.get_harness(o.harness)
        self._start_tracking()
        self.grader = self.make_grader(o.grader) if o.grader != "auto" else None
        sandbox_cls = self._sandbox_cls

        # The runner decodes its rows with it (workers or not).
        self.tokenizer = await asyncio.to_thread(load_tokenizer, o.tokenizer or o.model_path)
        middleware = self.middleware = self._build_middleware()

        harness_options = dict(o.harness_options)
        sandbox_options: dict[str, Any] = {}
        if o.host_python:
            # A backend that can bind this machine's Python in says how (image-less tasks).
            sandbox_options.update(getattr(sandbox_cls, "with_host_python", {}))
        if o.over_unix_socket:
            unix_path = o.unix_path
            if unix_path is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="agentrl-mw-")
                unix_path = str(pathlib.Path(self._tmp.name) / "middleware.sock")
            await middleware.start(host=None, unix_path=unix_path)
            sandbox_options["services"] = {o.sandbox_port: unix_path}
            where: dict[str, Any] = {
                "middleware_host": "127.0.0.1",
                "middleware_port": o.sandbox_port,
            }
            if (
                o.cli_dir
                and "cli_path" not in harness_options
                and not needs_host_install(harness_cls)
            ):
                logger.warning(
                    "%s: its CLI comes from the sandbox's image; --cli-dir %s is not used",
                    o.harness,
                    o.cli_dir,
                )
            elif o.cli_dir and "cli_path" not in harness_options:
                binds, cli_path = harness_cls.host_install(o.cli_dir)
                sandbox_options["ro_binds"] = binds
                harness_options["cli_path"] = cli_path
        else:
            await middleware.start(host=o.bind_host, port=o.port)
            port = urllib.parse.urlsplit(middleware.url).port
            where = {"middleware_host": o.public_host, "middleware_port": port}
        names = getattr(sandbox_cls, "option_names", lambda: None)()
        if "run_id" in (names or ()):
            # The run's own label, so closing this stack sweeps only what it created.
            sandbox_options["run_id"] = uuid.uuid4().hex
        self.sandbox_options = merge_sandbox_options(sandbox_options, o.sandbox_options)
        self.harness = harness_cls(**harness_options)
        self.boot_semaphore = asyncio.Semaphore(o.boot_concurrency)
        self.rollout_config = attrs.evolve(
            self.rollout_config,
            max_context_tokens=o.max_context_tokens,
            max_sample_tokens=o.max_context_tokens,
            **where,
        )
        tune_gc()  # start-up is over: the collector stops scanning what it loaded
        logger.info(
            "stack up: harness=%s sandbox=%s grader=%s engine=%s middleware=%s workers=%d",
            o.harness,
            o.sandbox,
            o.grader,
            o.engine,
            middleware.url or middleware.unix_path,
            o.workers,
        )

    def _start_tracking(self) -> None:
        """Register the trackers ``options.track`` names, given the stack's options as the
        run's configuration (``StackError`` when a tracker's package is missing)."""
        track = self.options.track
        if track is None or not track.trackers:
            return
        config = {
            name: value
            for name, value in attrs.asdict(self.options, recurse=False).items()
            if isinstance(value, (str, int, float, bool, type(None)))
        }
        config["sampling"] = dict(self.options.sampling)
        if self.options.rollout is not None:
            config["rollout"] = attrs.asdict(self.options.rollout)
        try:
            self.tracking = Tracking.open(attrs.evolve(track, config={**config, **track.config}))
        except TrackError as exc:
            raise StackError(str(exc)) from None

    def sandbox_factory(self, task: Task) -> Sandbox:
        """A fresh, unstarted sandbox for ``task`` (agent and grading sandboxes alike)."""
        return self._sandbox_cls.from_task(task, **self.sandbox_options)

    def check_tasks(self, tasks: Iterable[Task]) -> None:
        """Raise ``StackError`` when a task is sure to fail before it boots, before any rollout.

        Asks the sandbox backend (``check_task``: its tools, the task's image and
        repository) and, where the sandbox searches this machine's own directories
        (``host_search_path``), the harness whether its CLI is there (``check_cli``).
        A plugin class without these methods is not asked.
        """
        from agentrl.harnesses.errors import HarnessError
        from agentrl.sandboxes.base import SandboxError

        cls, options = self._sandbox_cls, self.sandbox_options
        check_task = getattr(cls, "check_task", None)
        search_path = getattr(cls, "host_search_path", None)
        check_cli = getattr(self.harness, "check_cli", None)
        failed: dict[str, str] = {}
        paths: set[str | None] = set()
        count = 0
        for task in tasks:
            count += 1
            try:
                if check_task is not None:
                    check_task(task, **options)
                if search_path is not None:
                    paths.add(search_path(task, **options))
            except (SandboxError, ValueError, TypeError) as exc:
                failed.setdefault(task.instance_id, str(exc))
        if failed:
            first, reason = next(iter(failed.items()))
            where = f"in the {self.options.sandbox!r} sandbox"
            if len(failed) == 1:
                raise StackError(f"task {first!r} cannot run {where}: {reason}")
            names = ", ".join(list(failed)[:5]) + (", …" if len(failed) > 5 else "")
            raise StackError(
                f"{len(failed)} of {count} tasks cannot run {where} ({names}); "
                f"the first, {first!r}: {reason}"
            )
        if check_cli is not None:
            for path in sorted(p for p in paths if p is not None):
                try:
                    check_cli(path)
                except HarnessError as exc:
                    raise StackError(str(exc)) from None

    def make_grader(self, name: str) -> Grader:
        """A ``name`` grader given the rollout's grading budget (``graders.tasks.make_grader``)."""
        from agentrl.graders.tasks import make_grader

        rollout = self.options.rollout
        return make_grader(name, timeout=rollout.eval_timeout if rollout is not None else None)

    def grader_for(self, task: Task) -> Grader:
        """The stack's grader, or (grader ``auto``) one for the grader ``task`` names."""
        if self.grader is not None:
            return self.grader
        return self.make_grader(task.grader)

    async def rollout(self, task: Task, index: int) -> RolloutResult:
        """Run one rollout of ``task`` end to end."""
        from agentrl.rollout.run import run_rollout

        if self.harness is None or self.middleware is None:
            raise RuntimeError("the stack is not started: use `async with Stack(options)`")
        return await run_rollout(
            task,
            harness=self.harness,
            grader=self.grader_for(task),
            sandbox_factory=self.sandbox_factory,
            middleware=self.middleware,
            config=self.rollout_config,
            sampling_params=dict(self.options.sampling),
            session_id=f"{task.instance_id}-{index}-{uuid.uuid4().hex[:8]}",
            boot_semaphore=self.boot_semaphore,
        )

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ``ids``, special tokens kept (for the runner's rollout rows)."""
        if self.tokenizer is None:
            raise RuntimeError("the stack is not started: use `async with Stack(options)`")
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    async def _sweep_sandboxes(self) -> None:
        sweep = getattr(self._sandbox_cls, "sweep", None)
        swept = await sweep(**self.sandbox_options) if sweep is not None else []
        if swept:
            logger.warning("destroyed %d sandbox(es) this run left alive: %s", len(swept), swept)

    async def aclose(self) -> None:
        """Close the middleware, then the engine, then remove the socket directory; first,
        the sandbox backend sweeps what the run may have left alive (``Sandbox.sweep``);
        last, the trackers write their tables and close their runs.

        Each step runs even when an earlier one fails (the first error is raised after).
        """
        middleware, engine, tmp = self.middleware, self.engine, self._tmp
        started = middleware is not None
        self.middleware = self.engine = self._tmp = None
        tracking, self.tracking = self.tracking, None
        async with contextlib.AsyncExitStack() as cleanup:
            if tracking is not None:
                cleanup.callback(tracking.close)
            if started:
                cleanup.push_async_callback(self._sweep_sandboxes)
            if tmp is not None:
                cleanup.callback(tmp.cleanup)
            if engine is not None:
                cleanup.push_async_callback(engine.aclose)
            if middleware is not None:
                cleanup.push_async_callback(middleware.close)

"""The per-process agent service behind ``agentrl.slime.generate``.

slime calls the custom generate function from one asyncio loop shared by every rollout of
the batch, so nothing agentrl does may block it. The service owns a background thread
with its own event loop; the middleware (the HTTP server the agent CLIs call), the
engine client, sandboxes, harness and graders all live on that loop. slime's loop hands
each rollout over with ``asyncio.run_coroutine_threadsafe`` and awaits it through
``asyncio.wrap_future``.

The service is created on the first ``generate`` call (never at import) and then reused
for the life of the process; ``shutdown_service()`` stops it (tests, clean exits).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import pathlib
import socket
import sys
import threading
import urllib.parse
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.slime.config import SlimeConfig, SlimeConfigError
from agentrl.types import TurnFact

if TYPE_CHECKING:
    from agentrl.rollout.run import RolloutResult

__all__ = ["RolloutOutput", "Service", "ServiceSettings", "get_service", "shutdown_service"]

logger = logging.getLogger(__name__)


def router_url(args: Any) -> str:
    """The SGLang router's base URL from slime's ``sglang_router_ip`` / ``sglang_router_port``."""
    ip = getattr(args, "sglang_router_ip", None)
    port = getattr(args, "sglang_router_port", None)
    if not ip or not port:
        raise SlimeConfigError(
            f"args.sglang_router_ip={ip!r} / args.sglang_router_port={port!r}: the SGLang "
            "router address is unknown; agentrl.slime.generate must run inside slime's "
            "rollout manager, which sets both once the router is up"
        )
    host = f"[{ip}]" if ":" in str(ip) and not str(ip).startswith("[") else str(ip)
    return f"http://{host}:{int(port)}"


@attrs.frozen(kw_only=True)
class ServiceSettings:
    """What the service is built from: slime's ``args`` and the agentrl environment."""

    hf_checkpoint: str
    sglang_url: str
    max_context_tokens: int
    tool_parser: str | None
    reasoning_parser: str | None
    config: SlimeConfig
    #: Relative host paths in task rows resolve against this (None: leave them as they are).
    tasks_dir: pathlib.Path | None = None

    @classmethod
    def from_args(cls, args: Any, config: SlimeConfig) -> ServiceSettings:
        """Read the few slime arguments the service needs, with errors naming the flag."""
        hf_checkpoint = getattr(args, "hf_checkpoint", None)
        if not hf_checkpoint:
            raise SlimeConfigError(
                "args.hf_checkpoint is not set; pass --hf-checkpoint with the served model's "
                "Hugging Face directory (its tokenizer and chat template render the prompts)"
            )
        url = router_url(args)
        return cls(
            hf_checkpoint=str(hf_checkpoint),
            sglang_url=url,
            max_context_tokens=int(getattr(args, "rollout_max_context_len", 0) or 0),
            tool_parser=getattr(args, "sglang_tool_call_parser", None) or None,
            reasoning_parser=getattr(args, "sglang_reasoning_parser", None) or None,
            config=config,
            tasks_dir=pathlib.Path(config.tasks_dir) if config.tasks_dir else None,
        )

    def parser_classes(self) -> tuple[type | None, type | None]:
        """The tool-call and reasoning parser classes slime's two parser flags name."""
        return (
            resolve_parser("tool_parser", self.tool_parser),
            resolve_parser("reasoning_parser", self.reasoning_parser),
        )


@attrs.frozen(kw_only=True)
class RolloutOutput:
    """What one rollout hands back to slime's loop: a result or why there is none."""

    instance_id: str
    result: RolloutResult | None = None
    responses: tuple[str, ...] = ()
    abort_reason: str | None = None
    error: str | None = None
    engine_aborted: bool = False


def saw_engine_abort(turns: Sequence[TurnFact]) -> bool:
    """Whether any of these turns finished with the engine's ``abort`` (SGLang was aborted)."""
    return any(turn.finish_reason == "abort" for turn in turns)


def resolve_parser(kind: str, name: str | None) -> type | None:
    """The parser class for an SGLang parser name (``None`` when none is set).

    slime hands ``--sglang-tool-call-parser`` / ``--sglang-reasoning-parser`` to SGLang as
    they are, so agentrl reads them as SGLang names through the registry's getters: the
    built-in where it is proven identical to SGLang's parser, else SGLang's own (see
    ``agentrl.plugins.get_tool_parser``). Resolution lives there, not here, so
    ``agentrl serve --tool-parser glm45`` and slime resolve a name the same way.
    """
    if not name:
        return None
    from agentrl import plugins

    getter = plugins.get_tool_parser if kind == "tool_parser" else plugins.get_reasoning_parser
    try:
        return getter(name)
    except plugins.NotAvailableError as exc:
        flag = "--sglang-tool-call-parser" if kind == "tool_parser" else "--sglang-reasoning-parser"
        raise SlimeConfigError(f"{flag} {name!r}: {exc}") from exc


def public_address(configured: str, sglang_url: str) -> str:
    """The address sandboxes dial: ``configured``, or this node's own address for ``auto``.

    ``auto`` suits clusters where sandboxes can route to every node: slime's rollout
    manager may be placed on any node, so its address is only known at run time. It is
    Ray's node address when this process runs under Ray, else the local end of the route
    to the SGLang router. A router on this machine (a loopback URL) says nothing about the
    network, so then it is the local end of the route out of this machine, as Ray finds a
    node's address: never ``127.0.0.1`` (sandboxes cannot dial it) unless the machine has
    no other address. The answer does not depend on whether Ray was merely imported.
    """
    if configured != "auto":
        return configured
    ray = sys.modules.get("ray")
    if ray is not None:
        with contextlib.suppress(Exception):
            if ray.is_initialized():
                address = ray.util.get_node_ip_address()
                if address:
                    return str(address)
    host = urllib.parse.urlsplit(sglang_url).hostname or ""
    if not host or _is_loopback(host):
        host = "8.8.8.8"  # any outside address: the route out of this machine
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: nothing is sent, the kernel only picks a route
            return str(probe.getsockname()[0])
    except OSError:
        pass
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.getfqdn(socket.gethostname()))
    logger.warning("AGENTRL_PUBLIC_HOST=auto: this machine has no route out; using 127.0.0.1")
    return "127.0.0.1"


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Service:
    """The middleware, engine client and rollout machinery, on their own loop and thread."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.config = settings.config
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._main, name="agentrl-slime", daemon=True)
        self._thread.start()

    # -- lifecycle (service thread) ---------------------------------------------------------
    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self._start())
            except BaseException as exc:
                self.ready.set_exception(exc)
                return
            self.ready.set_result(None)
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(self._stop())
            loop.close()
            self._stopped.set()

    async def _start(self) -> None:
        from agentrl.observers import TrackOptions
        from agentrl.rollout.stack import Stack, StackOptions

        s, c = self.settings, self.config
        tool_parser, reasoning_parser = s.parser_classes()
        public_host = (
            None if c.unix_socket else public_address(c.require_public_host(), s.sglang_url)
        )
        options = StackOptions(
            harness=c.harness,
            sandbox=c.sandbox,
            grader=c.grader_name(False),
            engine="sglang",
            engine_url=s.sglang_url,
            tokenizer=s.hf_checkpoint,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
            harness_options=c.harness_kwargs(),
            sandbox_options=dict(c.sandbox_options),
            host_python=False,
            unix_path=c.unix_socket,
            bind_host=c.bind_host,
            port=c.port,
            public_host=public_host,
            sandbox_port=c.port or 18001,
            max_context_tokens=s.max_context_tokens,
            fork_threshold_tokens=c.fork_threshold_tokens,
            prompt_mode=c.prompt_mode,
            max_engine_aborts=c.max_engine_aborts,
            boot_concurrency=c.boot_concurrency,
            workers=c.middleware_workers,
            rollout=c.rollout_kwargs(),
            track=TrackOptions.from_settings(),  # AGENTRL_TRACK: W&B or TensorBoard
        )
        self.stack = stack = Stack(options)
        await stack.__aenter__()
        self.graders = {False: stack.grader, True: stack.make_grader(c.grader_name(True))}
        logger.info(
            "agentrl slime service up: harness=%s sandbox=%s grader=%s/%s engine=%s "
            "middleware=%s (%d workers) tool_parser=%s reasoning_parser=%s max_context=%d "
            "prompt_mode=%s",
            c.harness,
            c.sandbox,
            c.grader_name(False),
            c.grader_name(True),
            s.sglang_url,
            stack.middleware.url or c.unix_socket,
            c.middleware_workers,
            s.tool_parser,
            s.reasoning_parser,
            s.max_context_tokens,
            c.prompt_mode,
        )

    async def _stop(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        stack = getattr(self, "stack", None)
        if stack is not None:
            await stack.aclose()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop after closing the middleware and engine; wait for the thread."""
        if self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)

    # -- calls from slime's loop -------------------------------------------------------------
    def submit(self, key: str, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run ``coro`` on the service loop as the task named ``key``."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(self._tracked(key, coro), self.loop)

    def cancel(self, key: str) -> None:
        """Cancel the rollout ``key`` (thread-safe; its cleanup still runs)."""
        if self.loop is None or self.loop.is_closed():
            return

        def _cancel() -> None:
            task = self._tasks.get(key)
            if task is not None:
                task.cancel()

        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_cancel)

    def engine_aborted(self, session_id: str) -> bool:
        """Whether the engine aborted a turn of the open session ``session_id`` for good.

        That is a turn that finished with ``abort`` (the middleware continues an aborted
        generation unless ``AGENTRL_MAX_ENGINE_ABORTS=0``) or one that failed because the
        engine aborted it ``AGENTRL_MAX_ENGINE_ABORTS`` times in a row (an engine being
        drained). slime's loop asks while the rollout runs; the answer is read from the
        middleware session's turn facts and counters (a dict lookup and a list scan, which
        need no lock across threads). Before the session opens and after it closes, the
        answer is False; the rollout's result carries the facts from then on (a failed
        turn was not recorded, so it left nothing there to train on).
        """
        stack = getattr(self, "stack", None)
        if stack is None:
            return False
        try:
            session = stack.middleware.session(session_id)
        except KeyError:
            return False
        return session.aborted_turns > 0 or saw_engine_abort(session.turn_facts)

    async def _tracked(self, key: str, coro: Coroutine[Any, Any, Any]) -> Any:
        task = asyncio.current_task()
        assert task is not None
        self._tasks[key] = task
        try:
            return await coro
        finally:
            self._tasks.pop(key, None)

    # -- one rollout (service loop) ----------------------------------------------------------
    async def rollout(
        self,
        row: Mapping[str, Any],
        *,
        evaluation: bool,
        sampling_params: Mapping[str, Any],
        session_id: str,
        fallback_instance_id: str,
    ) -> RolloutOutput:
        """Parse the row, run the rollout end to end, decode the responses for logging."""
        from agentrl.rollout import run_rollout

        grader = self.graders[evaluation]
        try:
            task = grader.resolve_paths(grader.parse_task(row), self.settings.tasks_dir)
        except (ValueError, KeyError, TypeError) as exc:
            return RolloutOutput(
                instance_id=fallback_instance_id,
                abort_reason="invalid_task",
                error=f"{type(exc).__name__}: {exc}",
            )
        # A grader's check may import and build heavy things (swebench's test spec): keep
        # it off this loop, which also serves every running agent's model calls.
        reason = await asyncio.to_thread(grader.check, task)
        if reason:
            return RolloutOutput(instance_id=task.instance_id, abort_reason=f"unevaluable:{reason}")
        result = await run_rollout(
            task,
            harness=self.stack.harness,
            grader=grader,
            sandbox_factory=self.stack.sandbox_factory,
            middleware=self.stack.middleware,
            config=self.stack.rollout_config,
            sampling_params=dict(sampling_params),
            session_id=session_id,
            boot_semaphore=self.stack.boot_semaphore,
        )
        responses: Sequence[str] = ()
        if result.samples and not evaluation:
            responses = await asyncio.to_thread(self._decode_responses, result.samples)
        return RolloutOutput(
            instance_id=task.instance_id,
            result=result,
            responses=tuple(responses),
            engine_aborted=saw_engine_abort(result.turn_facts),
        )

    def _decode_responses(self, samples: Sequence[Any]) -> list[str]:
        return [self.stack.decode(s.tokens[-s.response_length :]) for s in samples]


_service: Service | None = None
_service_lock = threading.Lock()


def get_service(args: Any, factory: Callable[[ServiceSettings], Service] = Service) -> Service:
    """The process's service, started on the first call (the only time the environment is
    read); later calls must name the same model and router."""
    global _service
    with _service_lock:
        if _service is None:
            settings = ServiceSettings.from_args(args, SlimeConfig.from_env())
            _service = factory(settings)
            _register_exit_hook()
            return _service
        running = _service.settings
        model = getattr(args, "hf_checkpoint", None)
        url = router_url(args)
        if (str(model), url) != (running.hf_checkpoint, running.sglang_url):
            raise SlimeConfigError(
                "agentrl.slime.generate was called with a different model or router "
                f"({model} at {url}) than this process's running service "
                f"({running.hf_checkpoint} at {running.sglang_url}); one process serves one model"
            )
        return _service


_exit_hook_registered = False


def _register_exit_hook() -> None:
    # Close sandboxes and the middleware when slime's rollout manager exits.
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(shutdown_service)
        _exit_hook_registered = True


def shutdown_service(timeout: float = 30.0) -> None:
    """Stop the process's service, if one runs (the next ``generate`` starts a fresh one)."""
    global _service
    with _service_lock:
        service, _service = _service, None
    if service is not None:
        service.shutdown(timeout)

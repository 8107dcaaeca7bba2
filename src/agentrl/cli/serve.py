"""``agentrl serve``: the middleware alone, for pointing any agent at a policy by hand.

It opens one session per kind of client (each agent CLI whose harness says how it is
pointed at a middleware — Claude Code, Codex — and one for OpenAI / Anthropic SDKs), prints
the base URL and each session's token with the settings that client needs, serves until
Ctrl-C / SIGTERM, then writes every recorded sample as JSON lines.

Start-up fails with one line (exit 1) when the chat template cannot be rendered (jinja2
missing) or the address is taken. An engine that does not answer its health check only
draws a warning: SGLang often finishes loading after the middleware is up, so serving
starts anyway, turns get 502 and ``/healthz`` 503 until the engine answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agentrl import wording
from agentrl.cli.options import (
    PluginName,
    json_object_option,
    parser_options,
    prompt_mode_option,
    workers_option,
)
from agentrl.harnesses.base import ClientSetup
from agentrl.serve.shard_handle import WorkerDiedError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.engines.base import Engine
    from agentrl.serve.middleware import Middleware
    from agentrl.serve.recipe import MiddlewareRecipe
    from agentrl.serve.shards import ShardedMiddleware

__all__ = ["serve"]

logger = logging.getLogger(__name__)

#: The session for SDK clients (OpenAI / Anthropic SDKs, Codex <= 0.94 on Chat
#: Completions); the agent CLIs get one each, named after their harness.
SDK_SESSION = "openai"


def sdk_setup(base_url: str, token: str) -> ClientSetup:
    """How an OpenAI or Anthropic SDK client is pointed at the middleware."""
    return ClientSetup(
        title="OpenAI SDK (Chat Completions or Responses) / Anthropic SDK",
        lines=(
            f"OPENAI_BASE_URL={base_url}/v1 OPENAI_API_KEY={token}",
            f"ANTHROPIC_BASE_URL={base_url} ANTHROPIC_API_KEY={token}",
        ),
    )


def client_instructions(base_url: str, setups: Iterable[ClientSetup]) -> str:
    """What to run to point each client at the middleware."""
    lines = [f"agentrl middleware at {base_url}"]
    for setup in setups:
        lines += ["", f"{setup.title}:", *(f"  {line}" for line in setup.lines)]
    return "\n".join(lines)


async def open_client_sessions(
    middleware: Middleware | ShardedMiddleware, base_url: str, session_options: Mapping[str, Any]
) -> dict[str, ClientSetup]:
    """One session per kind of client, by session id, with how to point that client at it.

    Every registered harness whose ``client_setup`` says how its CLI on the host is pointed
    here gets a session named after it (one that cannot say gets none), then the SDKs get
    :data:`SDK_SESSION`.
    """
    from agentrl.plugins import available, get_harness

    setups: dict[str, ClientSetup] = {}
    for name in available("harness"):
        token = middleware.open_session(name, **session_options)
        describe = getattr(get_harness(name), "client_setup", None)
        setup = describe(base_url, token) if describe is not None else None
        if setup is None:
            await middleware.drop_session(name)
        else:
            setups[name] = setup
    setups[SDK_SESSION] = sdk_setup(
        base_url, middleware.open_session(SDK_SESSION, **session_options)
    )
    return setups


def build_engine(
    name: str, url: str | None, model: str | None, options: dict[str, Any] | None = None
) -> Engine:
    """The ``name`` engine built from ``--engine-url`` / ``--model`` / ``--engine-options``
    (``Engine.from_options``)."""
    from agentrl import plugins
    from agentrl.engines.base import EngineError, MissingEngineOptionError

    try:
        return plugins.get_engine(name).from_options(options, url=url, model_path=model)
    except MissingEngineOptionError as exc:
        flags = {"url": "--engine-url", "model_path": "--model"}
        raise click.UsageError(exc.for_flags(flags)) from None
    except (ValueError, EngineError) as exc:
        raise click.UsageError(str(exc)) from None


async def run_server(
    *,
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase | None,
    host: str,
    port: int,
    unix_path: str | None,
    tool_parser: str | None,
    reasoning_parser: str | None,
    session_options: dict[str, Any],
    output: Path,
    reward: float,
    prompt_mode: str = "splice",
    stop: asyncio.Event | None = None,
    announce: Any = click.echo,
    warn: Any = None,
    workers: int = 1,
    recipe: MiddlewareRecipe | None = None,
) -> int:
    """Serve until ``stop`` is set (or a signal arrives); write samples; return their count.

    With ``workers > 1`` the sessions are served by that many worker processes, each
    building its middleware from ``recipe`` (``engine`` then only answers the health
    check here, and ``tokenizer`` is not needed). Raises ``click.ClickException`` when the
    address cannot be bound or a worker cannot start; ``warn`` (default: stderr) gets one
    line when the engine does not answer its health check.
    """
    from agentrl.serve.probes import engine_problem
    from agentrl.serve.shard_wire import tune_gc

    if warn is None:

        def warn(line: str) -> None:
            click.secho(line, err=True, fg="yellow")

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    middleware = new_middleware(
        engine, tokenizer, tool_parser, reasoning_parser, prompt_mode, workers, recipe
    )
    try:
        await middleware.start(host=host, port=port, unix_path=unix_path)
    except OSError as exc:
        with contextlib.suppress(Exception):
            await engine.aclose()
        where = f"{host}:{port}" if host is not None else f"unix:{unix_path}"
        if unix_path is not None and host is not None:
            where += f" or unix:{unix_path}"
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise click.ClickException(
            f"cannot listen on {where}: {reason}; choose another --port (or --host / "
            "--unix-socket), or stop what is using it"
        ) from None
    except Exception as exc:
        if workers == 1:
            raise
        with contextlib.suppress(Exception):
            await engine.aclose()
        raise click.ClickException(f"the middleware workers could not start: {exc}") from None
    tune_gc()  # start-up is over: the collector stops scanning what it loaded
    base_url = middleware.url or f"unix:{unix_path}"
    setups = await open_client_sessions(middleware, base_url, session_options)
    announce(client_instructions(base_url, setups.values()))
    problem = await engine_problem(engine)
    if problem is not None:
        warn(
            f"warning: the engine does not answer ({problem}); serving anyway: turns get "
            "HTTP 502 and /healthz 503 until it does"
        )
    announce("\nServing; press Ctrl-C to stop and write the trajectory.")
    count = 0
    try:
        await stop.wait()
    finally:
        output.parent.mkdir(parents=True, exist_ok=True)
        with output.open("w") as handle:
            for sid in setups:
                try:
                    samples = await middleware.finish_session(
                        sid, reward=reward, metadata={"session": sid}
                    )
                except WorkerDiedError as exc:
                    warn(f"warning: session {sid!r} is lost: {exc}")
                    continue
                for sample in samples:
                    handle.write(json.dumps({"session": sid, **sample.to_dict()}) + "\n")
                    count += 1
        await middleware.close()
        with contextlib.suppress(Exception):
            await engine.aclose()
        announce(f"wrote {wording.count(count, 'sample')} to {output}")
    return count


def new_middleware(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase | None,
    tool_parser: str | None,
    reasoning_parser: str | None,
    prompt_mode: str,
    workers: int,
    recipe: MiddlewareRecipe | None,
) -> Middleware | ShardedMiddleware:
    """The in-process middleware (``workers == 1``) or ``workers`` built from ``recipe``."""
    if workers > 1:
        from agentrl.serve.shards import ShardedMiddleware

        if recipe is None:
            raise ValueError("workers > 1 needs the recipe every worker builds its middleware from")
        return ShardedMiddleware(workers=workers, build=recipe)
    from agentrl.serve.middleware import Middleware
    from agentrl.trajectory import TrajectoryManager

    if tokenizer is None:
        raise ValueError("the in-process middleware needs a tokenizer")
    return Middleware(
        engine=engine,
        tokenizer=tokenizer,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        trajectory=TrajectoryManager(),
        prompt_mode=prompt_mode,
    )


@click.command()
@click.option(
    "--engine",
    "engine_name",
    default="sglang",
    show_default=True,
    type=PluginName("engine"),
    help="Engine plugin name (see `agentrl plugins`).",
)
@click.option(
    "--engine-url",
    help="The engine's server: sglang, the server or router URL (http://127.0.0.1:30000); "
    "vllm, one server's URL or several, comma-separated.",
)
@click.option("--engine-options", help="JSON object passed to the engine (see docs/engines.md).")
@click.option("--model", help="Local model directory (engines that run in-process).")
@click.option(
    "--tokenizer",
    "tokenizer_path",
    required=True,
    help="Local directory with the served model's tokenizer and chat template.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--unix-socket", "unix_path", help="Also listen on this unix socket path.")
@parser_options(reasoning_default="qwen3")
@prompt_mode_option
@workers_option
@click.option(
    "--max-context-tokens",
    default=0,
    show_default=True,
    type=int,
    help="Context budget per session (0: unlimited).",
)
@click.option("--max-turns", default=None, type=int, help="Turn cap per session.")
@click.option("--temperature", default=None, type=float, help="Trainer sampling temperature.")
@click.option("--top-p", default=None, type=float)
@click.option("--top-k", default=None, type=int)
@click.option("--max-new-tokens", default=None, type=int)
@click.option(
    "--sampling-policy",
    type=click.Choice(["trainer", "client"]),
    default="trainer",
    show_default=True,
    help="Whose temperature/top_p/top_k win.",
)
@click.option(
    "--output",
    "-o",
    default="trajectory.jsonl",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where the recorded samples go (JSON lines) when the server stops.",
)
@click.option(
    "--reward", default=0.0, show_default=True, type=float, help="Reward written on every sample."
)
def serve(
    engine_name: str,
    engine_url: str | None,
    engine_options: str | None,
    model: str | None,
    tokenizer_path: str,
    host: str,
    port: int,
    unix_path: str | None,
    tool_parser: str,
    reasoning_parser: str,
    prompt_mode: str,
    workers: int,
    max_context_tokens: int,
    max_turns: int | None,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    max_new_tokens: int | None,
    sampling_policy: str,
    output: Path,
    reward: float,
) -> None:
    """Run the middleware alone and print how to point Claude Code, Codex or an SDK at it."""
    from agentrl.serve.recipe import MiddlewareRecipe, check_shardable

    tokenizer = None
    if workers == 1:
        tokenizer = load_serving_tokenizer(tokenizer_path)
    else:
        try:
            check_shardable(engine_name, workers)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if not Path(tokenizer_path).expanduser().is_dir():
            raise click.UsageError(f"--tokenizer: {tokenizer_path!r} is not a directory")
    options = json_object_option(engine_options, "--engine-options")
    engine = build_engine(engine_name, engine_url, model, options)
    recipe = MiddlewareRecipe(
        engine=engine_name,
        engine_url=engine_url,
        engine_options=options,
        model_path=model,
        tokenizer=tokenizer_path,
        tool_parser=tool_parser or None,
        reasoning_parser=reasoning_parser or None,
        prompt_mode=prompt_mode,
    )
    sampling = {
        key: value
        for key, value in (
            ("temperature", temperature),
            ("top_p", top_p),
            ("top_k", top_k),
            ("max_new_tokens", max_new_tokens),
        )
        if value is not None
    }
    asyncio.run(
        run_server(
            engine=engine,
            tokenizer=tokenizer,
            host=host,
            port=port,
            unix_path=unix_path,
            tool_parser=tool_parser or None,
            reasoning_parser=reasoning_parser or None,
            session_options={
                "sampling_defaults": sampling,
                "max_context_tokens": max_context_tokens,
                "max_turns": max_turns,
                "sampling_policy": sampling_policy,
            },
            output=output,
            reward=reward,
            prompt_mode=prompt_mode,
            workers=workers,
            recipe=recipe,
        )
    )


def load_serving_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """``--tokenizer``'s tokenizer, its errors as click's."""
    from agentrl.tokenizers import ChatTemplateUnavailableError, TokenizerError, load_tokenizer

    try:
        return load_tokenizer(path)
    except ChatTemplateUnavailableError as exc:
        raise click.ClickException(str(exc)) from None
    except TokenizerError as exc:
        raise click.UsageError(f"--tokenizer: {exc}") from None

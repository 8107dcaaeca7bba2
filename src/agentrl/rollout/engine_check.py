"""Before the first rollout: does the engine answer? One cheap request, ``Engine.health()``.

Without it, a wrong ``--engine-url`` shows only once every rollout has booted its sandbox,
installed its CLI and had the agent give up on the middleware: minutes later, as a run of
``infra_error`` rollouts. Checked here, it is one line in seconds, naming the URL.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from agentrl import plugins
from agentrl.rollout.stack import StackError
from agentrl.serve.probes import engine_problem

if TYPE_CHECKING:
    from agentrl.engines.base import Engine
    from agentrl.rollout.stack import StackOptions

__all__ = ["EngineUnavailableError", "check_engine_answers"]


class EngineUnavailableError(StackError):
    """The engine did not answer its health check before the run; the message says why."""


async def check_engine_answers(options: StackOptions, engine: Engine | None = None) -> None:
    """Raise ``EngineUnavailableError`` unless the engine answers its health check now.

    ``engine`` is asked when given (a started stack's); otherwise one is built from
    ``options`` for the check and closed after it (the stack's middleware workers and a
    Ray cluster's nodes build their own).
    """
    own = engine is None
    if engine is None:
        engine = plugins.get_engine(options.engine).from_options(
            options.engine_options, url=options.engine_url, model_path=options.model_path
        )
    try:
        problem = await engine_problem(engine)
    finally:
        if own:
            with contextlib.suppress(Exception):
                await engine.aclose()
    if problem is not None:
        where = f" at {options.engine_url}" if options.engine_url else ""
        raise EngineUnavailableError(
            f"the {options.engine} engine{where} does not answer: {problem}. No rollout was "
            "started; start the engine (or fix --engine-url) and run the same command again"
        )

"""Drive scenarios through the real middleware over HTTP, in a prompt mode, and report.

For each scenario and mode: a fresh :class:`~agentrl.serve.middleware.Middleware`
(the real adapter of the protocol, the real chat template and parsers) in front of a
:class:`~agentrl.preflight.engine.ScriptedTokenEngine`, started on ``127.0.0.1``; the
scripted client posts each request the way its CLI does, the session is finished, and its
training samples are measured (:func:`agentrl.preflight.report.analyse`).

::

    reports = run_preflight(tokenizer, protocol="anthropic", modes=("splice", "render"))
    reports["splice"][0].token_yield
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.preflight.clients import CLIENTS, ParsedCall, WireClient
from agentrl.preflight.engine import EngineCall, ScriptedCompletion, ScriptedTokenEngine
from agentrl.preflight.report import DrivenTurn, SessionReport, analyse
from agentrl.preflight.scenarios import SCENARIOS, ModelTurn, Scenario, completion_text
from agentrl.prompts.splice import PROMPT_MODES
from agentrl.trajectory import TrajectoryManager

if TYPE_CHECKING:
    import aiohttp
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "PROMPT_MODES",
    "PreflightError",
    "RecordingTrajectory",
    "run_preflight",
    "run_scenario",
]

logger = logging.getLogger(__name__)

#: The middleware's prompt modes, the default first.
_SESSION = "preflight"


class PreflightError(RuntimeError):
    """A scenario could not run (the middleware refused a request, a mode is missing)."""


@attrs.define(eq=False)
class RecordingTrajectory(TrajectoryManager):
    """A TrajectoryManager that also keeps each recorded turn's index and metadata.

    ``recorded`` maps the middleware's turn index to (trajectory turn index, metadata).
    """

    recorded: dict[int, tuple[int, dict[str, Any]]] = attrs.field(factory=dict)

    def record_turn(self, sid: Any, turn: Any, **kwargs: Any) -> int | None:
        index = super().record_turn(sid, turn, **kwargs)
        metadata = dict(kwargs.get("metadata") or {})
        if index is not None:
            self.recorded[int(metadata.get("middleware_turn", index - 1))] = (index, metadata)
        return index


def _mode_options(mode: str) -> dict[str, Any]:
    """The Middleware keyword arguments for ``mode``."""
    if mode not in PROMPT_MODES:
        raise PreflightError(f"prompt mode: expected one of {PROMPT_MODES}, got {mode!r}")
    return {"prompt_mode": mode}


def _engine_calls(engine: ScriptedTokenEngine, sid: str) -> dict[int, EngineCall]:
    """The engine calls by middleware turn, read from their request ids (``<sid>-t<n>-…``)."""
    found = {}
    prefix = f"{sid}-t"
    for call in engine.calls:
        if call.rid and call.rid.startswith(prefix):
            head = call.rid[len(prefix) :].split("-", 1)[0]
            if head.isdigit():
                found[int(head)] = call
    return found


@attrs.define(kw_only=True, eq=False)
class _Driver:
    """Plays one scenario's client against a started middleware."""

    scenario: Scenario
    client: WireClient
    engine: ScriptedTokenEngine
    http: aiohttp.ClientSession
    url: str
    token: str
    driven: list[DrivenTurn] = attrs.field(factory=list)
    conversations: int = 0

    async def converse(self, prompt: str, turns: Sequence[ModelTurn], *, subagent: bool) -> str:
        """Run one conversation to its end; its last reply's text."""
        client = self.client
        conversation = client.new_conversation(prompt, subagent=subagent)
        number, self.conversations = self.conversations, self.conversations + 1
        last_text = ""
        for model_turn in turns:
            reply = await self.post(conversation, model_turn, number, subagent)
            client.add_reply(conversation, reply, reorder_keys=self.scenario.reorder_replayed_keys)
            last_text = reply.text
            results: list[tuple[ParsedCall, str]] = []
            for position, call in enumerate(reply.calls):
                scripted = model_turn.calls[position] if position < len(model_turn.calls) else None
                if scripted is not None and scripted.subagent:
                    task = str(scripted.arguments.get("prompt", ""))
                    output = await self.converse(task, scripted.subagent, subagent=True)
                elif scripted is not None:
                    output = scripted.result
                else:
                    output = f"error: no such call was scripted ({call.name})"
                results.append((call, output))
            if results or model_turn.user_text is not None:
                client.add_results(conversation, results, model_turn.user_text)
        return last_text

    async def post(self, conversation: Any, model_turn: ModelTurn, number: int, subagent: bool):
        client = self.client
        self.engine.queue(
            ScriptedCompletion(
                text=completion_text(model_turn, client.tool_names), cut_after=model_turn.cut_after
            )
        )
        index = len(self.driven)
        async with self.http.post(
            self.url + client.path,
            json=client.body(conversation),
            headers=client.headers(self.token, conversation),
        ) as response:
            text = await response.text()
            if response.status != 200:
                raise PreflightError(
                    f"scenario {self.scenario.name!r} turn {index}: the middleware answered "
                    f"HTTP {response.status}: {text[:500]}"
                )
        reply = client.parse_reply(text)
        expected = tuple(
            (client.tool_names.get(c.tool, c.tool), dict(c.arguments)) for c in model_turn.calls
        )
        self.driven.append(
            DrivenTurn(
                index=index,
                conversation=number,
                agent="sub" if subagent else "main",
                model_turn=model_turn,
                expected_calls=expected,
                reply=reply,
            )
        )
        return reply


async def run_scenario(
    scenario: Scenario,
    *,
    tokenizer: PreTrainedTokenizerBase,
    protocol: str = "anthropic",
    mode: str = "splice",
    tool_parser: Any = "hermes",
    reasoning_parser: Any = "qwen3",
) -> SessionReport:
    """Run ``scenario`` over ``protocol`` in prompt mode ``mode``; its report."""
    import aiohttp

    from agentrl.serve.middleware import Middleware

    if protocol not in CLIENTS:
        raise PreflightError(
            f"no scripted client speaks {protocol!r}; choose from {', '.join(CLIENTS)}"
        )
    engine = ScriptedTokenEngine(tokenizer)
    trajectory = RecordingTrajectory()
    middleware = Middleware(
        engine=engine,
        tokenizer=tokenizer,
        tool_parser=tool_parser or None,
        reasoning_parser=reasoning_parser or None,
        trajectory=trajectory,
        adapters=[protocol],
        chat_template_kwargs=scenario.chat_template_kwargs,
        **_mode_options(mode),
    )
    await middleware.start(host="127.0.0.1", port=0)
    try:
        token = middleware.open_session(_SESSION)
        async with aiohttp.ClientSession(trust_env=False) as http:
            driver = _Driver(
                scenario=scenario,
                client=CLIENTS[protocol](),
                engine=engine,
                http=http,
                url=str(middleware.url),
                token=token,
            )
            await driver.converse(scenario.prompt, scenario.turns, subagent=False)
        samples = await middleware.finish_session(_SESSION, reward=1.0, max_sample_tokens=0)
    finally:
        await middleware.close()
    return analyse(
        scenario=scenario.name,
        description=scenario.description,
        protocol=protocol,
        mode=mode,
        driven=driver.driven,
        calls=_engine_calls(engine, _SESSION),
        recorded=trajectory.recorded,
        samples=samples,
        tokenizer=tokenizer,
    )


def run_preflight(
    tokenizer: PreTrainedTokenizerBase,
    *,
    protocol: str = "anthropic",
    modes: Iterable[str] = PROMPT_MODES,
    scenarios: Sequence[Scenario] = SCENARIOS,
    tool_parser: Any = "hermes",
    reasoning_parser: Any = "qwen3",
) -> Mapping[str, list[SessionReport]]:
    """Every scenario in every mode, in one event loop: ``{mode: [report, ...]}``."""

    async def run_all() -> dict[str, list[SessionReport]]:
        found: dict[str, list[SessionReport]] = {}
        for mode in modes:
            found[mode] = [
                await run_scenario(
                    scenario,
                    tokenizer=tokenizer,
                    protocol=protocol,
                    mode=mode,
                    tool_parser=tool_parser,
                    reasoning_parser=reasoning_parser,
                )
                for scenario in scenarios
            ]
        return found

    return asyncio.run(run_all())

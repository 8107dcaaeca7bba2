"""An agentrl Engine over verl's server manager: verl keeps its servers, agentrl its tokens.

verl hands each agent loop a client (``AgentLoopBase.server_manager``, an
``LLMServerClient``) whose ``generate(request_id, prompt_ids=..., sampling_params=...)``
returns a ``TokenOutput`` (``token_ids``, ``log_probs``, ``stop_reason``). verl routes the
call to one of the vLLM or SGLang servers it manages (sticky by ``request_id``), syncs
their weights and balances their load; this engine only speaks that contract, so the
middleware serves every agent turn through verl without knowing which server ran it.

Nothing here imports verl: the client is duck-typed, so a test can hand in any object with
verl's ``generate`` signature.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from agentrl.engines.base import Engine, EngineError, Generation

__all__ = ["VERL_SAMPLING_KEYS", "VerlEngine", "finish_reason_of", "verl_sampling_params"]

logger = logging.getLogger(__name__)

#: agentrl (SGLang-named) sampling keys both of verl's servers read, passed on unchanged.
VERL_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
)


def verl_sampling_params(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """verl's sampling dict for one turn: the shared keys, ``max_tokens``, and log-probs on.

    verl's vLLM and SGLang servers both read ``max_tokens`` and ``logprobs``; SGLang-only
    keys the middleware sets (``no_stop_trim``, ``skip_special_tokens``) are left out since
    verl returns token ids, never text, and vLLM's ``SamplingParams`` refuses unknown keys.
    """
    params = {
        k: sampling_params[k] for k in VERL_SAMPLING_KEYS if sampling_params.get(k) is not None
    }
    limit = sampling_params.get("max_new_tokens", sampling_params.get("max_tokens"))
    if limit is not None:
        params["max_tokens"] = int(limit)
    params["logprobs"] = True  # token-exact training needs the sampled tokens' log-probs
    return params


def finish_reason_of(
    stop_reason: str | None,
    token_ids: Sequence[int] = (),
    max_tokens: int | None = None,
    stop_ids: Collection[int] = (),
) -> str:
    """agentrl's finish reason for verl's ``TokenOutput.stop_reason``.

    verl says ``aborted`` (vLLM) or ``abort`` (SGLang) for a generation its trainer stopped
    (a weight update). Its SGLang server passes ``length`` through for a budget hit, but its
    vLLM server (0.9.1) folds vLLM's ``length`` into ``completed``: a ``completed`` output
    that used all of ``max_tokens`` and does not end in one of ``stop_ids`` (EOS, the turn's
    stop token ids; vLLM checks them before the budget) is ``length``, as vLLM said.
    """
    if stop_reason in ("aborted", "abort"):
        return "abort"
    if stop_reason == "length":
        return "length"
    if (
        max_tokens is not None
        and len(token_ids) >= max_tokens > 0
        and token_ids[-1] not in stop_ids
    ):
        return "length"
    return "stop"


class VerlEngine(Engine):
    """Serves middleware turns through verl's ``server_manager.generate``.

    ``routing_key`` (the agentrl session id) becomes verl's ``request_id``, so every turn of
    one session goes to the same server (verl's sticky sessions, its prefix cache). An
    abort of verl's (``stop_reason`` ``aborted``) comes back as ``finish_reason="abort"``
    with what was sampled, and the middleware continues it (``agentrl.serve.aborts``):
    the agent sees one whole answer, as with verl's own ``FullyAsyncLLMServerClient``.

    Each session's weight versions (``extra_fields["global_steps"]`` of verl's outputs) are
    kept, so the agent loop can report the off-policy range verl's fully-async trainer reads.
    """

    name: ClassVar[str] = "verl"

    def __init__(self, server_manager: Any, *, eos_token_ids: Collection[int] = ()) -> None:
        if not callable(getattr(server_manager, "generate", None)):
            raise TypeError(
                f"VerlEngine needs verl's server manager (an object with an async "
                f"generate(request_id, prompt_ids=..., sampling_params=...)), got "
                f"{type(server_manager).__name__}"
            )
        self.server_manager = server_manager
        #: The model's end-of-sequence ids: an output that ends in one at the budget stopped.
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._steps: dict[str, tuple[Any, Any]] = {}

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        routing_key: str | None = None,
    ) -> Generation:
        """One turn through verl; raises ``EngineError`` when verl returns no log-probs."""
        request_id = routing_key or rid or "agentrl"
        params = verl_sampling_params(sampling_params)
        output = await self.server_manager.generate(
            request_id,
            prompt_ids=list(input_ids),
            sampling_params=dict(params),  # verl's servers pop keys from the dict they get
        )
        token_ids = [int(t) for t in output.token_ids]
        logprobs = output.log_probs
        if logprobs is None or len(logprobs) != len(token_ids):
            raise EngineError(
                f"verl returned {len(token_ids)} tokens and "
                f"{'no' if logprobs is None else len(logprobs)} log-probs; agentrl trains on "
                "the sampled log-probs, so the server must return one per token (verl's "
                "servers do when sampling_params['logprobs'] is true)"
            )
        extra = dict(getattr(output, "extra_fields", None) or {})
        if routing_key is not None and extra.get("global_steps") is not None:
            step = extra["global_steps"]
            low, high = self._steps.get(routing_key, (step, step))
            self._steps[routing_key] = (min(low, step), max(high, step))
        return Generation(
            output_ids=token_ids,
            logprobs=[float(lp) for lp in logprobs],
            finish_reason=finish_reason_of(
                getattr(output, "stop_reason", None),
                token_ids,
                params.get("max_tokens"),
                self.eos_token_ids | set(params.get("stop_token_ids") or ()),
            ),
            meta={"stop_reason": getattr(output, "stop_reason", None), **extra},
        )

    def pop_steps(self, routing_key: str) -> tuple[Any, Any]:
        """The (min, max) weight version that served this session, forgotten once read."""
        return self._steps.pop(routing_key, (None, None))

    async def abort(self, rid: str) -> None:
        """Nothing to do: verl's client has no per-request abort; cancelling the call is it."""

"""vLLM's token-in / token-out wire shapes: request bodies, replies, and the logprobs probe.

Public API (for :mod:`agentrl.engines.vllm`)::

    ROUTES                                   # {"generate": path, "completions": path}
    vllm_sampling(params) -> dict            # SGLang-named params as vLLM's SamplingParams
    request_body(route, rid, ids, sampling, *, model) -> bytes
    server_request_id(route, rid) -> str     # the id the server aborts by
    parse_reply(route, data) -> ParsedReply  # ids, logprobs, finish reason, meta
    probe_body(route, temperature, *, model) -> bytes   # one token, top-5 log-probs
    probe_top(route, data) -> list[float]    # the probe's top log-probs, best first
    judge_logprobs_mode(at_1, at_half) -> str   # "processed", "raw" or "logits"

Two routes carry token ids both ways:

- ``generate``: ``POST /inference/v1/generate`` (``vllm serve --enable-scale-out`` or
  ``--tokens-only``): ``{"request_id", "token_ids", "sampling_params"}`` →
  ``choices[0].token_ids``, ``choices[0].logprobs.content[].logprob``, ``finish_reason``,
  ``stop_reason``, ``weight_versions``. The server runs it as ``generate-tokens-<id>``.
- ``completions``: ``POST /v1/completions`` with the ids as ``prompt`` and
  ``return_token_ids`` (any OpenAI-compatible vLLM server) → ``choices[0].token_ids``,
  ``choices[0].logprobs.token_logprobs``. The server runs it as ``cmpl-<id>-0``.

Both return every sampled id, the stop or EOS token included, with ``logprobs: 0`` (the
sampled token's own log-prob, no alternatives).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from agentrl import jsonio

__all__ = [
    "ROUTES",
    "ParsedReply",
    "Route",
    "WireError",
    "judge_logprobs_mode",
    "parse_reply",
    "probe_body",
    "probe_top",
    "request_body",
    "server_request_id",
    "vllm_sampling",
]

Route = Literal["generate", "completions"]
ROUTES: Mapping[Route, str] = {
    "generate": "/inference/v1/generate",
    "completions": "/v1/completions",
}

#: SGLang's names (what the middleware and slime send) for vLLM's fields of the same meaning.
_RENAMED = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "no_stop_trim": "include_stop_str_in_output",
}
#: vLLM ``SamplingParams`` fields a caller may set (its own names pass through).
_VLLM_FIELDS = frozenset(
    {
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "max_tokens",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
    }
)
#: Keys that only matter to SGLang and have no effect on the tokens; dropped.
_SGLANG_ONLY = frozenset({"stream_interval", "return_hidden_states"})
#: Keys agentrl sets itself on every request.
_OURS = frozenset({"logprobs", "n", "detokenize", "output_kind"})


class WireError(ValueError):
    """A request agentrl cannot send, or a reply it cannot read; the message says which."""


def vllm_sampling(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` (SGLang's names, or vLLM's own) as vLLM ``SamplingParams`` fields.

    Adds ``logprobs: 0`` (the sampled token's log-prob). ``top_k: -1`` (SGLang's "off")
    becomes vLLM's ``0``. A key neither engine knows, ``n`` other than 1, or a key agentrl
    sets itself raises :class:`WireError` naming it.
    """
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in _SGLANG_ONLY:
            continue
        if key in _OURS:
            if key == "n" and value in (1, None):
                continue
            raise WireError(
                f"sampling parameter {key}={value!r} cannot be sent: agentrl samples one "
                "continuation per request and sets logprobs itself"
            )
        name = _RENAMED.get(key, key)
        if name not in _VLLM_FIELDS:
            known = sorted(_VLLM_FIELDS | set(_RENAMED))
            raise WireError(
                f"sampling parameter {key!r} has no vLLM equivalent; use one of {known}"
            )
        out[name] = value
    if out.get("top_k") == -1:
        out["top_k"] = 0
    out["logprobs"] = 0
    return out


def server_request_id(route: Route, rid: str) -> str:
    """The id the server runs ``rid`` under, which its abort route expects."""
    return f"generate-tokens-{rid}" if route == "generate" else f"cmpl-{rid}-0"


def request_body(
    route: Route,
    rid: str,
    input_ids: Sequence[int],
    sampling: Mapping[str, Any],
    *,
    model: str | None,
) -> bytes:
    """The JSON body for ``route``; the ids are spliced in by :func:`jsonio.encode_ids`."""
    ids = jsonio.encode_ids(input_ids)
    if route == "generate":
        return b"".join(
            (
                b'{"request_id":',
                jsonio.dumps(rid),
                b',"token_ids":',
                ids,
                b',"sampling_params":',
                jsonio.dumps(dict(sampling)),
                b"}",
            )
        )
    fields = {**sampling, "request_id": rid, "return_token_ids": True, "stream": False}
    if model is not None:
        fields["model"] = model
    head = jsonio.dumps(fields)
    return head[:-1] + b',"prompt":' + ids + b"}"


@attrs.frozen(kw_only=True)
class ParsedReply:
    """One reply's sampled ids, their log-probs, the finish reason and what else it said."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    meta: dict[str, Any]


def _choice(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise WireError("the reply is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise WireError("expected exactly one entry in choices")
    return choices[0]


def _logprobs(route: Route, choice: dict[str, Any], count: int) -> list[float]:
    block = choice.get("logprobs")
    if not isinstance(block, dict):
        raise WireError("no logprobs in the choice; does the server return logprobs?")
    if route == "generate":
        content = block.get("content")
        if not isinstance(content, list):
            raise WireError("logprobs.content must be a list")
        values = [entry.get("logprob") if isinstance(entry, dict) else None for entry in content]
    else:
        values = block.get("token_logprobs")
        if not isinstance(values, list):
            raise WireError("logprobs.token_logprobs must be a list")
    if len(values) != count:
        raise WireError(f"{count} token ids but {len(values)} log-probs")
    try:
        return [float(value) for value in values]
    except (TypeError, ValueError):
        raise WireError("every sampled token needs a numeric log-prob") from None


def parse_reply(route: Route, data: Any) -> ParsedReply:
    """The sampled ids and log-probs of a non-streamed reply on ``route``."""
    choice = _choice(data)
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise WireError("choices[0].token_ids must be a list of ints (return_token_ids?)")
    logprobs = _logprobs(route, choice, len(ids))
    meta: dict[str, Any] = {}
    usage = data.get("usage")
    if isinstance(usage, dict):
        for key in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(key), int):
                meta[key] = usage[key]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            meta["cached_tokens"] = details["cached_tokens"]
    if choice.get("stop_reason") is not None:
        meta["matched_stop"] = choice["stop_reason"]
    spans = choice.get("weight_versions")
    if isinstance(spans, list) and spans and isinstance(spans[-1], dict):
        meta["weight_versions"] = spans
        meta["weight_version"] = spans[-1].get("version")
    finish = choice.get("finish_reason")
    return ParsedReply(
        output_ids=ids, logprobs=logprobs, finish_reason=str(finish or "stop"), meta=meta
    )


#: The probe's prompt: the first ids of any vocabulary, an input with no likely next token.
_PROBE_IDS = tuple(range(1, 17))
_PROBE_TOP = 5


def probe_body(route: Route, temperature: float, *, model: str | None) -> bytes:
    """One greedy-free, one-token request whose top-5 log-probs show the server's mode."""
    sampling = {"max_tokens": 1, "temperature": temperature, "seed": 0}
    body = jsonio.loads(request_body(route, "probe", _PROBE_IDS, sampling, model=model))
    target = body["sampling_params"] if route == "generate" else body
    target["logprobs"] = _PROBE_TOP
    body.pop("request_id", None)
    return jsonio.dumps(body)


def probe_top(route: Route, data: Any) -> list[float]:
    """The probe reply's top log-probs of its one position, best first."""
    choice = _choice(data)
    block = choice.get("logprobs")
    if not isinstance(block, dict):
        raise WireError("the probe reply has no logprobs")
    if route == "generate":
        content = block.get("content") or [{}]
        top = content[0].get("top_logprobs") if isinstance(content[0], dict) else None
        values = [entry.get("logprob") for entry in top or () if isinstance(entry, dict)]
    else:
        tops = block.get("top_logprobs") or [{}]
        values = list(tops[0].values()) if isinstance(tops[0], dict) else []
    try:
        numbers = sorted((float(v) for v in values), reverse=True)
    except (TypeError, ValueError):
        raise WireError("the probe's top log-probs are not numbers") from None
    if not numbers:
        raise WireError("the probe reply has no top log-probs")
    return numbers


def judge_logprobs_mode(at_1: Sequence[float], at_half: Sequence[float]) -> str:
    """``processed``, ``raw`` or ``logits``: what the server reports, from two probes.

    The same position is probed at temperature 1 and 0.5. Raw log-probs do not depend on
    the temperature; processed ones (after temperature, top-k, top-p) do: at 0.5 the
    distribution is sharper. Values above 0 cannot be log-probs: the server reports logits.
    """
    if max(at_1[0], at_half[0]) > 1e-6 or not all(math.isfinite(v) for v in (*at_1, *at_half)):
        return "logits"
    count = min(len(at_1), len(at_half))
    gap = max(abs(a - b) for a, b in zip(at_1[:count], at_half[:count], strict=True))
    return "raw" if gap < 1e-3 else "processed"

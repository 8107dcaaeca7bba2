"""An in-process engine that answers each call with the next scripted completion's token ids.

The ids are the tokenizer's encoding of the completion text (added tokens such as
``<think>`` and ``<tool_call>`` become their own ids, as a Qwen3 model samples them),
followed by the template's end-of-turn token when the completion stops, or cut after
``cut_after`` tokens with finish reason ``length`` and no stop token. Log-probs are
deterministic. Every call is kept (:attr:`ScriptedTokenEngine.calls`) so a report can see
the exact prompt each turn was sent.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from agentrl.engines.base import Engine, EngineError, Generation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["EngineCall", "ScriptedCompletion", "ScriptedTokenEngine", "end_of_turn_id"]


@attrs.frozen(kw_only=True)
class ScriptedCompletion:
    """What the policy samples next: its text, and where ``length`` cuts it (None: it stops)."""

    text: str
    cut_after: int | None = None


@attrs.frozen(kw_only=True)
class EngineCall:
    """One ``generate`` call: the request id, the exact prompt and what was returned."""

    rid: str | None
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: str


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token the chat template closes an assistant message with (Qwen3: ``<|im_end|>``).

    Read from the template: the first token after an assistant message's content. Falls
    back to the tokenizer's EOS id when that is not a single special token.
    """
    marker = "PREFLIGHT_END_MARKER"
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # any template failure: use the EOS id
        text = ""
    if marker in text:
        tail = text.split(marker, 1)[1].lstrip(" ")
        ids = tokenizer.encode(tail, add_special_tokens=False)
        special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        if ids and ids[0] in special:
            return int(ids[0])
    eos = getattr(tokenizer, "eos_token_id", None)
    return int(eos) if isinstance(eos, int) else None


def scripted_logprob(call_index: int, position: int, token_id: int) -> float:
    """The deterministic log-prob of one output token (in ``[-0.97, -0.01]``)."""
    return -(((call_index * 31 + position * 7 + token_id) % 97) + 1) / 100.0


class ScriptedTokenEngine(Engine):
    """An :class:`~agentrl.engines.base.Engine` that replays queued completions, in order."""

    name: ClassVar[str] = "preflight-scripted"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.stop_id = end_of_turn_id(tokenizer)
        self._queue: collections.deque[ScriptedCompletion] = collections.deque()
        #: Every call, in order.
        self.calls: list[EngineCall] = []

    def queue(self, completion: ScriptedCompletion) -> None:
        """Answer a later call with ``completion`` (first in, first out)."""
        self._queue.append(completion)

    def pending(self) -> int:
        """How many queued completions no call has taken yet."""
        return len(self._queue)

    def token_ids(self, completion: ScriptedCompletion) -> tuple[list[int], str]:
        """The ids the policy samples for ``completion`` and its finish reason."""
        ids = list(self.tokenizer.encode(completion.text, add_special_tokens=False))
        if completion.cut_after is not None and completion.cut_after < len(ids):
            return ids[: completion.cut_after], "length"
        if self.stop_id is not None:
            ids.append(self.stop_id)
        return ids, "stop"

    async def generate(
        self, input_ids: Sequence[int], sampling_params: Mapping[str, Any], **request: str | None
    ) -> Generation:
        """The next queued completion's ids, cut to ``max_new_tokens`` like a real engine.

        ``request`` holds the contract's ``rid`` and ``routing_key``; ``rid`` is recorded.
        """
        rid = request.get("rid")
        if not self._queue:
            raise EngineError(f"no scripted completion queued for request {rid!r}")
        ids, finish = self.token_ids(self._queue.popleft())
        limit = sampling_params.get("max_new_tokens")
        if limit is not None and len(ids) > int(limit):
            ids, finish = ids[: int(limit)], "length"
        index = len(self.calls)
        logprobs = [scripted_logprob(index, p, t) for p, t in enumerate(ids)]
        self.calls.append(
            EngineCall(
                rid=rid, input_ids=tuple(input_ids), output_ids=tuple(ids), finish_reason=finish
            )
        )
        return Generation(output_ids=ids, logprobs=logprobs, finish_reason=finish)

"""Batched sampling for the ``transformers`` engine: concurrent requests decoded together.

A small model on a CPU spends most of a decoding step on per-call overhead, so sixteen
sequences cost about what one does. With ``batch_size`` above 1, requests that arrive
while the model is busy (or within ``batch_wait`` seconds of the first) and share their
sampling parameters are decoded in one ``model.generate`` call over left-padded prompts.
Each token's log-prob is read from the scores ``generate`` sampled from (after
temperature, top-k, top-p and min-p), so it is the sampled distribution's, as the
unbatched path reports it; greedy tokens report 0.0. Requests with a ``sampling_seed`` or
``ignore_eos`` take the unbatched path (a batch shares one random stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from agentrl.engines.base import Generation

__all__ = ["Batcher", "batchable", "generate_batch"]

logger = logging.getLogger(__name__)


def batchable(params: dict[str, Any]) -> bool:
    """Whether a request can share a batch (no seed of its own, EOS honoured)."""
    return params.get("sampling_seed") is None and not params.get("ignore_eos")


def _key(params: dict[str, Any]) -> tuple[Any, ...]:
    return (
        float(params.get("temperature", 1.0)),
        float(params.get("top_p", 1.0)),
        int(params.get("top_k", -1)),
        float(params.get("min_p", 0.0)),
        int(params.get("max_new_tokens", 128)),
        tuple(sorted(params.get("stop_token_ids") or ())),
    )


@attrs.define(eq=False)
class _Request:
    input_ids: list[int]
    params: dict[str, Any]
    rid: str
    future: asyncio.Future[Generation]


@attrs.define(eq=False)
class Batcher:
    """Collects requests on the event loop and runs each batch with ``run`` (a thread hop)."""

    run: Callable[[list[list[int]], dict[str, Any], list[str]], Any]
    batch_size: int
    batch_wait: float
    _pending: list[_Request] = attrs.field(factory=list)
    _draining: asyncio.Task[None] | None = None

    async def submit(self, input_ids: list[int], params: dict[str, Any], rid: str) -> Generation:
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(input_ids, params, rid, future))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(self.batch_wait)
        while self._pending:
            self._pending = [r for r in self._pending if not r.future.cancelled()]
            if not self._pending:
                break
            key = _key(self._pending[0].params)
            batch = [r for r in self._pending if _key(r.params) == key][: self.batch_size]
            self._pending = [r for r in self._pending if r not in batch]
            try:
                results = await self.run(
                    [r.input_ids for r in batch], batch[0].params, [r.rid for r in batch]
                )
            except Exception as exc:  # every request of the batch gets the error
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            for request, result in zip(batch, results, strict=True):
                if not request.future.done():
                    request.future.set_result(result)


def generate_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    params: dict[str, Any],
    rids: Sequence[str],
    *,
    stop_ids: set[int],
    pad_id: int,
    device: str,
) -> list[Generation]:
    """Sample a continuation of every prompt in one ``model.generate`` call."""
    import torch
    from transformers import GenerationConfig

    temperature = float(params.get("temperature", 1.0))
    top_k = int(params.get("top_k", -1))
    min_p = float(params.get("min_p", 0.0))
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sample = temperature > 0.0
    config = GenerationConfig(
        do_sample=sample,
        temperature=temperature if sample else None,
        top_p=float(params.get("top_p", 1.0)) if sample else None,
        # 0, not None: GenerationConfig's default top_k is 50.
        top_k=top_k if sample and top_k > 0 else 0,
        min_p=min_p if sample and min_p > 0 else None,
        max_new_tokens=int(params.get("max_new_tokens", 128)),
        eos_token_id=sorted(stop_ids) or None,
        pad_token_id=pad_id,
        output_scores=True,
        return_dict_in_generate=True,
        use_cache=True,
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
        )
        new = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1).float()  # (batch, steps, vocab)
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    results = []
    for row, rid in enumerate(rids):
        ids = [int(t) for t in new[row]]
        finish = "length"
        for n, token in enumerate(ids):
            if token in stop_ids:
                ids, finish = ids[: n + 1], "stop"
                break
        lps = [float(v) for v in logprobs[row, : len(ids)]] if sample else [0.0] * len(ids)
        results.append(
            Generation(
                output_ids=ids,
                logprobs=lps,
                finish_reason=finish,
                meta={"rid": rid, "prompt_tokens": len(prompts[row]), "batch": len(rids)},
            )
        )
    return results

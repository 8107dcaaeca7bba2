"""The ``transformers`` engine: a Hugging Face causal LM run in-process (CPU demos, tests).

Public API::

    engine = TransformersEngine.from_options(options, model_path=path)   # how commands build it
    engine = TransformersEngine(model_path, *, device="cpu", dtype="float32", seed=None,
                                stop_token_ids=None, batch_size=1, batch_wait=0.05)
    engine = TransformersEngine.from_model(model, *, seed=None, stop_token_ids=None,
                                           batch_size=1, batch_wait=0.05)
    await engine.generate(input_ids, sampling_params, *, rid=None, routing_key=None) -> Generation
    await engine.abort(rid)      # the request stops after its current token, finish "abort"
    await engine.health()        # ready unless closed or the model failed to load
    await engine.aclose()

``model_path`` must be a local directory (config.json plus weights); nothing is fetched
from the hub. ``sampling_params`` follow SGLang's names: ``temperature`` (default 1.0; 0
means greedy), ``top_p`` (1.0), ``top_k`` (-1 = off), ``min_p`` (0), ``max_new_tokens``
(128), ``stop_token_ids`` (added to the model's EOS ids unless ``ignore_eos``) and
``sampling_seed``. Unsupported keys (``stop`` strings, penalties) are ignored with a
debug log. The reported log-prob of each token is under the distribution it was actually
sampled from — after temperature, top-k, top-p and min-p, renormalised — so greedy
tokens report 0.0. ``from_model`` serves a model already in memory (a trainer's policy,
``agentrl.trl``): each generation runs it in eval mode under ``torch.no_grad`` and puts
its training mode back, so the tokens come from the weights being trained, with no copy
and no weight sync. Decoding runs in a worker thread (one request at a time; the model is
not re-entrant) so the event loop stays free. ``batch_size`` above 1 decodes concurrent
requests together (``agentrl.engines.transformers_batch``: many rollouts at once on a
CPU). torch and transformers load on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from agentrl.engines.base import Engine, EngineError, EngineLocation, Generation
from agentrl.engines.transformers_batch import Batcher, batchable, generate_batch
from agentrl.extras import install_hint

__all__ = ["TransformersEngine"]

logger = logging.getLogger(__name__)

_SUPPORTED = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_new_tokens",
    "stop_token_ids",
    "ignore_eos",
    "sampling_seed",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
}


class TransformersEngine(Engine):
    """Samples from a local Hugging Face causal LM, recording each token's log-prob."""

    name: ClassVar[str] = "transformers"
    location: ClassVar[EngineLocation] = "model_path"
    location_hint: ClassVar[str] = "a local model directory"

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        batch_size: int = 1,
        batch_wait: float = 0.05,
    ) -> None:
        path = Path(model_path).expanduser()
        if not path.is_dir() or not (path / "config.json").is_file():
            raise EngineError(
                f"transformers engine: {str(path)!r} is not a local model directory (expected "
                "config.json and weights there; download the model first, nothing is fetched)"
            )
        self._setup(
            path,
            device=device,
            dtype=dtype,
            seed=seed,
            stop_token_ids=stop_token_ids,
            batch_size=batch_size,
            batch_wait=batch_wait,
        )

    def _setup(
        self,
        path: Path,
        *,
        device: str,
        dtype: str,
        seed: int | None,
        stop_token_ids: Sequence[int] | None,
        batch_size: int,
        batch_wait: float,
    ) -> None:
        """The engine's state with no model yet (``__init__`` and ``from_model`` both)."""
        if batch_size < 1 or batch_wait < 0:
            raise EngineError(
                f"transformers engine: batch_size must be >= 1 and batch_wait >= 0, got "
                f"{batch_size} and {batch_wait}"
            )
        self.model_path = path
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.extra_stop_ids = tuple(stop_token_ids or ())
        self._model: Any = None
        self._cache_arg = "past_key_values"
        self._eos_ids: tuple[int, ...] = ()
        self._load_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-hf")
        self._cancelled: set[str] = set()
        self._running: set[str] = set()
        self._closed = False
        self._load_error: str | None = None
        #: A model handed in by ``from_model`` (borrowed: its training mode is restored).
        self._borrowed = False
        self._batcher = (
            Batcher(run=self._run_batch, batch_size=batch_size, batch_wait=batch_wait)
            if batch_size > 1
            else None
        )

    @classmethod
    def from_model(
        cls,
        model: Any,
        *,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        batch_size: int = 1,
        batch_wait: float = 0.05,
    ) -> TransformersEngine:
        """Serve ``model``, a causal LM already loaded (e.g. ``trainer.model``), in place.

        The engine never changes its weights: each generation switches it to eval mode,
        runs under ``torch.no_grad`` and restores the mode it found. Its device is the
        model's.
        """
        engine = cls.__new__(cls)
        weights = next(model.parameters())
        engine._setup(
            Path(str(getattr(model, "name_or_path", "") or ".")),
            device=str(weights.device),
            dtype=str(weights.dtype).removeprefix("torch."),
            seed=seed,
            stop_token_ids=stop_token_ids,
            batch_size=batch_size,
            batch_wait=batch_wait,
        )
        engine._adopt(model)
        engine._borrowed = True
        return engine

    # -- model -----------------------------------------------------------------
    def _load(self) -> Any:
        with self._load_lock:
            if self._model is not None:
                return self._model
            try:
                return self._load_model()
            except EngineError as exc:
                self._load_error = str(exc)
                raise

    def _load_model(self) -> Any:
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as exc:
            raise EngineError(
                "the transformers engine needs torch and transformers; install them with: "
                f"{install_hint('hf')} (without a GPU, install a CPU build of torch first)"
            ) from exc
        import transformers

        # transformers renamed torch_dtype to dtype in 4.56.
        major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
        dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(self.model_path),
                local_files_only=True,
                **{dtype_arg: getattr(torch, self.dtype)},
            )
        except Exception as exc:
            raise EngineError(
                f"transformers engine could not load the model at {str(self.model_path)!r}: {exc}"
            ) from exc
        model.to(self.device).eval()
        self._adopt(model)
        return model

    def _adopt(self, model: Any) -> None:
        """Read what generation needs from a loaded model (EOS ids, the cache argument)."""
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(model.config, "eos_token_id", None)
        if isinstance(eos, int):
            eos = [eos]
        self._eos_ids = tuple(eos or ())
        # transformers 5 renamed the KV-cache argument from past_key_values to cache.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._model = model

    # -- engine API --------------------------------------------------------------
    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        routing_key: str | None = None,
    ) -> Generation:
        """Sample a continuation in the worker thread; cancellation stops it promptly."""
        rid = rid or uuid.uuid4().hex
        if not input_ids:
            raise EngineError("transformers engine: input_ids is empty; expected a prompt")
        ignored = sorted(set(sampling_params) - _SUPPORTED)
        if ignored:
            logger.debug("transformers engine ignores sampling params %s", ignored)
        if self._batcher is not None and batchable(dict(sampling_params)):
            return await self._batcher.submit(list(input_ids), dict(sampling_params), rid)
        loop = asyncio.get_running_loop()
        self._running.add(rid)
        future = loop.run_in_executor(
            self._executor, self._generate_sync, list(input_ids), dict(sampling_params), rid
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self._cancelled.add(rid)
            raise
        finally:
            if future.done():
                self._running.discard(rid)
                self._cancelled.discard(rid)
            else:
                future.add_done_callback(lambda _f: self._forget(rid))

    def _forget(self, rid: str) -> None:
        self._running.discard(rid)
        self._cancelled.discard(rid)

    async def health(self) -> None:
        """Ready once constructed (the model loads on the first request) until closed.

        A model that failed to load makes the engine unhealthy, with the load error.
        """
        if self._closed:
            raise EngineError("the transformers engine is closed")
        if self._load_error is not None:
            raise EngineError(self._load_error)

    async def abort(self, rid: str) -> None:
        """Stop ``rid`` after its current token, or before its first if it has not started."""
        self._cancelled.add(rid)
        if len(self._cancelled) > 10_000:
            # Aborts for requests that never arrived must not accumulate forever.
            self._cancelled &= self._running | {rid}

    async def aclose(self) -> None:
        """Stop the worker thread (waits for the current token) and drop the model."""
        self._closed = True
        self._cancelled.update(self._running)
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        self._model = None

    # -- sampling ------------------------------------------------------------------
    async def _run_batch(
        self, prompts: list[list[int]], params: dict[str, Any], rids: list[str]
    ) -> list[Generation]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self._generate_batch_sync, prompts, params, rids
        )

    def _generate_batch_sync(
        self, prompts: list[list[int]], params: dict[str, Any], rids: list[str]
    ) -> list[Generation]:
        model = self._load()
        stop_ids = set(params.get("stop_token_ids") or ()) | set(self.extra_stop_ids)
        stop_ids |= set(self._eos_ids)
        pad = getattr(model.generation_config, "pad_token_id", None)
        pad = pad if isinstance(pad, int) else (self._eos_ids or (0,))[0]
        with _eval_mode(model):
            return generate_batch(
                model, prompts, params, rids, stop_ids=stop_ids, pad_id=pad, device=self.device
            )

    def _generate_sync(self, input_ids: list[int], params: dict[str, Any], rid: str) -> Generation:
        import torch

        model = self._load()
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1))
        min_p = float(params.get("min_p", 0.0))
        max_new = int(params.get("max_new_tokens", 128))
        stop_ids = set(params.get("stop_token_ids") or ()) | set(self.extra_stop_ids)
        if not params.get("ignore_eos"):
            stop_ids |= set(self._eos_ids)
        seed = params.get("sampling_seed", self.seed)
        generator = torch.Generator(device=self.device)
        if seed is not None:
            generator.manual_seed(int(seed))
        else:
            generator.seed()

        output_ids: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        # A borrowed model's tensors may meet autograd later: no_grad, not inference_mode.
        guard = torch.no_grad() if self._borrowed else torch.inference_mode()
        with _eval_mode(model), guard:
            tokens = torch.tensor([input_ids], device=self.device)
            past = None
            for _ in range(max_new):
                if rid in self._cancelled:
                    finish = "abort"
                    break
                out = model(input_ids=tokens, use_cache=True, **{self._cache_arg: past})
                past = getattr(out, self._cache_arg, None)
                logits = out.logits[0, -1].float()
                token, logprob = _sample(
                    logits, temperature, top_p, top_k, min_p, generator=generator
                )
                output_ids.append(token)
                logprobs.append(logprob)
                if token in stop_ids:
                    finish = "stop"
                    break
                tokens = torch.tensor([[token]], device=self.device)
        return Generation(
            output_ids=output_ids,
            logprobs=logprobs,
            finish_reason=finish,
            meta={"rid": rid, "prompt_tokens": len(input_ids)},
        )


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode for the block; a model found training is put back to it."""
    training = bool(getattr(model, "training", False))
    if training:
        model.eval()
    try:
        yield
    finally:
        if training:
            model.train()


def _sample(
    logits: Any, temperature: float, top_p: float, top_k: int, min_p: float, *, generator: Any
) -> tuple[int, float]:
    """Sample one token; return it with its log-prob under the (filtered) sampling distribution."""
    import torch

    if temperature <= 0.0:
        return int(torch.argmax(logits).item()), 0.0
    scores = logits / temperature
    if 0 < top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if min_p > 0.0:
        probs = torch.softmax(scores, dim=-1)
        scores = scores.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_scores, dim=-1), dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= top_p
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    log_probs = torch.log_softmax(scores, dim=-1)
    token = int(torch.multinomial(log_probs.exp(), 1, generator=generator).item())
    return token, float(log_probs[token].item())

"""The engine contract: token ids in, sampled token ids and their log-probs out."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import attrs

__all__ = ["TOKEN_EXACT_SAMPLING", "Engine", "EngineError", "Generation"]

#: Sampling parameters every token-in-token-out request carries (SGLang's names): the
#: engine must return the exact ids, special tokens included, with no stop trimming.
TOKEN_EXACT_SAMPLING: Mapping[str, Any] = MappingProxyType(
    {
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
)


class EngineError(Exception):
    """The engine failed to produce a generation (HTTP error, crash, bad response)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@attrs.frozen(kw_only=True)
class Generation:
    """One engine call's result: exactly what was sampled."""

    output_ids: tuple[int, ...] = attrs.field(converter=tuple)
    logprobs: tuple[float, ...] = attrs.field(converter=tuple)
    finish_reason: str = "stop"
    meta: dict[str, Any] = attrs.field(factory=dict)

    @logprobs.validator
    def _same_length(self, attribute: attrs.Attribute, value: tuple[float, ...]) -> None:
        if len(value) != len(self.output_ids):
            raise ValueError(
                f"Generation.logprobs: expected {len(self.output_ids)} values "
                f"(one per output id), got {len(value)}"
            )


class Engine(abc.ABC):
    """A token-level inference engine. One core async method, plus health, abort and close."""

    name: ClassVar[str]

    @abc.abstractmethod
    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        routing_key: str | None = None,
    ) -> Generation:
        """Sample a continuation of ``input_ids``.

        Cancelling the call stops the request on the engine (an HTTP engine sends its
        abort for ``rid``): callers such as the middleware rely on it and abort nothing
        themselves.
        """

    async def health(self) -> None:  # noqa: B027 - in-process engines are always ready
        """Check cheaply that the engine can serve now; raise :class:`EngineError` saying why not.

        The middleware's ``/healthz`` and ``agentrl serve``'s start-up check call it. It must
        be quick (a probe, never a generation that waits behind real requests) and must not
        raise anything but ``EngineError``. The default answers ready.
        """

    async def abort(self, rid: str) -> None:  # noqa: B027 - optional for in-process engines
        """Cancel the in-flight request ``rid`` (best effort, never raises)."""

    async def aclose(self) -> None:  # noqa: B027
        """Release connections and resources."""

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

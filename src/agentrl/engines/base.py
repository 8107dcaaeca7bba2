"""The engine contract: token ids in, sampled token ids and their log-probs out.

Every command builds an engine one way, ``cls.from_options(options, url=..., model_path=...)``:
``url`` (a server) and ``model_path`` (a local model directory) are the generic places an
engine can run (``--engine-url``, ``--model-path``/``--model``), ``options`` its own keyword
options. Each engine says which of them it needs (``check_options``), so no caller knows
engine names.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Literal, TypeVar

import attrs

from agentrl.plugin_options import check_option_keys, keyword_parameters

__all__ = [
    "TOKEN_EXACT_SAMPLING",
    "Engine",
    "EngineAbortedError",
    "EngineError",
    "EngineLocation",
    "Generation",
    "MissingEngineOptionError",
    "body_excerpt",
]

#: The generic options saying where an engine runs: a server URL or a local model directory.
EngineLocation = Literal["url", "model_path"]

_EngineT = TypeVar("_EngineT", bound="Engine")

#: Sampling parameters every token-in-token-out request carries (SGLang's names): the
#: engine must return the exact ids, special tokens included, with no stop trimming.
TOKEN_EXACT_SAMPLING: Mapping[str, Any] = MappingProxyType(
    {
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
)


#: The most of a reply's body an error message quotes, in characters.
EXCERPT_CHARS = 500


def body_excerpt(body: str | bytes) -> str:
    """The start of a reply's body for an error message: stripped, cut at ``EXCERPT_CHARS``."""
    if isinstance(body, bytes):
        body = body[: 4 * EXCERPT_CHARS + 4].decode("utf-8", "replace")
    text = body.strip()
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"


class EngineError(Exception):
    """The engine failed to produce a generation (HTTP error, crash, bad response)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class EngineAbortedError(EngineError):
    """The engine aborted one turn's generation too many times in a row; the turn gave up.

    An engine aborts a generation when its trainer asks (a weight update, the end of a
    rollout step); the middleware continues such a generation from what was sampled, and
    raises this when the engine aborted it ``max_engine_aborts`` times in a row.
    """

    def __init__(self, message: str, *, aborts: int = 0, sampled: int = 0) -> None:
        super().__init__(message)
        #: How many times in a row the engine aborted the turn's generation.
        self.aborts = aborts
        #: Output tokens sampled before the last abort, all attempts together.
        self.sampled = sampled


class MissingEngineOptionError(ValueError):
    """The engine needs a generic option (``url`` or ``model_path``) that was not given.

    Each command names its own flag for it: :meth:`for_flags` writes the message.
    """

    def __init__(self, engine: str, option: EngineLocation, hint: str) -> None:
        self.engine = engine
        self.option: EngineLocation = option
        self.hint = hint
        super().__init__(f"the {engine!r} engine needs {option} ({hint})")

    def for_flags(self, flags: Mapping[EngineLocation, str]) -> str:
        """The message naming the command's flag, e.g. ``--engine sglang needs --engine-url (…)``."""
        return f"--engine {self.engine} needs {flags[self.option]} ({self.hint})"


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

    #: The generic option the engine is built from, passed as its first argument: ``"url"``
    #: (a server), ``"model_path"`` (a local model directory) or None (neither).
    location: ClassVar[EngineLocation | None] = None
    #: What ``location`` is, for the error when it is missing ("a local model directory").
    location_hint: ClassVar[str] = ""

    @classmethod
    def option_names(cls) -> frozenset[str] | None:
        """The keys of ``options`` that ``from_options`` accepts; None when any key may be valid.

        By default the constructor's keyword parameters after the ``location`` argument
        (None when it takes ``**kwargs``). An engine whose options go elsewhere overrides it.
        """
        return keyword_parameters(cls, positional=1 if cls.location else 0)

    @classmethod
    def check_options(
        cls,
        options: Mapping[str, Any],
        *,
        url: str | None = None,
        model_path: str | None = None,
    ) -> None:
        """Fail, before anything starts, when the engine cannot be built from these options.

        Raises :class:`MissingEngineOptionError` when the engine's ``location`` was not
        given and ``OptionsError`` (listing the valid keys) for a key of ``options`` the
        engine does not take.
        """
        if cls.location is not None and not {"url": url, "model_path": model_path}[cls.location]:
            raise MissingEngineOptionError(cls.name, cls.location, cls.location_hint)
        check_option_keys(f"the {cls.name!r} engine", options, cls.option_names())

    @classmethod
    def from_options(
        cls: type[_EngineT],
        options: Mapping[str, Any] | None = None,
        *,
        url: str | None = None,
        model_path: str | None = None,
    ) -> _EngineT:
        """Build the engine from the generic options (``agentrl rollout``, ``serve``, slime alike).

        Checks them first (:meth:`check_options`), then calls the constructor with the
        ``location`` value (when the engine has one) and ``options`` as keyword arguments.
        An engine built another way overrides this classmethod.
        """
        options = dict(options or {})
        cls.check_options(options, url=url, model_path=model_path)
        if cls.location is None:
            return cls(**options)
        return cls({"url": url, "model_path": model_path}[cls.location], **options)

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

        A generation the engine aborts on its own (a trainer's weight update, slime's
        ``abort_all``) is no error: it returns ``finish_reason`` ``"abort"`` with the ids
        and log-probs sampled before the abort (possibly none), so the caller can continue
        it (the middleware does). Cancelling the call stops the request on the engine (an
        HTTP engine sends its abort for ``rid``): callers such as the middleware rely on it
        and abort nothing themselves.
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

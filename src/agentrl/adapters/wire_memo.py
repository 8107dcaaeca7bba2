"""A session's memory of its previous request: unchanged messages are not translated again.

Public API::

    memo = TranslationMemo()                       # one per session (Session.translations)
    with translating(memo):                        # around adapter.parse_request
        parts = current_memo().translate(raw_messages, translate_one)
        messages = current_memo().intern(messages)

A client resends the whole conversation every turn, and all but its newest messages are
exactly those of its previous request. :meth:`TranslationMemo.translate` gives a raw
message whose JSON is exactly the previous request's at its position (the same types and
key order, :func:`~agentrl.adapters.keys.same_exact_key`) the chat messages it became
then, the same objects; only the others are translated. A message's translation depends
on nothing but the message, so this is what translating it again would give. Reusing the
objects also lets everything downstream that caches by object (the exact keys of
replays, splice digests, the trajectory's message keys) find them at once.
:meth:`TranslationMemo.intern` does the same for the chat messages built after
translation (the leading system message the fold writes anew each time).

The memo holds the raw messages of the previous request, each as the request it first
came in had it (so their text is the text of the chat messages the session holds anyway,
not a second copy). A session's requests are translated one at a time
(:mod:`agentrl.adapters.offload`), so the memo needs no lock.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from agentrl.adapters.keys import same_exact_key

__all__ = ["TranslationMemo", "current_memo", "translating"]

_T = TypeVar("_T")

_current: contextvars.ContextVar[TranslationMemo | None] = contextvars.ContextVar(
    "agentrl_translation_memo", default=None
)


class TranslationMemo:
    """One session's previous request: its raw messages, what each became, its messages."""

    __slots__ = ("_messages", "_parts", "_raw")

    def __init__(self) -> None:
        self._raw: list[Any] = []
        self._parts: list[Any] = []
        self._messages: list[Any] = []

    def translate(self, raw: Sequence[Any], translate_one: Callable[[int, Any], _T]) -> list[_T]:
        """``translate_one(i, raw[i])`` for each message, or what it gave the previous
        request for a message exactly equal to that request's at the same position."""
        previous, parts = self._raw, self._parts
        kept, out = [], []
        for position, message in enumerate(raw):
            if position < len(previous) and same_exact_key(message, previous[position]):
                # The earlier object stays: its text is the text its chat messages hold.
                kept.append(previous[position])
                out.append(parts[position])
            else:
                kept.append(message)
                out.append(translate_one(position, message))
        self._raw, self._parts = kept, out
        return out

    def intern(self, messages: list[Any]) -> list[Any]:
        """``messages`` with each one exactly equal to the previous request's message at its
        position replaced by that object (the list is changed in place and returned)."""
        previous = self._messages
        for position in range(min(len(messages), len(previous))):
            message = messages[position]
            if message is not previous[position] and same_exact_key(message, previous[position]):
                messages[position] = previous[position]
        self._messages = list(messages)
        return messages


def current_memo() -> TranslationMemo | None:
    """The memo of the request being translated (None outside :func:`translating`)."""
    return _current.get()


@contextlib.contextmanager
def translating(memo: TranslationMemo | None) -> Iterator[None]:
    """Translate the requests inside with ``memo`` (None: without one)."""
    token = _current.set(memo)
    try:
        yield
    finally:
        _current.reset(token)

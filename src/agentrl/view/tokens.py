"""Token ids to text, one string per id, for the token view.

Samples hold ids only. :class:`TokenText` decodes each distinct id once, in one batch
(a 128k-token sample has a few thousand distinct ids), with the run's tokenizer; without
one (none recorded, none loadable) every id shows as ``⟨id⟩``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["TokenText", "load_token_text"]


class TokenText:
    """Per-id text of a tokenizer (or of none), cached across samples."""

    def __init__(self, tokenizer: Any = None, name: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self._cache: dict[int, str] = {}
        # A fast tokenizer refuses concurrent use ("Already borrowed"): the server's
        # requests decode one at a time.
        self._lock = threading.Lock()
        self._size = len(tokenizer) if tokenizer is not None else 0

    @property
    def decodes(self) -> bool:
        """Whether ids become text (False: ids are shown as numbers)."""
        return self.tokenizer is not None

    def vocab(self, ids: Iterable[int]) -> dict[str, str]:
        """``{str(id): text}`` for every distinct id in ``ids``."""
        distinct = set(ids)
        with self._lock:
            missing = [i for i in distinct if i not in self._cache]
            if missing:
                self._cache.update(zip(missing, self._decode(missing), strict=True))
            return {str(i): self._cache[i] for i in distinct}

    def _decode(self, ids: list[int]) -> list[str]:
        if self.tokenizer is None:
            return [f"⟨{i}⟩" for i in ids]
        known = [i for i in ids if 0 <= i < self._size]
        try:
            texts = self.tokenizer.batch_decode(
                [[i] for i in known], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        except Exception:  # a tokenizer that cannot decode one of them: ids for all
            logger.warning("the tokenizer could not decode the ids; showing ids", exc_info=True)
            texts = [f"⟨{i}⟩" for i in known]
        decoded = dict(zip(known, texts, strict=True))
        return [decoded.get(i, f"⟨{i}⟩") for i in ids]


def load_token_text(path: str | None) -> TokenText:
    """A :class:`TokenText` of the tokenizer at ``path``; ids only when it cannot load.

    Loaded once per path in a process (a tokenizer takes seconds to load).
    """
    if not path:
        return TokenText()
    return _load_token_text(str(path))


@functools.lru_cache(maxsize=4)
def _load_token_text(path: str) -> TokenText:
    from agentrl.tokenizers import load_tokenizer

    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:
        logger.warning("tokenizer %s: %s; showing token ids", path, exc)
        return TokenText()
    return TokenText(tokenizer, name=str(path))

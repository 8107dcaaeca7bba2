"""Word-level statistics over plain text."""

from __future__ import annotations

import collections
import string

_PUNCTUATION = string.punctuation + "“”‘’"


def words(text: str) -> list[str]:
    """The words of ``text``, lower-cased, with surrounding punctuation removed."""
    result = []
    for token in text.split(" "):
        token = token.strip(_PUNCTUATION).lower()
        result.append(token)
    return result


def word_count(text: str) -> int:
    """How many words ``text`` contains."""
    return len(words(text))


def most_common(text: str, n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` most frequent words with their counts, most frequent first."""
    return collections.Counter(words(text)).most_common(n)


def average_word_length(text: str) -> float:
    """The mean length of the words in ``text`` (0.0 for text without words)."""
    found = words(text)
    if not found:
        return 0.0
    return sum(len(word) for word in found) / len(found)

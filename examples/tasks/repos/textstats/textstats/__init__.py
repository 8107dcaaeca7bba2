"""Small text statistics helpers."""

from textstats.core import average_word_length, most_common, word_count, words

__all__ = ["average_word_length", "most_common", "word_count", "words"]

"""Slugs: lower-case ASCII words joined by a separator."""

from __future__ import annotations

import unicodedata
from collections.abc import Container


def slugify(title: str, separator: str = "-") -> str:
    """``title`` as a slug: accents dropped, lower-case, words joined by ``separator``."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    pieces = []
    for char in ascii_title.lower():
        pieces.append(char if char.isalnum() else separator)
    return "".join(pieces)


def unique_slug(title: str, taken: Container[str], separator: str = "-") -> str:
    """A slug for ``title`` not in ``taken``, numbered ``-2``, ``-3``, … when needed."""
    base = slugify(title, separator)
    if base not in taken:
        return base
    number = 2
    while f"{base}{separator}{number}" in taken:
        number += 1
    return f"{base}{separator}{number}"

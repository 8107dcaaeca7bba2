"""Semantic versions ``MAJOR.MINOR.PATCH[-PRERELEASE]``."""

from __future__ import annotations

import re
from typing import NamedTuple

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$")


class Version(NamedTuple):
    major: str
    minor: str
    patch: str
    prerelease: str | None = None

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{self.prerelease}" if self.prerelease else core


def parse(text: str) -> Version:
    """Parse ``text`` (a leading ``v`` is allowed); raise ``ValueError`` if it is no version."""
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a semantic version: {text!r}")
    major, minor, patch, prerelease = match.groups()
    return Version(major, minor, patch, prerelease)


def compare(left: str, right: str) -> int:
    """-1, 0 or 1 as version ``left`` is lower than, equal to or higher than ``right``.

    A pre-release sorts before its release: ``1.0.0-rc.1 < 1.0.0``.
    """
    a, b = parse(left), parse(right)
    core_a, core_b = a[:3], b[:3]
    if core_a != core_b:
        return -1 if core_a < core_b else 1
    if a.prerelease == b.prerelease:
        return 0
    if a.prerelease is None:
        return 1
    if b.prerelease is None:
        return -1
    return -1 if a.prerelease < b.prerelease else 1

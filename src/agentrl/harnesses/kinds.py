"""Install kinds: where a harness's agent CLI comes from (npm, Python, or the image).

A harness class states ``install_kind`` (see :mod:`agentrl.harnesses.base`). These helpers
check that the class states what its kind needs, say how to install a missing CLI, and
check the version a sandbox reports against the harness's ``min_version``.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.harnesses.errors import HarnessError

__all__ = [
    "INSTALL_KINDS",
    "check_install_kind",
    "check_min_version",
    "install_hint",
    "install_kind",
    "needs_host_install",
    "package_of",
    "parse_version",
]

#: The kinds a harness may state; ``npm`` is the default.
INSTALL_KINDS = ("npm", "python", "image")
_NEEDS = {"npm": ("npm_package",), "python": ("python_package", "python_module"), "image": ()}
_VERSION = re.compile(r"\b(\d+(?:\.\d+)+)")


def install_kind(harness: Any) -> str:
    """The install kind of a harness class or instance (``npm`` when it states none)."""
    return getattr(harness, "install_kind", "npm") or "npm"


def needs_host_install(harness: Any) -> bool:
    """Whether the CLI comes from a host install (npm, python) rather than the image."""
    return install_kind(harness) != "image"


def package_of(harness: Any) -> str:
    """The package that provides the CLI, as a person would name it in an install command."""
    kind = install_kind(harness)
    if kind == "npm":
        return f"npm package {getattr(harness, 'npm_package', '') or harness.binary}"
    if kind == "python":
        return f"Python package {harness.python_package}"
    return f"`{harness.binary}` on the image's PATH"


def check_install_kind(harness: Any) -> None:
    """Raise ``HarnessError`` when a harness states an unknown kind or leaves out what it needs."""
    name, kind = getattr(harness, "name", type(harness).__name__), install_kind(harness)
    if kind not in INSTALL_KINDS:
        raise HarnessError(
            f"{name}: install_kind {kind!r} is not one of {', '.join(INSTALL_KINDS)}; "
            "set the class attribute install_kind to one of them"
        )
    missing = [attr for attr in _NEEDS[kind] if not getattr(harness, attr, "")]
    if missing:
        raise HarnessError(
            f"{name}: install_kind {kind!r} needs the class attribute(s) {', '.join(missing)}"
        )
    if kind != "npm" and (
        getattr(harness, "tarballs", ()) or getattr(harness, "node_tarball", None)
    ):
        raise HarnessError(
            f"{name}: tarballs= and node_tarball= are npm tarballs, but the CLI is the "
            f"{package_of(harness)}; drop them"
        )


def install_hint(harness: Any) -> str:
    """What to do about a missing CLI, for an error message."""
    kind = install_kind(harness)
    if kind == "image":
        return (
            f"The {_name(harness)} harness runs `{harness.binary}` from the sandbox's "
            f"image: use an image that has it on PATH, or give the harness cli_path="
        )
    source = "" if kind == "python" else " or tarballs="
    return (
        f"Install the {package_of(harness)} with `agentrl install-clis` (agentrl rollout "
        f"then finds it; or pass --cli-dir), or give the harness cli_path={source}"
    )


def _name(harness: Any) -> str:
    return getattr(harness, "name", type(harness).__name__)


def parse_version(text: str) -> tuple[int, ...] | None:
    """The first dotted version number in ``text`` (``Python 3.11.2`` -> ``(3, 11, 2)``)."""
    match = _VERSION.search(text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def check_min_version(harness: Any, output: str) -> None:
    """Raise ``HarnessError`` when ``output`` (of the version probe) is below ``min_version``."""
    minimum = getattr(harness, "min_version", None)
    if not minimum:
        return
    found, wanted = parse_version(output), parse_version(minimum)
    probe = " ".join((harness.binary, *getattr(harness, "version_args", ("--version",))))
    if found is None:
        raise HarnessError(
            f"{_name(harness)}: `{probe}` printed no version number ({output.strip()[:200]!r}) "
            f"and the harness needs at least {minimum}; check the sandbox's {harness.binary}"
        )
    if wanted is not None and found < wanted:
        where = (
            "use an image with a newer one"
            if install_kind(harness) == "image"
            else "install the pinned version with `agentrl install-clis`"
        )
        raise HarnessError(
            f"{_name(harness)}: the sandbox's {harness.binary} is version "
            f"{'.'.join(map(str, found))}, older than the {minimum} the harness needs; {where}"
        )

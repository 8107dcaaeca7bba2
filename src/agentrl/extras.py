"""How to install one of agentrl's optional extras, for error messages.

agentrl is installed from a checkout or a wheel (the name ``agentrl`` on PyPI is another
project), so a hint never names agentrl itself to pip: it names the packages the
extra lists, read from the installed distribution's metadata.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex

__all__ = ["extra_requirements", "install_hint"]

_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def extra_requirements(extra: str) -> list[str]:
    """The requirements (``e2b>=2.0``) agentrl's ``extra`` lists; empty when unknown."""
    try:
        requirements = importlib.metadata.requires("agentrl") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    found = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        match = _EXTRA_MARKER.search(marker)
        if match and match.group(1) == extra:
            found.append(spec.strip())
    return found


def install_hint(extra: str) -> str:
    """``pip install 'e2b>=2.0'`` (the packages of agentrl's ``[e2b]`` extra), for a message."""
    packages = extra_requirements(extra)
    if not packages:
        return f"install agentrl's [{extra}] extra (pip install '.[{extra}]' in a checkout)"
    command = " ".join(shlex.quote(package) for package in packages)
    return f"pip install {command} (agentrl's [{extra}] extra)"

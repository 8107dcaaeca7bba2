"""Install hints in error messages name packages, never the PyPI name ``agentrl``."""

from __future__ import annotations

import pathlib
import re

from agentrl.extras import extra_requirements, install_hint

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "agentrl"


def test_install_hint_names_the_extras_packages():
    """The e2b hint is a pip command for the e2b SDK itself, naming the extra it comes from."""
    assert "e2b>=2.0" in extra_requirements("e2b")
    hint = install_hint("e2b")
    assert hint.startswith("pip install 'e2b>=2.0'")
    assert "[e2b] extra" in hint
    assert "agentrl[" not in hint


def test_install_hint_for_an_unknown_extra_points_at_a_checkout():
    """An extra the metadata does not list still gives a usable instruction."""
    assert extra_requirements("no-such-extra") == []
    assert "pip install '.[no-such-extra]'" in install_hint("no-such-extra")


def test_no_message_tells_users_to_install_agentrl_by_name():
    """`pip install agentrl…` would install an unrelated PyPI project of that name."""
    offenders = []
    for path in SRC.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"pip install\s+['\"]?agentrl\b", line):
                offenders.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)

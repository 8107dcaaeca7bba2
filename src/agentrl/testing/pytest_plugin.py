"""pytest plugin shipped with agentrl: fixtures built on the test doubles in ``agentrl.testing``.

Loaded through the ``pytest11`` entry point; it imports nothing heavy at collection time.
"""

from __future__ import annotations

import pytest

from agentrl import plugins


@pytest.fixture
def agentrl_registry():
    """A fresh plugin registry for one test, restored afterwards."""
    registry = plugins.PluginRegistry()
    previous = plugins.reset_registry(registry)
    try:
        yield registry
    finally:
        plugins.reset_registry(previous)

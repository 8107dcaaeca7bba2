"""Project-internal test configuration: the suite's names for the shipped fixtures, markers.

The doubles' fixtures come from agentrl's own pytest plugin (``agentrl.testing.pytest_plugin``,
loaded through its ``pytest11`` entry point), exactly as a plugin package's tests get them;
the suite keeps its shorter names for them here.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(agentrl_qwen_tokenizer_dir):
    """The plugin's ``agentrl_qwen_tokenizer_dir`` (Qwen3's vocabulary and chat template)."""
    return agentrl_qwen_tokenizer_dir


@pytest.fixture(scope="session")
def qwen_tokenizer(agentrl_qwen_tokenizer):
    """The plugin's ``agentrl_qwen_tokenizer``: a real fast tokenizer with Qwen3's template."""
    return agentrl_qwen_tokenizer


@pytest.fixture
def scripted_engine(agentrl_scripted_engine):
    """The plugin's ``agentrl_scripted_engine``: a running scripted SGLang server."""
    return agentrl_scripted_engine


SGLANG_MARKER_HELP = (
    "sglang: differential tests against SGLang's own parsers; they need `pip install sglang` "
    "and run only when selected with `-m sglang` (make test-sglang)"
)


def pytest_configure(config):
    """Register the opt-in ``sglang`` marker."""
    config.addinivalue_line("markers", SGLANG_MARKER_HELP)


def pytest_collection_modifyitems(config, items):
    """Deselect ``sglang`` tests unless the marker expression asks for them."""
    if "sglang" in (config.getoption("markexpr", default="") or ""):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("sglang") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

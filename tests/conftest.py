"""Project-internal test configuration: the suite's names for the shipped fixtures, markers.

The doubles' fixtures come from agentrl's own pytest plugin (``agentrl.testing.pytest_plugin``,
loaded through its ``pytest11`` entry point), exactly as a plugin package's tests get them;
the suite keeps its shorter names for them here.
"""

from __future__ import annotations

import pytest
import sglang_standin
from docker_daemon import docker_base_image, docker_options, dockerd_host  # noqa: F401
from vllm_server import vllm_server  # noqa: F401

from agentrl.parsers import sglang as sglang_family


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


@pytest.fixture
def no_sglang():
    """For tests that describe the CI environment: SGLang's parser modules do not import
    (it fails, rather than skips, where they do)."""
    if sglang_family.sglang_parser_modules() is not None:
        pytest.fail("this test needs an environment without SGLang's parser modules")


@pytest.fixture
def standin_sglang(tmp_path, monkeypatch):
    """SGLang's parser-module layout (a stand-in, see tests/support/sglang_standin.py) first
    on sys.path."""
    sglang_standin.install(tmp_path / "site", monkeypatch)
    yield
    sglang_standin.unload()

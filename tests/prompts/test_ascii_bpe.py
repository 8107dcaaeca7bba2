"""The ASCII BPE encoder: the tokenizer's own ids for ASCII text, or no answer at all."""

from __future__ import annotations

import logging
import os
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.prompts import ascii_bpe
from agentrl.prompts.ascii_bpe import AsciiBPE, translate_pattern
from agentrl.prompts.segments import SegmentEncoder
from agentrl.tokenizers import QWEN_PATTERN

HYPOTHESIS = settings(
    max_examples=int(os.environ.get("AGENTRL_HYPOTHESIS_EXAMPLES", "60")) * 3,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: Fragments where pre-tokenizers differ most: contractions in any case, digit runs,
#: whitespace runs before text and at the end, carriage returns, added tokens.
FRAGMENTS = [
    "'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'D", "''", " '", "12345", "3.14",
    "  ", "   x", "\n\n", "\r\n", " \n ", "\t\t", "\x0b", "\x0c", "\x1c", "\x1f", "\x00", "\x7f",
    "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_response>", "<think>", "<",
]  # fmt: skip
ascii_text = st.lists(
    st.one_of(st.text(st.characters(max_codepoint=127), max_size=30), st.sampled_from(FRAGMENTS)),
    max_size=8,
).map("".join)


def reference(backend, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def backend(qwen_tokenizer):
    """A copy of the Qwen3 Rust tokenizer (tests may change its pipeline)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(qwen_tokenizer.backend_tokenizer.to_str())


@pytest.fixture
def bpe(backend):
    encoder = AsciiBPE.for_backend(backend)
    assert encoder is not None
    return encoder


@HYPOTHESIS
@given(text=ascii_text)
def test_ids_equal_the_tokenizers_on_any_ascii_text(bpe, backend, text):
    """Any ASCII text (control characters, contractions, added tokens, runs of spaces):
    the encoder answers, and with exactly the tokenizer's ids."""
    ids = bpe.ids(text)
    assert ids is not None
    assert list(ids) == reference(backend, text)
    assert bpe.stats["mismatch"] == 0


def test_ids_equal_the_tokenizers_on_real_source_code(bpe, backend):
    """Every ASCII source file of this project, in 4k-character pieces, then the same
    pieces again from the word cache: the tokenizer's ids each time."""
    root = Path(ascii_bpe.__file__).resolve().parents[1]
    pieces = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if source.isascii():
            pieces += [source[i : i + 4096] for i in range(0, len(source), 4096)]
    assert len(pieces) > 200
    for _ in range(2):
        for piece in pieces:
            assert list(bpe._encode(piece)) == reference(backend, piece)
    assert bpe.stats["word_misses"] < sum(map(len, pieces)) / 4


def test_text_that_is_not_ascii_is_left_to_the_tokenizer(bpe):
    """A non-ASCII character anywhere: no answer (its normalizer and classes then matter)."""
    assert bpe.ids("caf\u00e9") is None
    assert bpe.ids("plain \u2705 check") is None
    assert bpe.stats["encoded"] == 0


def test_a_huge_text_is_left_to_the_tokenizer(bpe, backend):
    """Past MAX_CHARS the tokenizer encodes (it releases the GIL; a regex over megabytes
    would hold it and stall the event loop)."""
    assert bpe.ids("x" * ascii_bpe.MAX_CHARS) is not None
    assert bpe.ids("x" * (ascii_bpe.MAX_CHARS + 1)) is None


def test_segment_encoder_mixes_ascii_and_tokenizer_pieces(qwen_tokenizer):
    """A text whose pieces are partly ASCII, partly not: each piece goes its own way and the
    whole still has the tokenizer's ids."""
    encoder = SegmentEncoder.for_tokenizer(qwen_tokenizer)
    assert encoder.ascii_bpe is not None
    text = (
        "<|im_start|>user\nrun the tests<|im_end|>\n<|im_start|>assistant\n\u2713 done"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nok: 3 passed\n</tool_response><|im_end|>\n"
    )
    before = encoder.ascii_bpe.stats["encoded"]
    got = encoder.encode(text)
    assert list(got.ids) == qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = len(got.segments) + bool(got.rest)
    assert encoder.ascii_bpe.stats["encoded"] - before == pieces - 1  # all but the one with \u2713


def test_a_mismatch_turns_the_encoder_off_for_good(bpe, backend, caplog):
    """Attack on the guarantee: a wrong cached word. The 1st call is checked against the
    tokenizer, so it answers None (the caller asks the tokenizer), logs, and stays off."""
    bpe._words["hello"] = array("I", [7]).tobytes()
    with caplog.at_level(logging.WARNING, logger="agentrl.prompts.ascii_bpe"):
        assert bpe.ids("hello") is None
    assert "differ from the tokenizer's" in caplog.text
    assert not bpe.enabled and bpe.stats["mismatch"] == 1
    assert bpe.ids("world") is None


def test_calls_are_checked_on_powers_of_two(bpe, backend, monkeypatch):
    """The 1st, 2nd, 4th, 8th, … call is compared with the tokenizer, the others are not."""
    checked = []
    monkeypatch.setattr(
        bpe, "_reference", lambda text: checked.append(text) or reference(backend, text)
    )
    for n in range(1, 20):
        assert bpe.ids(f"call {n}") is not None
    assert checked == [f"call {n}" for n in (1, 2, 4, 8, 16)]


def test_the_word_cache_stays_bounded(bpe, backend, monkeypatch):
    """Past its size the cache is emptied; ids stay the tokenizer's."""
    monkeypatch.setattr(ascii_bpe, "WORD_CACHE_SIZE", 8)
    text = " ".join(f"word{n}x" for n in range(50))
    assert list(bpe._encode(text)) == reference(backend, text)
    assert len(bpe._words) <= 8


@HYPOTHESIS
@given(text=ascii_text)
def test_gpt2_byte_level_pre_tokenizer_is_reproduced(gpt2_style, text):
    """A ByteLevel pre-tokenizer that splits with GPT-2's own pattern (no Split step)."""
    backend, bpe = gpt2_style
    assert list(bpe._encode(text)) == reference(backend, text)


@pytest.fixture(scope="module")
def gpt2_style(backend):
    from tokenizers import Tokenizer, pre_tokenizers

    copy = Tokenizer.from_str(backend.to_str())
    copy.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe = AsciiBPE.for_backend(copy)
    assert bpe is not None
    return copy, bpe


def test_pipelines_it_cannot_reproduce_get_no_encoder(backend, caplog):
    """A normalizer that changes ASCII, a prefix space, a non-byte-level pre-tokenizer, an
    added token that strips: no encoder, and the log says why."""
    from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers

    def variant(change):
        copy = Tokenizer.from_str(backend.to_str())
        change(copy)
        return copy

    cases = {
        "Lowercase": lambda t: setattr(t, "normalizer", normalizers.Lowercase()),
        "prefix space": lambda t: setattr(
            t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)
        ),
        "Whitespace": lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()),
        "stripped": lambda t: t.add_tokens([AddedToken("<pad>", lstrip=True)]),
        "Digits": lambda t: setattr(
            t,
            "pre_tokenizer",
            pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(), pre_tokenizers.ByteLevel(use_regex=False)]
            ),
        ),
    }
    for name, change in cases.items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="agentrl.prompts.ascii_bpe"):
            assert AsciiBPE.for_backend(variant(change)) is None, name
        assert "tokenized by the tokenizer itself" in caplog.text, name


def test_qwen_pattern_translation():
    """Unicode classes become ASCII ones; White_Space is not Python's \\s (\\x1c-\\x1f)."""
    got = translate_pattern(QWEN_PATTERN)
    assert got is not None
    assert r"\p" not in got and r"\s" not in got and r"\S" not in got
    assert "[A-Za-z]+" in got and "[0-9]" in got
    assert r"[^\r\nA-Za-z0-9]?" in got
    assert translate_pattern(r"(a|b)\s") == r"(?:a|b)[\t\n\x0b\x0c\r ]"


@pytest.mark.parametrize(
    "pattern",
    [r"\d+", r"\w+", r"\p{Lu}", r"^a", r"a$", r"a.b", r"(?P<x>a)", r"[[:alpha:]]", r"[a&&b]",
     r"[]a]", r"\x41", r"[a"],
)  # fmt: skip
def test_patterns_it_does_not_translate(pattern):
    """Constructs whose meaning differs between regex engines, or that it does not map."""
    assert translate_pattern(pattern) is None


def test_the_module_switch_sends_every_text_to_the_tokenizer(bpe, qwen_tokenizer, monkeypatch):
    """``ascii_bpe.ENABLED = False`` (the benchmark's library column): no encoder answers,
    and the segment encoder's ids are then the tokenizer's own."""
    text = "def f(x):\n    return x + 1\n<|im_end|>\n"
    assert bpe.ids(text) is not None
    monkeypatch.setattr(ascii_bpe, "ENABLED", False)
    assert bpe.ids(text) is None
    encoder = SegmentEncoder.for_tokenizer(qwen_tokenizer)
    encoded = encoder.ascii_bpe.stats["encoded"]
    want = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert list(encoder.ids(text)) == want
    assert encoder.ascii_bpe.stats["encoded"] == encoded

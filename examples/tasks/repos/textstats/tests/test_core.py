from textstats import average_word_length, most_common, word_count, words


def test_words_strip_punctuation():
    assert words("Hello, world!") == ["hello", "world"]


def test_word_count_simple():
    assert word_count("one two three") == 3


def test_word_count_ignores_extra_whitespace():
    assert word_count("  one   two\tthree\n\nfour ") == 4


def test_empty_text_has_no_words():
    assert word_count("") == 0
    assert words("   \n") == []
    assert average_word_length("") == 0.0


def test_most_common_counts_words_across_lines():
    text = "the cat\nthe dog\n\nthe end"
    assert most_common(text, 1) == [("the", 3)]

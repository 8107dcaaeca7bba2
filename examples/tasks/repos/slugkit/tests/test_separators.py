from slugkit import slugify


def test_punctuation_and_spaces_collapse_to_one_separator():
    assert slugify("Hello,  World!") == "hello-world"


def test_no_leading_or_trailing_separator():
    assert slugify("  -- Release notes (v2) --  ") == "release-notes-v2"


def test_custom_separator():
    assert slugify("A  B", separator="_") == "a_b"

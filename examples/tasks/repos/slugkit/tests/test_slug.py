from slugkit import slugify, unique_slug


def test_single_word():
    assert slugify("Python") == "python"


def test_accents_are_dropped():
    assert slugify("Café") == "cafe"


def test_unique_slug_numbers_duplicates():
    assert unique_slug("Python", {"python", "python-2"}) == "python-3"

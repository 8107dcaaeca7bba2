import pytest

from semver_lite import compare, parse


def test_parse_round_trips():
    assert str(parse("v1.2.3-rc.1")) == "1.2.3-rc.1"


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse("1.2")


def test_compare_equal_and_prerelease():
    assert compare("1.0.0", "1.0.0") == 0
    assert compare("1.0.0-rc.1", "1.0.0") == -1
    assert compare("2.0.0", "1.9.9") == 1

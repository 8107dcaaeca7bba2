"""The view tests' fixtures; the crafted run and the browser helpers are in
tests/support/view_support.py (importable by name, unlike a conftest)."""

from view_support import browser, crafted_dir, crafted_source  # noqa: F401

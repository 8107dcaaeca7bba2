"""Parse and compare semantic versions."""

from semver_lite.version import Version, compare, parse

__all__ = ["Version", "compare", "parse"]

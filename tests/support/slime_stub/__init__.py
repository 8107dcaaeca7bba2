"""A stand-in for slime's ``Sample`` and the checks slime runs on rollout output.

slime is not on PyPI, so the integration is tested against this package, written from
the slime contract (field names, defaults, the nested ``Status`` enum, and the assertions
slime's rollout manager applies). It is deliberately not importable as ``slime``.
"""

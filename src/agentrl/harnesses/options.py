"""Extra CLI arguments and environment for a harness, from environment variables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agentrl import settings
from agentrl.harnesses.errors import HarnessError

__all__ = ["parse_extra_args", "parse_extra_env"]


def _read(environ: Mapping[str, str] | None, names: Sequence[str], kind: str) -> settings.Value:
    if not names:
        return None
    try:
        return settings.chain(names, kind).read(environ, default=None)
    except settings.SettingsError as exc:
        raise HarnessError(str(exc)) from None


def parse_extra_args(environ: Mapping[str, str] | None, names: Sequence[str]) -> tuple[str, ...]:
    """Extra CLI arguments from the first set variable of ``names``: a JSON list of strings.

    A value that is not JSON is split like a shell command line, so
    ``--max-turns 50`` works as well as ``["--max-turns", "50"]``. ``environ`` None is
    ``os.environ``.
    """
    return _read(environ, names, "args") or ()


def parse_extra_env(environ: Mapping[str, str] | None, names: Sequence[str]) -> dict[str, str]:
    """Extra CLI environment from the first set variable of ``names``: a JSON object."""
    return _read(environ, names, "env") or {}

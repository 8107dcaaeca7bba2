"""Extra CLI arguments and environment for a harness, from environment variables."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

from agentrl.harnesses.errors import HarnessError

__all__ = ["parse_extra_args", "parse_extra_env"]


def _environ_value(environ: Mapping[str, str], names: Sequence[str]) -> tuple[str, str] | None:
    for name in names:
        raw = environ.get(name, "")
        if raw.strip():
            return name, raw
    return None


def parse_extra_args(environ: Mapping[str, str], names: Sequence[str]) -> tuple[str, ...]:
    """Extra CLI arguments from the first set variable of ``names``: a JSON list of strings.

    A value that is not JSON is split like a shell command line, so
    ``--max-turns 50`` works as well as ``["--max-turns", "50"]``.
    """
    found = _environ_value(environ, names)
    if found is None:
        return ()
    name, raw = found
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return tuple(shlex.split(raw))
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise HarnessError(
            f"{name} must be a JSON list of strings, got {raw[:200]!r}; "
            f'set it like {name}=\'["--max-turns", "50"]\''
        )
    return tuple(str(v) for v in value)


def parse_extra_env(environ: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """Extra CLI environment from the first set variable of ``names``: a JSON object."""
    found = _environ_value(environ, names)
    if found is None:
        return {}
    name, raw = found
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise HarnessError(
            f"{name} is not valid JSON ({exc}); set it to an object such as "
            f'{name}=\'{{"BASH_DEFAULT_TIMEOUT_MS": "600000"}}\''
        ) from None
    if not isinstance(value, dict):
        raise HarnessError(
            f"{name} must be a JSON object of environment variables, got {type(value).__name__}; "
            f'set it like {name}=\'{{"KEY": "value"}}\''
        )
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}

"""Which option keys a plugin class accepts, and one check of a mapping against them.

A sandbox, harness or engine is configured by keyword arguments (``--sandbox-options``,
``--harness-options``, ``StackOptions.engine_options``). A key the class does not take
would otherwise surface as a ``TypeError`` inside every rollout; checking the keys first
turns it into one error, before anything starts, that lists the valid keys.

By default the accepted keys are the constructor's keyword parameters; a constructor that
takes ``**kwargs`` accepts any key (nothing can be checked). A class declares otherwise
by overriding its ``option_names`` classmethod.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

__all__ = ["OptionsError", "check_option_keys", "keyword_parameters"]


class OptionsError(ValueError):
    """An option key the plugin does not accept; the message lists the ones it does."""


def keyword_parameters(
    target: Callable[..., Any], *, exclude: Collection[str] = (), positional: int = 0
) -> frozenset[str] | None:
    """The parameters ``target`` (a class: its constructor) can take by keyword.

    None when it takes ``**kwargs`` or its signature cannot be read: any key may be
    valid then. The caller fills the first ``positional`` parameters positionally and
    those named in ``exclude`` itself (from the task, say), so an option must not repeat
    them.
    """
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    names = set()
    for index, parameter in enumerate(signature.parameters.values()):
        if parameter.kind is parameter.VAR_KEYWORD:
            return None
        if index < positional and parameter.kind is not parameter.KEYWORD_ONLY:
            continue
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            names.add(parameter.name)
    return frozenset(names.difference(exclude))


def check_option_keys(
    what: str, options: Mapping[str, Any], accepted: Collection[str] | None
) -> None:
    """Raise ``OptionsError`` when ``options`` has a key outside ``accepted`` (None: any key).

    ``what`` names the plugin in the message, e.g. ``"the 'local' sandbox"``.
    """
    if accepted is None:
        return
    unknown = sorted(str(key) for key in options if key not in accepted)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, accepted, n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    valid = ", ".join(sorted(accepted)) or "none"
    noun = "option" if len(unknown) == 1 else "options"
    raise OptionsError(f"{what} has no {noun} {', '.join(hints)}; its options are: {valid}")

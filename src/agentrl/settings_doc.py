"""docs/settings.md's table, generated from :data:`agentrl.settings.SETTINGS`.

::

    python -m agentrl.settings_doc --markdown                 # print the table
    python -m agentrl.settings_doc --write docs/settings.md   # regenerate it in place
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence

from agentrl.settings import _CHECKS, _MARKERS, SETTINGS, TYPES, Setting

__all__ = ["markdown", "replace_table"]


def _default_text(s: Setting) -> str:
    if s.default_doc is not None:
        return s.default_doc
    if s.fallback is not None:
        return f"`{s.fallback}`"
    if s.default is None or s.default == ():
        return "unset"
    if isinstance(s.default, bool):
        return f"`{int(s.default)}`"
    if isinstance(s.default, float):
        return f"`{s.default:g}`"
    return f"`{s.default}`"


def markdown() -> str:
    """The settings table as docs/settings.md shows it: a type legend, then one table per reader."""
    lines = ["| type | written as |", "| --- | --- |"]
    lines += [f"| `{kind}` | {text} |" for kind, text in TYPES.items()]
    for reader in dict.fromkeys(s.readers[0] for s in SETTINGS):
        lines += ["", f"### {reader}", ""]
        lines += ["| name | aliases | type | default | help |", "| --- | --- | --- | --- | --- |"]
        for s in (s for s in SETTINGS if s.readers[0] == reader):
            kind = f"`{s.type}`" + (f" {_CHECKS[s.check]}" if s.check else "")
            aliases = ", ".join(f"`{a}`" for a in s.aliases) or "—"
            cells = (f"`{s.name}`", aliases, kind, _default_text(s), s.help)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def replace_table(text: str) -> str:
    """``text`` (docs/settings.md) with the part between the table markers regenerated."""
    start, end = _MARKERS
    head, found, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found or not found_end:
        raise ValueError(f"no {start} ... {end} markers in the text")
    return f"{head}{start}\n{markdown()}{end}{tail}"


def _main(argv: Sequence[str]) -> int:
    if list(argv) == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    if len(argv) == 2 and argv[0] == "--write":
        path = pathlib.Path(argv[1])
        path.write_text(replace_table(path.read_text()))
        return 0
    sys.stderr.write(
        "usage: python -m agentrl.settings_doc --markdown | --write docs/settings.md\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

"""What a dataset's records must hold, and the value conversions every importer shares."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from agentrl.graders.datasets.sources import DatasetError

__all__ = ["ImportOptions", "Schema", "record_id", "string_list", "text"]


@attrs.frozen(kw_only=True)
class ImportOptions:
    """What the user chose beyond the source: image naming, the SWE-bench Pro scripts.

    ``image_namespace``: the registry namespace of derived image names (``None``: the
    dataset's own default, and a name the record carries wins; ``"none"``: the names
    swebench's harness gives images it builds locally). ``scripts_dir``: SWE-bench Pro's
    ``run_scripts`` directory (``<instance_id>/run_script.sh`` and ``parser.py``).
    """

    image_namespace: str | None = None
    scripts_dir: str | None = None


@attrs.frozen(kw_only=True)
class Schema:
    """One dataset's published columns and how a record becomes a task row."""

    name: str
    #: The grader that claims the rows this schema produces.
    grader: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    convert: Callable[[Mapping[str, Any], ImportOptions], dict[str, Any]]
    #: Where the columns and the image naming come from (shown in errors and docs).
    source: str

    def describe(self) -> str:
        """The expected columns, for an error message."""
        return (
            f"the {self.name} schema ({self.source}) has the columns "
            f"{', '.join(self.required)} (required) and {', '.join(self.optional)} (optional)"
        )

    def check(self, records: Sequence[Mapping[str, Any]], where: str) -> None:
        """Raise naming the first required column a record lacks, and the expected schema."""
        for number, record in enumerate(records, start=1):
            missing = [column for column in self.required if column not in record]
            if missing:
                raise DatasetError(
                    f"{where}: record {number} ({record_id(record)}) has no column "
                    f"{', '.join(repr(c) for c in missing)}; {self.describe()}"
                )

    def row(self, record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
        """The task row for one record; a bad value raises naming the record and the column."""
        try:
            return self.convert(record, options)
        except DatasetError as exc:
            raise DatasetError(f"{record_id(record)}: {exc}") from None


def record_id(record: Mapping[str, Any]) -> str:
    """The record's ``instance_id`` for messages (``?`` when it has none)."""
    value = record.get("instance_id")
    return value if isinstance(value, str) and value else "?"


def text(record: Mapping[str, Any], column: str, *, required: bool = False) -> str:
    """A string column (``""`` when absent or null); another type raises naming the column."""
    value = record.get(column)
    if value is None:
        if required:
            raise DatasetError(f"column {column!r} is empty")
        return ""
    if not isinstance(value, str):
        raise DatasetError(f"column {column!r} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise DatasetError(f"column {column!r} is empty")
    return value


def string_list(record: Mapping[str, Any], column: str) -> list[str]:
    """A list of test names: a list, a JSON-encoded list (SWE-bench) or a Python literal
    (SWE-bench Pro's ``"['a', 'b']"``)."""
    value = record.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise DatasetError(
                    f"column {column!r} is neither a JSON list nor a Python list literal: "
                    f"{value[:80]!r}"
                ) from None
    if hasattr(value, "tolist"):  # a numpy array from a pandas-written parquet file
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise DatasetError(f"column {column!r} must be a list of strings, got {value!r:.80}")
    return list(value)

"""What a dataset's records must hold, and the value conversions every importer shares."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from agentrl.graders.datasets.sources import DatasetError

__all__ = [
    "ColumnError",
    "ImportOptions",
    "Schema",
    "json_object",
    "record_id",
    "string_list",
    "text",
]


class ColumnError(DatasetError):
    """One column of a record holds a value the schema cannot use; ``column`` names it."""

    def __init__(self, column: str, reason: str) -> None:
        super().__init__(f"column {column!r} {reason}")
        self.column = column
        self.reason = reason


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
    #: The record's instance id when the dataset has no ``instance_id`` column.
    identify: Callable[[Mapping[str, Any]], str] | None = None

    def instance_id(self, record: Mapping[str, Any]) -> str:
        """The record's instance id (``?`` when it has none)."""
        return self.identify(record) if self.identify is not None else record_id(record)

    def describe(self) -> str:
        """The expected columns, for an error message."""
        return (
            f"the {self.name} schema ({self.source}) has the columns "
            f"{', '.join(self.required)} (required) and {', '.join(self.optional)} (optional)"
        )

    def missing(self, record: Mapping[str, Any]) -> list[str]:
        """The required columns ``record`` lacks."""
        return [column for column in self.required if column not in record]

    def row(self, record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
        """The task row for one record; a bad value raises :class:`ColumnError` (or
        :class:`DatasetError` when no single column is at fault)."""
        return self.convert(record, options)


def record_id(record: Mapping[str, Any]) -> str:
    """The record's ``instance_id`` for messages (``?`` when it has none)."""
    value = record.get("instance_id")
    return value if isinstance(value, str) and value else "?"


def text(record: Mapping[str, Any], column: str, *, required: bool = False) -> str:
    """A string column (``""`` when absent or null); another type raises naming the column."""
    value = record.get(column)
    if value is None:
        if required:
            raise ColumnError(column, "is empty")
        return ""
    if not isinstance(value, str):
        raise ColumnError(column, f"must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise ColumnError(column, "is empty")
    return value


def json_object(record: Mapping[str, Any], column: str) -> dict[str, Any]:
    """A mapping column, also accepted JSON-encoded (``{}`` when absent or null)."""
    value = record.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ColumnError(column, f"is not a JSON object ({exc.msg})") from None
    if not isinstance(value, Mapping):
        raise ColumnError(column, f"must be a JSON object, got {type(value).__name__}")
    return dict(value)


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
                raise ColumnError(
                    column, f"is neither a JSON list nor a Python list literal: {value[:80]!r}"
                ) from None
    if hasattr(value, "tolist"):  # a numpy array from a pandas-written parquet file
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ColumnError(column, f"must be a list of strings, got {value!r:.80}")
    return list(value)

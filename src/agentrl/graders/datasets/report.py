"""Importing every record, and saying what was wrong with each one that could not be.

A source is read whole, then each record is turned into a task row on its own: a record
missing a column, holding a bad value, or repeating an earlier record's ``instance_id`` is
a :class:`RowProblem` (record number, instance id, column, reason), and every one of them
is reported, not only the first. What happens to them is the caller's choice
(:func:`import_report` never raises for a bad record): ``agentrl tasks import`` refuses the
file unless ``--skip-invalid`` (bad records) and ``--dedupe`` (repeated ids) say otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from agentrl.graders.datasets.schema import ColumnError, ImportOptions, Schema
from agentrl.graders.datasets.sources import DatasetError

__all__ = ["ImportReport", "InvalidRecords", "RowProblem", "import_report"]

#: How many problems an error message lists before it counts the rest.
SHOWN = 20


@attrs.frozen(kw_only=True)
class RowProblem:
    """Why record ``record`` (1-based, in source order) of a source became no task row."""

    record: int
    instance_id: str
    column: str
    reason: str

    def __str__(self) -> str:
        where = f"record {self.record} ({self.instance_id})"
        if self.column == "-":
            return f"{where}: {self.reason}"
        return f"{where}: column {self.column!r} {self.reason}"


@attrs.frozen(kw_only=True)
class ImportReport:
    """The task rows made from a source's records, and the records that made none.

    ``invalid``: records that cannot be graded (a column missing or bad); ``duplicates``:
    records whose ``instance_id`` an earlier record already has (the earlier one is kept
    in ``rows``). ``records``: how many records were considered.
    """

    rows: tuple[dict[str, Any], ...]
    invalid: tuple[RowProblem, ...]
    duplicates: tuple[RowProblem, ...]
    records: int


class InvalidRecords(DatasetError):
    """Records that made no task row; ``problems`` lists every one."""

    def __init__(self, where: str, problems: Sequence[RowProblem], advice: str) -> None:
        self.problems = tuple(problems)
        super().__init__(describe_problems(where, self.problems, advice))


def describe_problems(where: str, problems: Sequence[RowProblem], advice: str) -> str:
    """One message listing ``problems`` (the first :data:`SHOWN`, then a count)."""
    records = len({problem.record for problem in problems})
    lines = [f"{where}: {records} of its records cannot be imported:"]
    lines += [f"  {problem}" for problem in problems[:SHOWN]]
    if len(problems) > SHOWN:
        lines.append(f"  … and {len(problems) - SHOWN} more")
    if advice:
        lines.append(advice)
    return "\n".join(lines)


def _problem(number: int, identifier: str, exc: DatasetError) -> RowProblem:
    if isinstance(exc, ColumnError):
        return RowProblem(
            record=number, instance_id=identifier, column=exc.column, reason=exc.reason
        )
    return RowProblem(record=number, instance_id=identifier, column="-", reason=str(exc))


def import_report(
    schema: Schema,
    records: Sequence[tuple[int, Mapping[str, Any]]],
    options: ImportOptions,
) -> ImportReport:
    """Every ``(record number, record)`` made into a row, or into a :class:`RowProblem`.

    A record is checked for the schema's required columns (all missing ones named in one
    problem), then converted; a record whose ``instance_id`` an earlier record has is a
    duplicate (reported against the first one's record number) and makes no row.
    """
    rows: list[dict[str, Any]] = []
    invalid: list[RowProblem] = []
    duplicates: list[RowProblem] = []
    first: dict[str, int] = {}
    for number, record in records:
        identifier = schema.instance_id(record)
        if identifier in first:
            duplicates.append(
                RowProblem(
                    record=number,
                    instance_id=identifier,
                    column="instance_id",
                    reason=f"repeats record {first[identifier]}'s value",
                )
            )
            continue
        if identifier != "?":
            first[identifier] = number
        missing = schema.missing(record)
        if missing:
            invalid += [
                RowProblem(
                    record=number,
                    instance_id=identifier,
                    column=column,
                    reason=f"is missing (required by the {schema.name} schema)",
                )
                for column in missing
            ]
            continue
        try:
            rows.append(schema.row(record, options))
        except DatasetError as exc:
            invalid.append(_problem(number, identifier, exc))
    return ImportReport(
        rows=tuple(rows),
        invalid=tuple(invalid),
        duplicates=tuple(duplicates),
        records=len(records),
    )

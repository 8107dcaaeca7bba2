"""Reading a dataset's records from a local file or directory, never from the network.

A source is a parquet file (pyarrow), a JSON file (an array of records, or an object whose
keys are split names), a JSONL file, or a directory: a Hugging Face ``datasets``
``save_to_disk`` directory, a ``datasets`` cache directory (``*-<split>.arrow`` files), or
a snapshot of a hub repository (``data/<split>-*.parquet``). pyarrow and ``datasets`` are
imported only when a source needs them.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

from agentrl import jsonio
from agentrl.extras import install_hint

__all__ = ["DatasetError", "read_source"]

#: The split chosen when none is asked for and the source holds several.
DEFAULT_SPLIT = "test"


class DatasetError(ValueError):
    """A dataset source could not be read or does not fit its schema."""


def read_source(path: str | pathlib.Path, *, split: str | None = None) -> list[dict[str, Any]]:
    """Every record of ``split`` in the local source ``path``, as plain dicts.

    ``split`` matters only for sources that hold several splits (a JSON object of splits,
    a ``datasets`` directory); a single-split file is read whole. With no ``split``, the
    ``test`` split is read when there is one, else the only split; several splits and no
    ``test`` is an error listing them.
    """
    source = pathlib.Path(path)
    if not source.exists():
        raise DatasetError(f"dataset source {source} does not exist")
    if source.is_dir():
        return _read_directory(source, split)
    suffix = source.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet([source])
    if suffix == ".jsonl":
        return _read_jsonl(source)
    if suffix == ".json":
        return _read_json(source, split)
    raise DatasetError(
        f"cannot read {source}: expected a .parquet, .json or .jsonl file or a Hugging Face "
        "datasets directory"
    )


def _records(rows: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(rows, list):
        raise DatasetError(f"{where}: expected a list of records, got {type(rows).__name__}")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DatasetError(
                f"{where}: record {number} is a {type(row).__name__}, not a JSON object"
            )
    return rows


def pick_split(splits: Mapping[str, Any], split: str | None, where: str) -> str:
    """The split to read from ``splits`` (see :func:`read_source`)."""
    names = sorted(splits)
    if split is not None:
        if split not in splits:
            raise DatasetError(
                f"{where} has no split {split!r}; its splits: {', '.join(names) or 'none'}"
            )
        return split
    if DEFAULT_SPLIT in splits:
        return DEFAULT_SPLIT
    if len(names) == 1:
        return names[0]
    raise DatasetError(f"{where} holds the splits {', '.join(names)}: choose one with --split")


def _read_json(source: pathlib.Path, split: str | None) -> list[dict[str, Any]]:
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"cannot read {source} as JSON: {exc}") from exc
    if isinstance(data, dict):
        if not all(isinstance(v, list) for v in data.values()):
            raise DatasetError(f"{source}: a JSON object must map split names to lists of records")
        chosen = pick_split(data, split, str(source))
        return _records(data[chosen], f"{source} split {chosen}")
    return _records(data, str(source))


def _read_jsonl(source: pathlib.Path) -> list[dict[str, Any]]:
    rows = []
    try:
        handle = source.open(encoding="utf-8-sig")
    except OSError as exc:
        raise DatasetError(f"cannot open {source}: {exc}") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = jsonio.loads_line(line)
            except jsonio.JSONLineError as exc:
                raise DatasetError(
                    f"{source}:{number}:{exc.column}: not valid JSON ({exc.msg})"
                ) from None
            if not isinstance(row, dict):
                raise DatasetError(f"{source}:{number}: a record must be a JSON object")
            rows.append(row)
    return rows


def _read_parquet(files: list[pathlib.Path]) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError(
            f"reading parquet needs pyarrow, which is not installed: {install_hint('datasets')}"
        ) from exc
    rows: list[dict[str, Any]] = []
    for file in files:
        try:
            rows.extend(pq.read_table(file).to_pylist())
        except Exception as exc:  # pyarrow raises its own ArrowInvalid, OSError, ...
            raise DatasetError(f"cannot read {file} as parquet: {exc}") from exc
    return rows


def _import_datasets(source: pathlib.Path) -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise DatasetError(
            f"{source} is a Hugging Face datasets directory, and reading it needs the "
            f"datasets library, which is not installed: {install_hint('datasets')}"
        ) from exc
    return datasets


def _read_directory(source: pathlib.Path, split: str | None) -> list[dict[str, Any]]:
    if (source / "dataset_dict.json").is_file() or (source / "state.json").is_file():
        datasets = _import_datasets(source)
        try:
            loaded = datasets.load_from_disk(str(source))
        except Exception as exc:
            raise DatasetError(f"cannot load the datasets directory {source}: {exc}") from exc
        if isinstance(loaded, datasets.DatasetDict):
            loaded = loaded[pick_split(loaded, split, str(source))]
        return [dict(row) for row in loaded]
    arrows = _by_split(source.glob("*.arrow"), lambda name: name.rsplit("-", 1)[-1])
    if arrows:
        datasets = _import_datasets(source)
        chosen = pick_split(arrows, split, str(source))
        tables = [datasets.Dataset.from_file(str(f)) for f in sorted(arrows[chosen])]
        return [dict(row) for table in tables for row in table]
    parquets = _by_split(
        [*source.glob("*.parquet"), *source.glob("data/*.parquet")],
        lambda name: name.split("-", 1)[0],
    )
    if parquets:
        chosen = pick_split(parquets, split, str(source))
        return _read_parquet(sorted(parquets[chosen]))
    raise DatasetError(
        f"{source} is not a dataset directory: expected a datasets save_to_disk directory "
        "(dataset_dict.json or state.json), a datasets cache directory (*-<split>.arrow) or "
        "parquet files (data/<split>-*.parquet)"
    )


def _by_split(files: Any, split_of: Any) -> dict[str, list[pathlib.Path]]:
    """Files grouped by the split their name says (``squad-test.arrow``: ``test``).

    A sharded name (``test-00000-of-00002``) counts under the part before its shard number.
    """
    grouped: dict[str, list[pathlib.Path]] = {}
    for file in files:
        stem = file.stem
        parts = stem.split("-")
        if len(parts) >= 4 and parts[-2] == "of" and parts[-1].isdigit():
            stem = "-".join(parts[:-3])
        grouped.setdefault(split_of(stem) if "-" in stem else stem, []).append(file)
    return grouped

"""Turn agentrl task rows (JSONL) into the parquet file verl's RLHFDataset reads.

Each agentrl row becomes one verl row: ``prompt`` (the chat verl logs and filters by
length; the agent itself reads the task in its sandbox), ``agent_name`` ``agentrl`` (so
every row runs the agentrl loop), ``data_source``, and ``extra_info`` holding verl's
``index`` and the agentrl row as JSON under ``agentrl_task`` (JSON, so rows with different
metadata keys share one parquet schema).

    python examples/verl/prepare_data.py examples/tasks/scaleswe.jsonl ~/data/swe/train.parquet

Relative host paths in the rows (a task's ``repo``, its scripts) stay as they are: set the
agent loop's ``tasks_dir`` option to the folder they are relative to, as the grader
resolves them there (``Grader.resolve_paths``) on whichever node runs the rollout.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import pandas as pd


def verl_rows(jsonl: pathlib.Path) -> list[dict]:
    """One verl row per agentrl row of ``jsonl``."""
    rows = []
    lines = [line for line in jsonl.read_text().splitlines() if line.strip()]
    for index, line in enumerate(lines):
        task = json.loads(line)
        metadata = task.get("metadata") or {}
        rows.append(
            {
                "data_source": f"agentrl/{metadata.get('instance_id', index)}",
                "prompt": [{"role": "user", "content": str(task.get("prompt", ""))}],
                "agent_name": "agentrl",
                "extra_info": {"index": index, "agentrl_task": json.dumps(task)},
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", type=pathlib.Path, help="agentrl task rows (JSONL)")
    parser.add_argument("out", type=pathlib.Path, help="the parquet file to write")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(verl_rows(args.tasks)).to_parquet(args.out)


if __name__ == "__main__":
    main()

"""slime's ``--save-debug-rollout-data`` files as the view's rows.

slime saves each rollout step as ``torch.save({"rollout_id": N, "samples": [Sample.to_dict(),
...]})``. Each sample dict holds ``tokens``, ``response_length``, ``loss_mask``,
``rollout_log_probs``, ``reward`` and the ``metadata`` agentrl's slime integration wrote
(``instance_id``, ``outcome``, ``session_id``, ``timings``, ``error`` and the trajectory's
``turns``, ``leaf``, ``turn_metadata``, …). Samples of one session form one rollout.

The file is read with ``torch.load(weights_only=True)``: plain containers and tensors
only, never an arbitrary pickle. torch is imported only here, only for such a file.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from agentrl.extras import install_hint
from agentrl.view.model import integer, rollout_summary, text

__all__ = ["MAX_DUMP_FILES", "SlimeDumpError", "load_dumps"]

MAX_DUMP_FILES = 1000


class SlimeDumpError(RuntimeError):
    """A file that is not a readable slime rollout dump."""


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


def _load(path: pathlib.Path) -> Mapping[str, Any]:
    try:
        import torch
    except ImportError:
        raise SlimeDumpError(f"reading a slime dump needs torch: {install_hint('hf')}") from None
    try:
        pack = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SlimeDumpError(
            f"{path}: not a slime rollout dump ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(pack, Mapping) or not isinstance(pack.get("samples"), list):
        raise SlimeDumpError(f"{path}: a slime rollout dump is a dict with a 'samples' list")
    return pack


def _row(sample: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    tokens = _plain(sample.get("tokens"))
    response = integer(sample.get("response_length"))
    if not isinstance(tokens, list) or response is None:
        return None
    mask = _plain(sample.get("loss_mask"))
    reward = sample.get("reward")
    return {
        "key": key,
        "tokens": tokens,
        "prompt_length": len(tokens) - response,
        "response_length": response,
        "loss_mask": mask if isinstance(mask, list) else [1] * response,
        "rollout_logprobs": _plain(sample.get("rollout_log_probs")) or [],
        "reward": reward if isinstance(reward, int | float) else None,
        "metadata": sample.get("metadata") if isinstance(sample.get("metadata"), Mapping) else {},
    }


def load_dumps(path: pathlib.Path) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The rollout rows and the sample rows by key of a dump file, or of every ``*.pt``
    file in a directory (at most :data:`MAX_DUMP_FILES`)."""
    paths = sorted(path.glob("*.pt"))[:MAX_DUMP_FILES] if path.is_dir() else [path]
    rows: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for file in paths:
        pack = _load(file)
        rollout = integer(pack.get("rollout_id"))
        for position, sample in enumerate(pack["samples"]):
            if not isinstance(sample, Mapping):
                continue
            meta = sample.get("metadata") if isinstance(sample.get("metadata"), Mapping) else {}
            session = text(meta.get("session_id"), 300) or (
                f"group {sample.get('group_index')} sample {sample.get('index', position)}"
            )
            key = f"rollout {rollout} · {session}" if rollout is not None else session
            row = _row(sample, key)
            if row is None:
                continue
            row["chain_index"] = len(samples.get(key, ()))
            samples.setdefault(key, []).append(row)
            if key not in rows:
                rows[key] = rollout_summary(
                    {
                        "key": key,
                        "instance_id": meta.get("instance_id"),
                        "outcome": meta.get("outcome"),
                        "reward": meta.get("reward", row["reward"]),
                        "timings": meta.get("timings"),
                        "error": meta.get("error"),
                        "turns": meta.get("rollout_turns"),
                        "sampled_tokens": meta.get("sampled_tokens"),
                        "agent_exit_code": meta.get("agent_exit_code"),
                        "remove_sample": sample.get("remove_sample"),
                    }
                )
    for key, row in rows.items():
        row["num_samples"] = len(samples[key])
    return list(rows.values()), samples

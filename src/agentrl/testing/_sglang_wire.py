"""SGLang's ``/generate`` wire shapes for the scripted engine: request bodies and replies.

Public API (for :mod:`agentrl.testing.scripted_engine`)::

    counted_ids(raw) -> (body, count) | None   # plain-digit input_ids counted, not parsed
    all_ints(values) -> bool
    generate_reply(rid, ids, logprobs, finish, *, text, prompt_tokens, eos_token_id,
                   with_logprobs) -> dict     # the reply body: text, output_ids, meta_info
    error_response(status, message) -> web.Response   # SGLang's error body
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from agentrl import jsonio

__all__ = ["all_ints", "counted_ids", "error_response", "generate_reply"]

_IDS_KEY = b'"input_ids":['
_DIGITS = b"0123456789,"


def counted_ids(raw: bytes) -> tuple[dict[str, Any], int] | None:
    """The body with ``input_ids`` left empty and how many ids it held, for a body whose one
    ``input_ids`` array is plain digits and commas; None for anything else (parsed whole)."""
    start = raw.find(_IDS_KEY)
    if start < 0 or raw.find(_IDS_KEY, start + 1) >= 0:
        return None
    first = start + len(_IDS_KEY)
    end = raw.find(b"]", first)
    ids = raw[first:end]
    if (
        end < 0
        or ids.translate(None, _DIGITS)
        or b",," in ids
        or ids[:1] == b","
        or ids[-1:] == b","
    ):
        return None
    try:
        body = jsonio.loads(raw[:first] + raw[end:])
    except ValueError:
        return None
    return body, ids.count(b",") + 1 if ids else 0


def all_ints(values: list[Any]) -> bool:
    """Whether every value is an ``int`` (one C loop for a 128k prompt's ids)."""
    try:
        array("q", values)
    except TypeError:
        return False
    except OverflowError:
        return all(isinstance(value, int) for value in values)
    return True


def generate_reply(
    rid: str,
    ids: Sequence[int],
    logprobs: Sequence[float],
    finish: str,
    *,
    text: str,
    prompt_tokens: int,
    eos_token_id: int | None,
    with_logprobs: bool,
) -> dict[str, Any]:
    """A ``/generate`` reply body as SGLang sends it."""
    finish_reason: dict[str, Any] = {"type": finish}
    if finish == "stop" and ids and ids[-1] == eos_token_id:
        finish_reason["matched"] = eos_token_id
    elif finish == "length":
        finish_reason["length"] = len(ids)
    elif finish == "abort":
        finish_reason["message"] = "Abort request received."
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": "scripted",
    }
    if with_logprobs:
        meta["output_token_logprobs"] = [
            [lp, tid, None] for lp, tid in zip(logprobs, ids, strict=True)
        ]
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


def error_response(status: int, message: str) -> web.Response:
    """SGLang's error body with ``status``."""
    return web.json_response(
        {"error": {"message": message, "code": status}, "object": "error", "message": message},
        status=status,
    )

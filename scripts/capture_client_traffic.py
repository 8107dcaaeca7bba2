#!/usr/bin/env python3
"""Capture an agent CLI's real HTTP traffic against a logging stub LLM server (offline).

The stub listens on 127.0.0.1, records every request it receives as
``OUT/NNN_<method>_<path>.json`` (``method``, ``path``, ``query``, ``headers`` as sent,
``body``, ``raw_body_sha256``, ``stub_response``) and answers OpenAI Chat Completions
requests with scripted replies, in order (streamed as ``chat.completion.chunk`` events when
the request asks for a stream). Anything else gets a 404 in OpenAI's error shape, recorded
the same way. The CLI's stdout and stderr go to ``OUT/cli_stdout.txt`` / ``cli_stderr.txt``.

Usage (``{base_url}`` in the command is replaced by the stub's URL)::

    capture_client_traffic.py --out DIR --replies replies.json [--cwd REPO] -- CMD ARGS...

``replies.json`` is a list of ``{"content": str, "reasoning": str, "tool_calls":
[{"name": str, "arguments": {...}}]}``; a request past the end of the list gets
``{"content": "Done."}``. A ``"match"`` key makes a reply answer only requests whose raw
body contains that string (for side requests such as a session title), first match wins.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from aiohttp import web

DEFAULT_REPLY = {"content": "Done."}


def _usage(raw: bytes, reply: dict) -> dict:
    # About four bytes a token: clients that budget their context (compaction) see
    # plausible numbers.
    prompt = max(1, len(raw) // 4)
    completion = max(1, len(json.dumps(reply)) // 4)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _chunks(reply: dict, model: str, include_usage: bool, serial: int, usage: dict) -> str:
    head = {"id": f"chatcmpl-stub{serial:04d}", "object": "chat.completion.chunk"}
    head |= {"created": int(time.time()), "model": model}

    def event(delta: dict, finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return "data: " + json.dumps({**head, "choices": [choice]}) + "\n\n"

    out = [event({"role": "assistant", "content": ""})]
    if reply.get("reasoning"):
        out.append(event({"reasoning_content": reply["reasoning"]}))
    if reply.get("content"):
        out.append(event({"content": reply["content"]}))
    for index, call in enumerate(reply.get("tool_calls", ())):
        arguments = json.dumps(call["arguments"], ensure_ascii=False)
        call_id = f"call_stub_{serial:04d}_{index}"
        function = {"name": call["name"], "arguments": ""}
        out.append(
            event(
                {
                    "tool_calls": [
                        {"index": index, "id": call_id, "type": "function", "function": function}
                    ]
                }
            )
        )
        half = len(arguments) // 2
        for part in (arguments[:half], arguments[half:]):
            out.append(event({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
    out.append(event({}, "tool_calls" if reply.get("tool_calls") else "stop"))
    if include_usage:
        out.append("data: " + json.dumps({**head, "choices": [], "usage": usage}) + "\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out)


def _message(reply: dict, model: str, serial: int, usage: dict) -> dict:
    message = {"role": "assistant", "content": reply.get("content") or None}
    if reply.get("reasoning"):
        message["reasoning_content"] = reply["reasoning"]
    calls = [
        {
            "id": f"call_stub_{serial:04d}_{i}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for i, c in enumerate(reply.get("tool_calls", ()))
    ]
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-stub{serial:04d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": usage,
    }


class Stub:
    """The logging stub: records each request, answers chat completions from the script."""

    def __init__(self, out: pathlib.Path, replies: list[dict]) -> None:
        self.out = out
        self.replies = list(replies)
        self.count = 0

    def _next_reply(self, raw: bytes) -> dict:
        text = raw.decode(errors="replace")
        for i, reply in enumerate(self.replies):
            if "match" in reply and reply["match"] in text:
                return self.replies.pop(i)
        for i, reply in enumerate(self.replies):
            if "match" not in reply:
                return self.replies.pop(i)
        return DEFAULT_REPLY

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.count += 1
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        record = {
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "headers": {k.decode(): v.decode() for k, v in request.raw_headers},
            "body": body,
            "raw_body_sha256": hashlib.sha256(raw).hexdigest(),
        }
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            reply = self._next_reply(raw)
            model = body.get("model", "") if isinstance(body, dict) else ""
            if isinstance(body, dict) and body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                payload = _chunks(reply, model, include_usage, self.count, _usage(raw, reply))
                record["stub_response"] = {"status": 200, "kind": "sse", "payload": payload}
                response = web.Response(status=200, text=payload, content_type="text/event-stream")
            else:
                payload = _message(reply, model, self.count, _usage(raw, reply))
                record["stub_response"] = {"status": 200, "kind": "json", "payload": payload}
                response = web.json_response(payload)
        else:
            payload = {"error": {"message": "not found", "type": "invalid_request_error"}}
            record["stub_response"] = {"status": 404, "kind": "json", "payload": payload}
            response = web.json_response(payload, status=404)
        slug = re.sub(r"[^a-z0-9]+", "_", request.path.lower()).strip("_")
        name = f"{self.count:03d}_{request.method.lower()}_{slug}.json"
        (self.out / name).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        return response


def _git_repo(path: pathlib.Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for args in (
        ["init", "-q"],
        ["-c", "user.email=a@b", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "0"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


async def _main(args: argparse.Namespace, out: pathlib.Path, replies: list[dict]) -> int:
    stub = Stub(out, replies)
    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", stub.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    cwd = pathlib.Path(args.cwd) if args.cwd else out
    if args.cwd and not (cwd / ".git").exists():
        _git_repo(cwd)
    command = [part.replace("{base_url}", base_url) for part in args.command]
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), args.timeout)
    (out / "cli_stdout.txt").write_bytes(stdout)
    (out / "cli_stderr.txt").write_bytes(stderr)
    await runner.cleanup()
    print(f"exit {process.returncode}; {stub.count} requests recorded in {out}", file=sys.stderr)
    return process.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--replies")
    parser.add_argument("--cwd", help="run the CLI here (a fresh git repo is made if missing)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    os.umask(0o022)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    replies = json.loads(pathlib.Path(args.replies).read_text()) if args.replies else []
    sys.exit(asyncio.run(_main(args, out, replies)))


if __name__ == "__main__":
    main()

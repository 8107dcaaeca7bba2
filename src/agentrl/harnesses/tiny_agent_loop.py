"""The tiny agent's loop, run inside the sandbox by ``python3`` (standard library only).

``python3 tiny_agent_loop.py CONFIG PROMPT``: CONFIG is the JSON file the ``tiny_agent``
harness wrote (``base_url``, ``model``, ``system``, ``instruction``, ``max_turns``,
``max_tokens``, ``native_tools``), the session token is ``OPENAI_API_KEY``. Each turn is
one OpenAI Chat Completions call. The agent has one tool, ``write_file(path, content)``,
called either natively (``tool_calls``, offered when ``native_tools`` is on) or as the
first JSON object of the reply's text with the keys ``path`` and ``content`` (what a very
small model manages). It writes the file (inside the working directory only) and answers
with the tool's result. It stops when a reply calls no tool or after ``max_turns`` calls;
with ``max_turns`` 1 the first reply is the whole episode (its call still runs).
"""

import json
import os
import pathlib
import sys
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
]


def chat(config, messages):
    """One Chat Completions call; the assistant message of its first choice."""
    body = {"model": config["model"], "messages": messages}
    if config.get("native_tools"):
        body["tools"] = TOOLS
    if config.get("max_tokens"):
        body["max_tokens"] = config["max_tokens"]
    request = urllib.request.Request(
        config["base_url"].rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        },
    )
    with urllib.request.urlopen(request, timeout=config.get("timeout", 600)) as reply:
        return json.load(reply)["choices"][0]["message"]


def write_file(arguments):
    """Run one ``write_file`` call; the text the model gets back."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        path, content = args["path"], args["content"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: expected arguments {{path, content}}: {exc}"
    if not isinstance(path, str) or not isinstance(content, str):
        return "error: path and content must be strings"
    root = pathlib.Path.cwd().resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or target == root:
        return f"error: {path} is outside the working directory"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"wrote {len(content)} characters to {path}"


def text_call(content):
    """The ``write_file`` arguments in a reply's text: its first JSON object, or None."""
    decoder = json.JSONDecoder()
    start = (content or "").find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(content, start)
        except ValueError:
            start = content.find("{", start + 1)
            continue
        if isinstance(value, dict) and "path" in value and "content" in value:
            return {"path": value["path"], "content": value["content"]}
        return None
    return None


def main(config_path, prompt):
    config = json.loads(pathlib.Path(config_path).read_text())
    messages = [
        {"role": "system", "content": config["system"]},
        {"role": "user", "content": config.get("instruction", "") + prompt},
    ]
    for turn in range(1, int(config["max_turns"]) + 1):
        message = chat(config, messages)
        calls = message.get("tool_calls") or []
        content = message.get("content")
        print(json.dumps({"turn": turn, "content": content, "tool_calls": calls}))
        if not calls:
            arguments = text_call(content)
            if arguments is None:
                return 0
            result = write_file(arguments)
            print(json.dumps({"tool": "write_file", "result": result}))
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": "Tool result: " + result})
            continue
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call in calls:
            function = call.get("function") or {}
            if function.get("name") == "write_file":
                result = write_file(function.get("arguments"))
            else:
                result = f"error: unknown tool {function.get('name')!r}"
            print(json.dumps({"tool": function.get("name"), "result": result}))
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

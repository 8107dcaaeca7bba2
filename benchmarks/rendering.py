"""Per-turn prompt rendering cost: incremental renderer vs full re-render and re-tokenization.

Grows a coding-agent-shaped session (long system prompt, tools, tool calls whose results are
real Python source files) under the Qwen3 template and times, at each turn, both
``IncrementalRenderer.render`` and the full ``apply_chat_template(..., tokenize=True)``
that a re-render-everything middleware performs. Every turn also checks that both give
identical ids. Then one turn's new text (each source piece wrapped as a tool result's
seam) is tokenized with and without the ASCII BPE path (``agentrl.prompts.ascii_bpe``),
ids compared; goal: at least 2x the tokenizer alone.

    python benchmarks/rendering.py [--sizes 16000,32000,64000,131072] [--repeat 5]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time

from _driver import goal_line

from agentrl.prompts.rendering import IncrementalRenderer
from agentrl.tokenizers import build_qwen_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool. " * 40,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "command": {"type": "string"}},
            },
        },
    }
    for name in ("Bash", "Read", "Edit", "Write", "Grep", "Glob", "Task", "TodoWrite")
]


def source_texts():
    """Real Python sources from the standard library, in a fixed order."""
    import argparse as argparse_module
    import asyncio
    import collections
    import email
    import json as json_module
    import logging
    import pathlib

    for module in (
        argparse_module,
        asyncio.base_events,
        asyncio.tasks,
        collections,
        email.message,
        json_module.decoder,
        logging,
        pathlib,
    ):
        source = inspect.getsource(module)
        for start in range(0, len(source), 6000):
            yield source[start : start + 6000]


def session_turns():
    """Message lists of an endlessly growing session, one per agent turn."""
    messages = [
        {"role": "system", "content": "You are an interactive coding agent. " * 400},
        {"role": "user", "content": "Fix the failing test in the repository."},
    ]
    texts = source_texts()
    turn = 0
    while True:
        yield list(messages)
        turn += 1
        try:
            chunk = next(texts)
        except StopIteration:
            texts = source_texts()
            chunk = next(texts)
        call = {"path": f"src/module_{turn}.py"}
        messages.append(
            {
                "role": "assistant",
                "content": f"Reading file {turn}.",
                "reasoning_content": f"I should read file {turn} to understand it.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "Read", "arguments": call}}
                ],
            }
        )
        messages.append({"role": "tool", "content": chunk})


def measure(tokenizer, sizes, repeat):
    """Time both methods at the turn where the prompt first reaches each size."""
    targets = sorted(sizes)
    renderer = IncrementalRenderer(tokenizer, tools=TOOLS)
    rows = []
    for messages in session_turns():
        prompt = renderer.render(messages)
        if not targets or len(prompt.ids) < targets[0]:
            continue
        size = targets.pop(0)
        incremental, full = [], []
        for _ in range(repeat):
            # Re-render the previous turn, then time the step to this one.
            renderer.render(messages[:-2] if len(messages) > 2 else messages)
            start = time.perf_counter()
            got = renderer.render(messages)
            incremental.append(time.perf_counter() - start)
            start = time.perf_counter()
            reference = tokenizer.apply_chat_template(
                messages, tools=TOOLS, add_generation_prompt=True, tokenize=True
            )["input_ids"]
            full.append(time.perf_counter() - start)
            if list(got.ids) != list(reference):
                raise SystemExit(f"incremental ids differ from full ids at {size} tokens")
        rows.append(
            {
                "target_tokens": size,
                "prompt_tokens": len(prompt.ids),
                "incremental_ms": statistics.median(incremental) * 1000,
                "full_ms": statistics.median(full) * 1000,
                "speedup": statistics.median(full) / statistics.median(incremental),
                "tokenized_chars": got.tokenized_chars,
                "prompt_chars": len(got.text),
            }
        )
        if not targets:
            break
    return rows


def measure_new_text(tokenizer, repeat):
    """One turn's new text (each real source piece, as its tool result's seam) tokenized by
    ``SegmentEncoder`` with and without the ASCII BPE path, CPU per piece; ids compared."""
    from agentrl.prompts.segments import SegmentEncoder

    encoder = SegmentEncoder.for_tokenizer(tokenizer)
    if encoder is None or encoder.ascii_bpe is None:
        raise SystemExit("this tokenizer has no ASCII BPE path")
    pieces = [
        f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{text}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        for text in source_texts()
        if text.isascii()
    ]
    fast = encoder.ascii_bpe
    timings: dict[str, list[float]] = {"ascii_bpe": [], "tokenizer": []}
    for _ in range(repeat):
        for name in timings:
            encoder.ascii_bpe = fast if name == "ascii_bpe" else None
            started = time.process_time()
            ids = [encoder.ids(piece) for piece in pieces]
            timings[name].append((time.process_time() - started) / len(pieces))
            if name == "ascii_bpe":
                got = ids
            elif got != ids:
                raise SystemExit("the ASCII BPE path's ids differ from the tokenizer's")
    encoder.ascii_bpe = fast
    ours, theirs = (min(timings[name]) * 1000 for name in ("ascii_bpe", "tokenizer"))
    return {
        "pieces": len(pieces),
        "chars": statistics.mean(map(len, pieces)),
        "ascii_bpe_cold_ms": timings["ascii_bpe"][0] * 1000,
        "ascii_bpe_ms": ours,
        "tokenizer_ms": theirs,
        "speedup": theirs / ours,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16000,32000,64000,131072")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args()
    tokenizer = build_qwen_tokenizer()
    rows = measure(tokenizer, [int(s) for s in args.sizes.split(",")], args.repeat)
    new_text = measure_new_text(tokenizer, args.repeat)
    if args.json:
        print(json.dumps({"rows": rows, "new_text": new_text}, indent=2))
        return
    print(f"{'tokens':>8} {'incremental ms':>15} {'full ms':>10} {'speedup':>8} {'tokenized':>10}")
    for row in rows:
        print(
            f"{row['prompt_tokens']:>8} {row['incremental_ms']:>15.2f} {row['full_ms']:>10.2f} "
            f"{row['speedup']:>7.1f}x {row['tokenized_chars']:>10}"
        )
    print(
        f"\nOne turn's new text ({new_text['pieces']} real source pieces of "
        f"~{new_text['chars']:.0f} characters, CPU per piece, ids identical): ASCII BPE "
        f"{new_text['ascii_bpe_ms']:.2f} ms ({new_text['ascii_bpe_cold_ms']:.2f} ms on the first "
        f"pass, its word cache empty), the tokenizer alone {new_text['tokenizer_ms']:.2f} ms"
    )
    print(
        goal_line(
            "new-text tokenization, ASCII BPE vs the tokenizer",
            f"{new_text['speedup']:.1f}x",
            ">= 2x",
            new_text["speedup"] >= 2,
        )
    )


if __name__ == "__main__":
    main()

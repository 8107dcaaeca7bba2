"""Token yield per scenario, splice vs render, in one run.

Every scripted scenario of ``agentrl.preflight`` (reasoning on and off, user text every
turn or never, parallel tool calls, whitespace around thinking and text, empty think
blocks, re-ordered tool input keys on replay, a sub-agent, outputs cut by ``length``) is
played by a Claude-Code-shaped and a Codex-shaped client through the real middleware,
the real Qwen3 chat template and parsers, once per prompt mode. Reported per scenario:
trained / sampled tokens, the number of samples, and the tokens of all samples against
the session's final context.

Goal: splice trains 100% of the sampled tokens in every scenario, with sample tokens
equal to the session's final context (one sample per conversation, not a fork per turn).
Render mode, the fallback, is shown beside it.

    python benchmarks/yield.py [--protocol anthropic openai_responses] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def measure(tokenizer, protocol: str, mode: str) -> list[dict[str, Any]] | str:
    """One mode's reports for ``protocol``, or why the mode could not run."""
    from agentrl.preflight import PreflightError, run_preflight

    try:
        reports = run_preflight(tokenizer, protocol=protocol, modes=(mode,))[mode]
    except PreflightError as exc:
        return str(exc)
    return [
        {
            "scenario": r.scenario,
            "trained": r.trained,
            "sampled": r.sampled,
            "yield": r.token_yield,
            "samples": r.samples,
            "sample_tokens": r.sample_tokens,
            "final_context_tokens": r.final_context_tokens,
            "token_ratio": r.token_ratio,
            "fallbacks": r.fallbacks,
        }
        for r in reports
    ]


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return f"{'n/a':>30}"
    return (
        f"{row['trained']:>4}/{row['sampled']:<4} {100 * row['yield']:5.1f}%  "
        f"{row['samples']:>2} x{row['token_ratio']:4.2f}"
    )


def print_table(protocol: str, results: dict[str, Any]) -> None:
    print(f"\n{protocol}: trained/sampled, yield, samples, sample tokens / final context")
    print(f"  {'scenario':<22}  {'splice':^30}  {'render':^30}")
    rows = {mode: r for mode, r in results.items() if isinstance(r, list)}
    names = [row["scenario"] for row in next(iter(rows.values()), [])]
    for name in names:
        cells = []
        for mode in ("splice", "render"):
            found = rows.get(mode)
            cells.append(
                _cell(next((x for x in found if x["scenario"] == name), None) if found else None)
            )
        print(f"  {name:<22}  {cells[0]:>30}  {cells[1]:>30}")
    for mode, found in results.items():
        if isinstance(found, str):
            print(f"  {mode}: not run: {found}")
            continue
        trained = sum(r["trained"] for r in found)
        sampled = sum(r["sampled"] for r in found)
        line = f"  {mode}: {trained}/{sampled} = {100 * trained / sampled:.1f}% overall"
        if mode == "splice":
            ideal = all(r["yield"] == 1.0 and r["token_ratio"] <= 1.0 for r in found)
            line += f"; goal (100% everywhere, tokens = context) {'met' if ideal else 'NOT met'}"
        print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--protocol", nargs="+", default=["anthropic", "openai_responses"], help="wire protocols"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    from agentrl.tokenizers import build_qwen_tokenizer

    tokenizer = build_qwen_tokenizer()
    started = time.perf_counter()
    result = {
        protocol: {mode: measure(tokenizer, protocol, mode) for mode in ("splice", "render")}
        for protocol in args.protocol
    }
    if args.json:
        print(json.dumps({**result, "seconds": time.perf_counter() - started}, indent=2))
        return
    print(__doc__.split("\n\n")[2].replace("\n", " "))
    for protocol, results in result.items():
        print_table(protocol, results)
    print(f"\ntotal {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()

"""`agentrl view` on a 128k-token sample: preparing it, and drawing it in headless chromium.

The sample: real token ids (agentrl's own source code through the Qwen3 tokenizer, repeated
to ``--tokens``), a 4k-token prompt, then turns of sampled (trained) output and context,
a turn marker every turn and one REALIGN. Written into an output directory as the runner
writes one, then:

- prepare: ``RunSource.rollout_data`` (reading the row, classes, markers, decoding every
  distinct id) and the ``--html`` export;
- first render: chromium opens the export at the rollout page; the time from navigation
  start until the frame after the token rows are drawn (the page's own
  ``performance.now()``: parsing the file, the data and drawing the page);
- scroll to the end: the time from setting ``scrollTop`` to the bottom until the last row
  is drawn (the next animation frame);
- rows on the page: how many token spans the virtualised view holds (not 128k).

    python benchmarks/view.py [--tokens 131072] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import shutil
import sys
import tempfile
import time

from _driver import goal_line

from agentrl.tokenizers import load_tokenizer, qwen_tokenizer_dir
from agentrl.view import RunSource, export_html

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOAL_PREPARE_S = 3.0
GOAL_FIRST_RENDER_S = 1.0
GOAL_SCROLL_S = 0.1
GOAL_SPANS = 20_000


def real_ids(tokenizer, count: int) -> list[int]:
    """``count`` ids of real text: agentrl's source, tokenized, repeated."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "src" / "agentrl").rglob("*.py")))
    ids = tokenizer.encode(text, add_special_tokens=False)
    return (ids * (count // len(ids) + 1))[:count]


def write_run(out: pathlib.Path, ids: list[int], prompt: int, turn: int) -> None:
    """One rollout with one long sample, as the runner writes it."""
    rng = random.Random(0)
    mask, turns, turn_meta, facts = [], [], {}, []
    position = prompt
    index = 0
    while position < len(ids):
        output = min(turn * 2 // 3, len(ids) - position)
        context = min(turn - output, len(ids) - position - output)
        index += 1
        turns.append(index)
        turn_meta[str(index)] = {"middleware_turn": index - 1, "prompt_mode": "splice"}
        facts.append({"index": index - 1, "prompt_tokens": position, "output_tokens": output,
                      "finish_reason": "stop", "tool_calls": ["Bash"], "ill_formed": False})  # fmt: skip
        mask += [1] * output + [0] * context
        position += output + context
    logprobs = [-rng.expovariate(4.0) if m else 0.0 for m in mask]
    sample = {
        "key": "long#0", "tokens": ids, "prompt_length": prompt,
        "response_length": len(ids) - prompt, "loss_mask": mask, "rollout_logprobs": logprobs,
        "reward": 1.0,
        "metadata": {"leaf": index, "segment": 0, "turns": turns, "trained_turns": turns[1:],
                     "realigned_turns": turns[:1], "turn_metadata": turn_meta},
    }  # fmt: skip
    out.mkdir(parents=True)
    (out / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    row = {"key": "long#0", "instance_id": "long", "outcome": "solved", "reward": 1.0,
           "attempt": 1, "sampled_tokens": sum(mask), "timings": {"agent": 60.0}}  # fmt: skip
    (out / "rollouts.jsonl").write_text(json.dumps(row) + "\n")
    (out / "sessions").mkdir()
    (out / "sessions" / "long__0.json").write_text(json.dumps({"turns": facts}))


def measure_browser(chromium: str, html: pathlib.Path) -> dict[str, float]:
    """First render, scroll to the end, and spans held, in headless chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(html.as_uri() + "#/rollout/long%230")
            page.wait_for_selector("body[data-painted-at]", timeout=60_000)
            first = float(page.get_attribute("body", "data-painted-at")) / 1000
            scroll = page.evaluate(
                """() => new Promise((done) => {
                    const box = document.querySelector('.tokens');
                    const last = box.querySelector('.spacer').offsetHeight;
                    const started = performance.now();
                    box.scrollTop = last;
                    const check = () => {
                      const rows = box.querySelectorAll('.row');
                      const bottom = rows.length && rows[rows.length - 1].offsetTop + 18 >= last - 1;
                      if (bottom) done((performance.now() - started) / 1000);
                      else requestAnimationFrame(check);
                    };
                    requestAnimationFrame(check);
                })"""
            )
            spans = page.evaluate("document.querySelectorAll('.tokens .tok').length")
            at_end = page.evaluate(
                "Number([...document.querySelectorAll('.tokens .tok')].pop().dataset.i)"
            )
        finally:
            browser.close()
    return {"first": first, "scroll": scroll, "spans": spans, "at_end": at_end}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=131_072)
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--turn", type=int, default=1200, help="tokens per turn (output + context)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    tokenizer_dir = qwen_tokenizer_dir()
    tokenizer = load_tokenizer(tokenizer_dir)
    ids = real_ids(tokenizer, args.tokens)
    with tempfile.TemporaryDirectory(prefix="agentrl-view-bench-") as tmp:
        out = pathlib.Path(tmp) / "run"
        write_run(out, ids, args.prompt, args.turn)
        source = RunSource.open(out, tokenizer=str(tokenizer_dir))
        started = time.perf_counter()
        detail = source.rollout_data("long#0")
        prepared = time.perf_counter() - started
        html = pathlib.Path(tmp) / "view.html"
        started = time.perf_counter()
        html.write_text(export_html(source))
        exported = time.perf_counter() - started
        distinct = len(detail["vocab"])
        print(f"view of one {len(ids)}-token sample ({distinct} distinct ids, "
              f"{len(detail['session']['samples'][0]['markers'])} markers), "
              f"export {html.stat().st_size / 1e6:.1f} MB")  # fmt: skip
        print(goal_line("prepare (rows, classes, markers, decode)", f"{prepared:.2f} s",
                        f"<= {GOAL_PREPARE_S:.0f} s", prepared <= GOAL_PREPARE_S))  # fmt: skip
        print(goal_line("--html export", f"{exported:.2f} s", "", None))
        if not pathlib.Path(args.chromium).exists():
            print(f"  chromium not found at {args.chromium}: browser figures skipped")
            return 0
        figures = measure_browser(args.chromium, html)
    print(goal_line("first render (navigation to drawn rows)", f"{figures['first']:.2f} s",
                    f"<= {GOAL_FIRST_RENDER_S:.0f} s", figures["first"] <= GOAL_FIRST_RENDER_S))  # fmt: skip
    print(goal_line("scroll to the end (to the last row drawn)", f"{figures['scroll'] * 1000:.0f} ms",
                    f"<= {GOAL_SCROLL_S * 1000:.0f} ms", figures["scroll"] <= GOAL_SCROLL_S))  # fmt: skip
    ok = figures["spans"] <= GOAL_SPANS and figures["at_end"] == len(ids) - 1
    print(goal_line("token spans on the page after the scroll", f"{figures['spans']}",
                    f"<= {GOAL_SPANS} (of {len(ids)}), last token shown", ok))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`agentrl view` over an output directory a hostile policy's session shaped.

Everything in the directory is data: markup in a diff, a log or a task text never becomes
markup on the page; a key never becomes a path (no ``../``, no symlink out); huge files
are read under a cap.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import shutil
import time

import pytest

from agentrl.view import RunSource, export_html
from agentrl.view.files import MAX_LOG_TAIL_BYTES, rollout_file, rollout_stem
from agentrl.view.page import embed_json

SCRIPT = "</script><script>window.__pwned = 1</script><img src=x onerror='window.__pwned=2'>"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _hostile_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    out = tmp_path / "run"
    for folder in ("diffs", "agent_logs", "sessions"):
        (out / folder).mkdir(parents=True)
    rows = [
        {"key": "evil#0", "instance_id": SCRIPT, "outcome": "agent_error", "reward": 0.0,
         "error": SCRIPT, "harness": SCRIPT, "attempt": 1, "timings": {SCRIPT: 1.0},
         "diff_path": "/etc/passwd", "agent_log_path": "/etc/shadow", "node_id": SCRIPT,
         "node_ip": SCRIPT, "rescheduled": [{"node_id": SCRIPT, "error": SCRIPT}, SCRIPT],
         "grade": {"reward": 0, "details": {SCRIPT: SCRIPT}}},
        {"key": "../../secret#0", "instance_id": "x", "outcome": "solved", "reward": 1.0},
        {"key": "link#0", "instance_id": "y", "outcome": "solved", "reward": 1.0},
    ]  # fmt: skip
    (out / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "diffs" / "evil__0.diff").write_text(f"+{SCRIPT}\n")
    (out / "agent_logs" / "evil__0.log").write_text(SCRIPT)
    session = {"task": {"problem_statement": SCRIPT}, "turns": [{"tool_calls": [SCRIPT]}]}
    (out / "sessions" / "evil__0.json").write_text(json.dumps(session))
    (tmp_path / "secret.diff").write_text("SECRET CONTENT")
    (out / "diffs" / "link__0.diff").symlink_to(tmp_path / "secret.diff")
    sample = {"key": "evil#0", "tokens": [1, 2, 3], "prompt_length": 1, "loss_mask": [1, 0],
              "rollout_logprobs": [-1.0, 0.0], "metadata": {"turns": [1], "trained_turns": [1],
              "turn_metadata": {"1": {"middleware_turn": 0, "prompt_mode": SCRIPT}}}}  # fmt: skip
    (out / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    (out / "summary.json").write_text(json.dumps({"tokenizer": str(tmp_path / "nope")}))
    return out


def test_markup_in_every_text_stays_inert_in_the_export(tmp_path):
    """Attack: ``</script><script>…`` in a diff, log, task text, error, key fields, Ray
    node fields and turn facts. Bound: the export has exactly our two script elements and no ``<`` inside
    the data; the data parses back to the very strings."""
    html = export_html(RunSource.open(_hostile_dir(tmp_path)))
    assert len(re.findall(r"<script", html, re.IGNORECASE)) == 2
    data_text = html.split('id="agentrl-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data_text and ">" not in data_text
    data = json.loads(data_text)
    detail = data["details"]["evil#0"]
    assert detail["diff"]["text"] == f"+{SCRIPT}\n" and detail["log"]["text"] == SCRIPT
    assert detail["task"]["problem_statement"] == SCRIPT
    assert embed_json("\u2028</script>") == '"\\u2028\\u003c/script\\u003e"'


def test_keys_never_become_paths(tmp_path):
    """Attack: a key with ``../``, a row naming /etc/passwd as its diff, a symlink out of
    diffs/. Bound: no file outside the directory is read; unknown keys are None."""
    out = _hostile_dir(tmp_path)
    source = RunSource.open(out)
    assert rollout_stem("../../secret#0") is None and rollout_stem("a/b#0") is None
    assert rollout_stem("..#0") is None and rollout_stem("ok#1", attempt=2) == "ok__1.attempt-2"
    assert rollout_file(out, "diff", "../../secret#0") is None
    assert source.rollout_data("../../secret#0")["diff"] is None
    assert source.rollout_data("link#0")["diff"] is None  # the symlink leaves the folder
    evil = source.rollout_data("evil#0")
    assert "root:" not in json.dumps(evil)
    for key in ("../summary", "/etc/passwd", None, 7, ["evil#0"]):
        assert source.rollout_data(key) is None
    assert not source.token_text.decodes  # a tokenizer path that does not load: ids


def test_huge_log_and_diff_are_read_under_a_cap(tmp_path):
    """Attack: a 64 MB agent log and diff. Bound: the log's last 64 KiB and the diff's
    first 512 KiB are read; the export stays under 2 MB and is written in seconds."""
    out = _hostile_dir(tmp_path)
    chunk = b"x" * (1 << 20)
    for path in (out / "agent_logs" / "evil__0.log", out / "diffs" / "evil__0.diff"):
        with path.open("wb") as fh:
            for _ in range(64):
                fh.write(chunk)
            fh.write(b"THE END")
    started = time.monotonic()
    source = RunSource.open(out)
    detail = source.rollout_data("evil#0")
    assert detail["log"]["truncated"] and detail["log"]["text"].endswith("THE END")
    assert len(detail["log"]["text"]) == MAX_LOG_TAIL_BYTES
    assert detail["diff"]["truncated"] and detail["diff"]["size"] > 64 << 20
    assert len(export_html(source)) < 2 << 20
    assert time.monotonic() - started < 10


def test_deep_or_broken_json_is_unknown_not_a_crash(tmp_path):
    """Attack: a session file nested 100k deep, torn JSONL lines, a sample row of junk.
    Bound: the rollout still shows, its facts unknown."""
    out = _hostile_dir(tmp_path)
    (out / "sessions" / "evil__0.json").write_text("[" * 100_000 + "]" * 100_000)
    with (out / "samples.jsonl").open("a") as fh:
        fh.write('{"key": "evil#0", "tokens": {"a": 1}}\n{"key": "evil#0", "tok\n[1,2]\n')
    detail = RunSource.open(out).rollout_data("evil#0")
    assert detail["session"]["facts_known"] is False
    assert len(detail["session"]["samples"]) == 1


@pytest.mark.slow
async def test_no_script_of_the_data_runs_in_a_browser(tmp_path):
    """Attack: the markup above (in the Ray node and reschedule fields too), opened in
    headless chromium, and a malformed key in the address. Bound: no injected script ran (``window.__pwned`` unset), the text is on the
    page as text, and the bad key is "no rollout", not a dead page."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("playwright is missing")
        pytest.skip("playwright is not installed")
    if not await asyncio.to_thread(os.path.exists, CHROMIUM):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium is missing")
        pytest.skip("chromium is not installed")
    html = tmp_path / "view.html"
    html.write_text(export_html(RunSource.open(_hostile_dir(tmp_path))))
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await page.goto(html.as_uri() + "#/rollout/evil%230")
            await page.wait_for_selector("body[data-ready]")
            assert await page.evaluate("window.__pwned === undefined")
            assert SCRIPT in await page.text_content("#diff pre")
            assert SCRIPT in await page.text_content("#task pre")
            assert SCRIPT in await page.text_content("#node li.rescheduled")
            await page.evaluate("location.hash = '#/'")
            await page.wait_for_selector("body[data-ready='#/']")
            assert await page.evaluate("window.__pwned === undefined")
            assert await page.locator("img").count() == 0
            await page.evaluate("location.hash = '#/rollout/%E0%A4%A'")  # a malformed escape
            await page.wait_for_selector("#missing")
        finally:
            await browser.close()

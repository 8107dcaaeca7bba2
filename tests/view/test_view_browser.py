"""`agentrl view` in a real headless browser (Debian's chromium, driven by playwright).

The export holds a real rollout (the real Claude Code CLI through the whole stack, the
scripted SGLang engine as the model, as in tests/cli/test_rollout_cli.py) and the crafted
session of tests/support/view_support.py (a sub-agent, a REALIGN, a FORK) committed into the same
directory by the real runner. The tests assert on the DOM and leave screenshots in
``$AGENTRL_SCREENSHOT_DIR`` (default .cache/screenshots) for a person to look at.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from rollout_support import CLI_DIR, claude_solution, example_task_file
from view_support import (
    FAILING_TASK,
    LONG_TASK,
    SESSION_TASK,
    CraftedResult,
    crafted_session,
    crafted_token_text,
    goto_hash,
    long_prompt_session,
    open_page,
    screenshot,
    viewer,
    write_run,
)

from agentrl.types import Outcome
from agentrl.view import RunSource, export_html

REPO = Path(__file__).resolve().parents[2]


async def _real_rollout(tmp_path: Path, engine, tokenizer_dir: Path) -> Path:
    """``agentrl rollout`` of textstats-1 with Claude Code; the output directory."""
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(
            f"agent CLIs missing in {CLI_DIR}; run `agentrl install-clis --dest .cache/clis`"
        )
    for reply in claude_solution():
        engine.queue(reply)
    out = tmp_path / "run"
    args = [
        "rollout", str(example_task_file(tmp_path)), "--harness", "claude_code",
        "--engine-url", engine.url, "--tokenizer", str(tokenizer_dir), "--cli-dir", str(CLI_DIR),
        "--out", str(out), "--agent-time-budget", "240", "--eval-timeout", "180",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrl.cli", *args, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out


@pytest.mark.slow
async def test_export_of_a_real_rollout_shows_outcomes_tokens_and_the_session_tree(
    browser, tmp_path, scripted_engine, qwen_tokenizer, qwen_tokenizer_dir
):
    """The offline export: outcome counts, failures by reason, a trained and a masked
    token's class, the FORK and REALIGN markers, a sub-agent branch, and the real Claude
    Code rollout's turns with the tool calls the runner's session file recorded."""
    out = await _real_rollout(tmp_path, scripted_engine, qwen_tokenizer_dir)
    more = {
        FAILING_TASK: CraftedResult(
            instance_id=FAILING_TASK, outcome=Outcome.INFRA_ERROR, reward=0.0,
            error="sandbox boot failed after 3 attempts: connection refused",
        ),
        SESSION_TASK: crafted_session(qwen_tokenizer),
    }  # fmt: skip
    await asyncio.to_thread(write_run, out, more, str(qwen_tokenizer_dir))
    html = tmp_path / "view.html"
    html.write_text(export_html(RunSource.open(out)))

    page = await open_page(browser, html.as_uri())
    counts = {
        outcome: await page.text_content(f".outcome[data-outcome={outcome}] .count")
        for outcome in ("solved", "infra_error")
    }
    assert counts == {"solved": "2", "infra_error": "1"}
    assert await page.locator("tr.rollout-row").count() == 3
    failure = page.locator("tr.failure-row")
    assert "sandbox boot failed after N attempts" in await failure.text_content()
    assert await failure.locator("a.rollout-link").get_attribute("href") == "#/rollout/broken-1%230"
    await page.select_option("#filter-outcome", "infra_error")
    assert await page.locator("tr.rollout-row").count() == 1
    await screenshot(page, "view-run")

    await goto_hash(page, "#/rollout/" + quote("textstats-1#0", safe=""))
    assert "text.split()" in await page.text_content("#diff pre")
    main = page.locator("li.chain[data-kind=main]").first
    tools = await main.locator("tr.turn-row td:nth-child(7)").all_text_contents()
    assert {"Read", "Edit", "Bash"} <= set(tools), tools
    sample = page.locator("#samples .sample").first
    head = await sample.locator(".sample-head").text_content()
    total = int(re.search(r"(\d+) tokens", head).group(1))
    assert (
        0 < await sample.locator(".tokens .tok").count() < total / 2
    )  # virtualised: visible rows only
    await sample.locator("select.jump").select_option(label="first trained token")
    trained = sample.locator(".tokens .tok-trained").first
    await trained.wait_for(state="attached")
    await main.locator("tr.turn-row").nth(2).click()  # the Bash turn: its tokens come into view
    bash_turn = sample.locator(".marker-turn", has_text="tools: Bash")
    await bash_turn.wait_for(state="attached")
    shown, where = await sample.locator(".tokens").bounding_box(), await bash_turn.bounding_box()
    assert shown["y"] <= where["y"] <= shown["y"] + shown["height"]
    assert "tok-trained" in await trained.get_attribute("class")
    assert await trained.get_attribute("data-i")
    await screenshot(page, "view-rollout-claude")

    await goto_hash(page, "#/rollout/" + quote(f"{SESSION_TASK}#0", safe=""))
    assert await page.locator("li.chain-sub-agent").count() == 1
    assert "spawned by Task" in await page.text_content("li.chain-sub-agent .chain-head")
    assert await page.locator(".marker-fork").count() == 1
    assert "diverged from the held tokens" in await page.text_content(".marker-fork")
    assert "re-tokenised" in await page.text_content(".marker-realign")
    drift = page.locator(".tokens .tok-drift").first
    assert "tok-drift" in await drift.get_attribute("class")
    fallback = await page.locator(".marker-fallback").first.text_content()
    assert fallback.startswith("fallback to render: new_chain · the conversation has no earlier")
    await drift.hover()
    assert "masked after drift" in await page.text_content("#tip")
    await screenshot(page, "view-rollout-crafted")
    assert page.errors == []


async def test_server_mode_loads_each_rollout_when_opened(browser, crafted_source):
    """`agentrl view DIR`: the printed URL opens the page (holding no data); a rollout's
    JSON is fetched when its page opens, and an unknown key is a 404, not a file read.
    The filters say "all harnesses", and a solved rollout's empty error is blank."""
    async with viewer(crafted_source) as server:
        page = await open_page(browser, server.url)
        base = f"http://127.0.0.1:{server.port}"
        assert page.url == base + "/"  # the token went into a cookie, out of the address
        fetched = []
        page.on("request", lambda request: fetched.append(request.url))
        assert await page.text_content(".outcome[data-outcome=solved] .count") == "1"
        assert await page.text_content("#filter-harness option[value='']") == "all harnesses"
        assert "null" not in await page.text_content("main")
        solved = page.locator("tr.rollout-row[data-outcome=solved]")
        assert await solved.locator("td").last.text_content() == ""
        assert not [url for url in fetched if "api/rollout" in url]
        await goto_hash(page, "#/rollout/" + quote(f"{SESSION_TASK}#0", safe=""))
        assert [url for url in fetched if "api/rollout" in url]
        assert await page.locator(".marker-realign").count() == 1
        missing = await page.request.get(f"{base}/api/rollout?key=../summary")
        assert missing.status == 404
        await screenshot(page, "view-server-rollout")
        assert page.errors == []


async def test_the_token_view_opens_at_the_first_trained_token(browser, tmp_path, qwen_tokenizer):
    """A sample whose prompt is a 3000-word system prompt: its token box opens scrolled to
    the first trained token (in view, no menu used), not at the top of the prompt."""
    out = tmp_path / "run"
    await asyncio.to_thread(write_run, out, {LONG_TASK: long_prompt_session(qwen_tokenizer)}, None)
    source = RunSource.open(out)
    source.token_text = crafted_token_text(qwen_tokenizer)
    html = tmp_path / "view.html"
    html.write_text(export_html(source))
    page = await open_page(browser, html.as_uri() + "#/rollout/" + quote(f"{LONG_TASK}#0", safe=""))
    sample = page.locator("#samples .sample").first
    box = sample.locator(".tokens")
    trained = box.locator(".tok-trained").first
    await trained.wait_for(state="attached", timeout=10_000)
    assert "null" not in await page.text_content("main")
    shown, where = await box.bounding_box(), await trained.bounding_box()
    assert shown["y"] <= where["y"] and where["y"] + where["height"] <= shown["y"] + shown["height"]
    assert await box.evaluate("b => b.scrollTop") > 1000  # far below the prompt's start
    assert await box.locator(".tok-prompt").count() > 0  # the prompt's end, for context
    await screenshot(page, "view-first-trained")
    assert page.errors == []

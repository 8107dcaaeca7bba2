"""`agentrl view`'s server in a real headless browser: other pages cannot read it, a run in
progress shows its new rollouts as they commit, and two runs compare side by side.

The viewer is the real server (``ViewServer``, as ``agentrl view`` starts it); the
attacker's page is served by a second real aiohttp server on another port, and the DNS
rebinding attacker's host name resolves to 127.0.0.1 through chromium's own resolver
rules (see the ``browser`` fixture).
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from aiohttp import web
from view_support import (
    REBIND_HOST,
    SESSION_TASK,
    CraftedResult,
    goto_hash,
    on_node,
    open_page,
    screenshot,
    viewer,
    write_run,
)

from agentrl.types import Outcome
from agentrl.view import RunSource

KEY = f"{SESSION_TASK}#0"
#: The attacker's page: it tries every way a page can reach another origin's data.
ATTACK = """<!doctype html><html><body><script>
(async () => {
  const target = new URLSearchParams(location.search).get("target");
  const read = {};
  for (const path of ["/", "/api/run", "/api/rollout?key=crafted-1%230", "/api/events"]) {
    try {
      const r = await fetch(target + path, { credentials: "include" });
      read[path] = r.status + " " + (await r.text());
    } catch (e) { read[path] = "blocked"; }
    try { await fetch(target + path, { mode: "no-cors", credentials: "include" }); } catch (e) {}
  }
  window.read = read;
})();
</script></body></html>"""


async def _attacker_site():
    """A second real web server on 127.0.0.1 (another port) serving :data:`ATTACK`."""

    async def attack(request: web.Request) -> web.Response:
        return web.Response(text=ATTACK, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", attack)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def test_a_page_of_another_origin_cannot_read_the_viewer(browser, crafted_source):
    """The user has the viewer open (its cookie set); a page on another port of
    127.0.0.1 (same site) and one on localhost (another site) fetch the page, the run,
    a rollout and the event stream, with credentials and without CORS: every answer is
    403 and nothing of the run reaches the attacker's script."""
    async with viewer(crafted_source) as server:
        context = await browser.new_context()
        runner, attacker_port = await _attacker_site()
        try:
            mine = await context.new_page()
            await mine.goto(server.url)
            await mine.wait_for_selector("body[data-ready]")
            assert KEY in await mine.text_content("#rollouts")  # the cookie works here
            base = f"http://127.0.0.1:{server.port}"
            for origin in (
                f"http://127.0.0.1:{attacker_port}",
                f"http://localhost:{attacker_port}",
            ):
                page = await context.new_page()
                answers: list = []
                page.on("response", lambda r, seen=answers: seen.append(r))
                await page.goto(f"{origin}/?target={base}")
                await page.wait_for_function("window.read !== undefined")
                read = await page.evaluate("window.read")
                answers = [a for a in answers if a.url.startswith(base + "/")]
                paths = {a.url[len(base) :] for a in answers}
                assert paths == {"/", "/api/run", "/api/rollout?key=crafted-1%230", "/api/events"}
                assert {a.status for a in answers} == {403}, [(a.url, a.status) for a in answers]
                assert not [text for text in read.values() if KEY in text or "crafted" in text]
                await page.close()
        finally:
            await context.close()
            await runner.cleanup()


async def test_a_rebound_host_name_is_refused(browser, crafted_source):
    """DNS rebinding: the viewer's own page loaded under an attacker's host name that
    resolves to 127.0.0.1 (so the page is that origin's, and could read the API) is
    421, with or without the token, and so is a script of that origin fetching the API
    (the attacker's, served before the name was re-pointed: run here with the refusal's
    own content security policy bypassed)."""
    async with viewer(crafted_source) as server:
        context = await browser.new_context(bypass_csp=True)
        try:
            page = await context.new_page()
            rebound = f"http://{REBIND_HOST}:{server.port}"
            for url in (rebound + "/", f"{rebound}/?token={server.access.token}"):
                response = await page.goto(url)
                assert response.status == 421
                assert KEY not in await page.content()
            status, text = await page.evaluate(
                "t => fetch('/api/run?token=' + t).then(async r => [r.status, await r.text()])",
                server.access.token,
            )
            assert status == 421 and KEY not in text
            await screenshot(page, "view-rebinding-refused")
        finally:
            await context.close()


async def test_a_rollout_committed_while_the_page_is_open_appears_on_it(
    browser, tmp_path, qwen_tokenizer_dir
):
    """A run in progress (on Ray): the page is open on the run; the runner commits a
    rollout that ran on node b after node a was lost. Without a reload, its row appears
    with the node and the reschedule, the outcome counts and the Ray nodes table follow
    (the node filter picks it), and its page says where it ran and where it was lost."""
    out = tmp_path / "run"
    first = CraftedResult(instance_id="first-1", outcome=Outcome.UNSOLVED, reward=0.0)
    await asyncio.to_thread(write_run, out, {"first-1": first}, str(qwen_tokenizer_dir))
    async with viewer(RunSource.open(out)) as server:
        page = await open_page(browser, server.url)
        assert await page.locator("tr.rollout-row").count() == 1
        await page.evaluate("window.sameDocument = true")
        later = CraftedResult(
            instance_id="ray-1", outcome=Outcome.SOLVED, reward=1.0, timings={"agent": 2.0}
        )
        lost = (("a" * 56, "node a died: ActorDiedError"),)
        await asyncio.to_thread(
            write_run, out, {"ray-1": on_node(later, "b" * 56, "10.0.0.2", lost)}, None
        )
        await page.locator("tr.rollout-row[data-outcome=solved]").wait_for()
        assert await page.locator("tr.rollout-row").count() == 2
        assert await page.evaluate("window.sameDocument === true")  # no reload
        assert await page.text_content(".outcome[data-outcome=solved] .count") == "1"
        row = page.locator("tr.rollout-row[data-outcome=solved]")
        assert (
            await row.locator("td.node").text_content()
            == "10.0.0.2 (bbbbbbbbbbbb) · rescheduled ×1"
        )
        nodes = await page.locator("#nodes tr.node-row").all_text_contents()
        assert len(nodes) == 2 and "1 rollouts rescheduled" in await page.text_content("#nodes")
        await screenshot(page, "view-live-run")
        await page.select_option("#filter-node", "b" * 56)
        assert await page.locator("tr.rollout-row").count() == 1
        await goto_hash(page, "#/rollout/" + quote("ray-1#0", safe=""))
        where = await page.text_content("#node")
        assert "10.0.0.2" in where and "b" * 56 in where
        assert "lost on node aaaaaaaaaaaa: node a died: ActorDiedError" in where
        assert page.errors == []


async def test_two_runs_side_by_side(browser, tmp_path, crafted_source, qwen_tokenizer_dir):
    """`agentrl view RUN_A RUN_B`: the first page puts the two runs' outcome counts,
    pass@k per task, and reward and token histograms next to each other; run A's
    rollouts are one link away."""
    other = tmp_path / "b"
    results = {
        SESSION_TASK: CraftedResult(instance_id=SESSION_TASK, outcome=Outcome.UNSOLVED, reward=0.0),
        "extra-1": CraftedResult(instance_id="extra-1", outcome=Outcome.SOLVED, reward=1.0),
    }
    await asyncio.to_thread(write_run, other, results, str(qwen_tokenizer_dir))
    async with viewer(crafted_source, RunSource.open(other)) as server:
        page = await open_page(browser, server.url)
        assert await page.locator("h1.page-compare").count() == 1
        solved = await page.locator(
            "tr.compare-outcome[data-outcome=solved] td"
        ).all_text_contents()
        assert solved[1:] == ["1", "1"]
        infra = await page.locator(
            "tr.compare-outcome[data-outcome=infra_error] td"
        ).all_text_contents()
        assert infra[1:] == ["1", "0"]
        task = await page.locator(
            f"tr.compare-task[data-task='{SESSION_TASK}'] td"
        ).all_text_contents()
        assert task == [SESSION_TASK, "1", "1", "1.000", "1.000", "1", "0", "0.000", "0.000"]
        extra = await page.locator("tr.compare-task[data-task='extra-1'] td").all_text_contents()
        assert extra[1] == "unknown" and extra[5:7] == ["1", "1"]
        assert await page.locator("#compare-rewards .compare-run").count() == 2
        assert await page.locator("#compare-tokens .compare-run").count() == 2
        await screenshot(page, "view-compare")
        await page.click("#to-run")
        await page.wait_for_selector("body[data-ready='#/run']")
        assert await page.locator("tr.rollout-row").count() == 2
        assert page.errors == []

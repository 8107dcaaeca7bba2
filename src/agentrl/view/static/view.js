// agentrl view: the run page and the rollout pages, drawn from inert JSON.
// Every string from the data reaches the page through textContent or a property
// (never innerHTML), so text written by a policy's session stays text.
(function () {
  "use strict";

  const DATA = JSON.parse(document.getElementById("agentrl-data").textContent);
  const SERVER = DATA.mode === "server";
  const COMPARING = SERVER ? DATA.runs > 1 : !!DATA.compare;
  const LH = 18; // px, one token row; .row's height in view.css
  const OVERSCAN = 30; // rows drawn above and below the visible ones
  let RUN = SERVER ? null : DATA;
  let COMPARE = SERVER ? null : DATA.compare || null;
  let live = null; // the event stream of a run in progress (server mode)
  const details = {};
  const filters = { outcome: "", task: "", harness: "", node: "" };
  const app = document.getElementById("app");

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === null || value === undefined) continue;
      if (name === "text") node.textContent = String(value);
      else if (name === "class") node.className = value;
      else if (name === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
      else if (name === "on") for (const [k, v] of Object.entries(value)) node.addEventListener(k, v);
      else node[name] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // The page's content; a missing (null) part is left out, not written as "null".
  function fill(...parts) { app.replaceChildren(...parts.filter((p) => p !== null && p !== undefined && p !== false)); }
  function unknown(text) { return el("span", { class: "unknown", text: text || "unknown" }); }
  function show(value, digits) {
    if (value === null || value === undefined) return unknown();
    if (typeof value === "number") return digits === undefined ? String(value) : value.toFixed(digits);
    return String(value);
  }
  function td(value, digits, cls) {
    const num = typeof value === "number";
    return el("td", { class: cls || (num ? "num" : "") }, show(value, digits));
  }
  function rolloutHref(key) { return "#/rollout/" + encodeURIComponent(key); }
  function rolloutLink(key) { return el("a", { href: rolloutHref(key), class: "rollout-link", text: key }); }
  function badge(outcome) { return el("span", { class: "badge o-" + String(outcome || "unknown").replace(/[^a-z_]/g, ""), text: outcome || "unknown" }); }
  function table(head, rows, cls) {
    return el("table", { class: cls || "" },
      el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows));
  }

  async function fetchJSON(url) {
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) throw new Error(url + ": HTTP " + response.status);
    return response.json();
  }
  async function getRun() { if (!RUN) { RUN = await fetchJSON("api/run"); follow(); } return RUN; }
  async function getCompare(fresh) { if (SERVER && (fresh || !COMPARE)) COMPARE = await fetchJSON("api/compare"); return COMPARE; }

  // -- a run in progress: new rollouts arrive as Server-Sent Events ---------
  function follow() {
    if (!SERVER || live || !window.EventSource) return;
    live = new EventSource("api/events?since=" + RUN.rollouts.length + "&generation=" + RUN.generation);
    live.addEventListener("rollouts", (e) => {
      const update = JSON.parse(e.data);
      RUN.rollouts = update.reset ? update.rollouts : RUN.rollouts.slice(0, update.start).concat(update.rollouts);
      RUN.generation = update.generation;
      RUN.overview = update.overview;
      document.body.dataset.liveCount = String(RUN.rollouts.length);
      const page = currentPage();
      if (page === "run") redrawRun();
      else if (page === "compare") getCompare(true).then(() => { if (currentPage() === "compare") redrawKeepingScroll(drawCompare); });
    });
  }
  function currentPage() {
    const hash = location.hash || "#/";
    if (hash.startsWith("#/rollout/")) return "rollout";
    if (hash === "#/run" || !COMPARING) return "run";
    return "compare";
  }
  function redrawKeepingScroll(draw) { const y = window.scrollY; draw(); window.scrollTo(0, y); }
  function redrawRun() { redrawKeepingScroll(() => drawRun(RUN)); }
  async function getRollout(key) {
    if (!SERVER) return (RUN.details || {})[key] || null;
    if (!(key in details)) {
      try { details[key] = await fetchJSON("api/rollout?key=" + encodeURIComponent(key)); }
      catch (e) { details[key] = null; }
    }
    return details[key];
  }

  // -- the run page ---------------------------------------------------------
  function outcomeBoxes(run) {
    const boxes = Object.entries(run.overview.outcomes).map(([outcome, count]) =>
      el("div", { class: "outcome", data: { outcome }, on: { click: () => { filters.outcome = filters.outcome === outcome ? "" : outcome; route(); } } },
        el("span", { class: "count", text: count }), badge(outcome)));
    return el("section", { id: "outcomes" }, el("h2", { text: "Outcomes" }), el("div", { class: "outcomes" }, ...boxes));
  }

  const PLURALS = { outcome: "outcomes", task: "tasks", harness: "harnesses", node: "nodes" };
  function select(name, values, label) {
    const node = el("select", { id: "filter-" + name, on: { change: (e) => { filters[name] = e.target.value; drawRolloutRows(); } } },
      el("option", { value: "", text: "all " + PLURALS[name] }), ...values.map((v) => el("option", { value: v, text: label ? label(v) : v })));
    node.value = filters[name];
    return el("label", {}, name + " ", node);
  }

  function matches(row) {
    return (!filters.outcome || row.outcome === filters.outcome) &&
      (!filters.task || row.instance_id === filters.task) &&
      (!filters.harness || row.harness === filters.harness) &&
      (!filters.node || row.node_id === filters.node);
  }

  function drawRolloutRows() {
    const body = document.getElementById("rollout-rows");
    if (!body) return;
    const rows = RUN.rollouts.filter(matches);
    body.replaceChildren(...rows.map((r) => el("tr", { class: "rollout-row", data: { outcome: r.outcome || "" } },
      el("td", {}, rolloutLink(r.key)), td(r.instance_id), td(r.harness), el("td", {}, badge(r.outcome)),
      td(r.reward, 2), td(r.turns), td(r.sampled_tokens), td(r.tokens_per_second, 1),
      td((r.timings || {}).agent, 1), td((r.timings || {}).total, 1),
      ...(hasNodes(RUN) ? [el("td", { class: "node" }, nodeText(r))] : []), td(r.error || ""))));
    document.getElementById("rollout-count").textContent = rows.length + " of " + RUN.rollouts.length;
  }

  function rolloutsSection(run) {
    const tasks = [...new Set(run.rollouts.map((r) => r.instance_id).filter(Boolean))].sort();
    const outcomes = Object.keys(run.overview.outcomes);
    const nodes = hasNodes(run);
    const head = ["rollout", "task", "harness", "outcome", "reward", "turns", "tokens", "tok/s", "agent s", "total s", ...(nodes ? ["node"] : []), "error"];
    return el("section", { id: "rollouts" }, el("h2", { text: "Rollouts" }),
      el("div", { class: "filters" }, select("outcome", outcomes), select("task", tasks), select("harness", run.overview.harnesses),
        nodes ? select("node", run.overview.nodes.map((n) => n.node_id), (id) => { const n = run.overview.nodes.find((x) => x.node_id === id); return (n.node_ip || "?") + " (" + shortNode(id) + ")"; }) : null,
        el("span", { id: "rollout-count", class: "muted" })),
      el("table", {}, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
        el("tbody", { id: "rollout-rows" })));
  }

  function hasNodes(run) { return !!(run.overview.nodes && run.overview.nodes.length); }
  function shortNode(id) { return id ? String(id).slice(0, 12) : "unknown"; }
  function nodeText(r) {
    if (!r.node_id && !(r.rescheduled || []).length) return "";
    const where = r.node_id ? (r.node_ip || "?") + " (" + shortNode(r.node_id) + ")" : "unknown";
    const lost = (r.rescheduled || []).length;
    return where + (lost ? " · rescheduled ×" + lost : "");
  }
  function rescheduledList(r) {
    return (r.rescheduled || []).map((lost) => el("li", { class: "rescheduled" }, "lost on node " + shortNode(lost.node_id) + ": ", lost.error || unknown("no error recorded")));
  }

  function nodesSection(run) {
    if (!hasNodes(run)) return null;
    const rows = run.overview.nodes.map((n) => el("tr", { class: "node-row", data: { node: n.node_id } }, td(n.node_ip), td(shortNode(n.node_id)), td(n.rollouts), td(n.solved), td(n.failed), td(n.lost)));
    return el("section", { id: "nodes" }, el("h2", { text: "Ray nodes" }),
      el("p", { class: "muted", text: run.overview.rescheduled + " rollouts rescheduled after a node was lost" }),
      table(["node ip", "node id", "rollouts", "solved", "failed", "dispatches lost"], rows));
  }

  function tasksSection(run) {
    const rows = run.overview.tasks.map((t) => el("tr", { class: "task-row" }, td(t.instance_id), td(t.rollouts), td(t.graded), td(t.solved),
      td(t["pass@1"], 3), td(t["pass@k"], 3, "num pass-k"), td(t.k)));
    return el("section", { id: "tasks" }, el("h2", { text: "pass@k per task (k = samples per task)" }),
      table(["task", "rollouts", "graded", "solved", "pass@1", "pass@k", "k"], rows));
  }

  function histogram(hist, what, digits) {
    const most = Math.max(1, ...hist.bins.map((b) => b.count));
    const bars = hist.bins.map((b) => { const bar = el("div", { class: "bar", title: b.low.toFixed(3) + "–" + b.high.toFixed(3) + ": " + b.count }, el("span", { text: b.count })); bar.style.height = Math.round(80 * b.count / most) + "px"; return bar; });
    const labels = hist.bins.map((b) => el("span", { text: b.low.toFixed(digits) }));
    return el("div", { class: "histogram" }, el("p", { class: "muted" }, hist.count + " " + what + ", mean ", show(hist.mean, digits + 1)),
      el("div", { class: "bars" }, ...bars), el("div", { class: "bar-labels" }, ...labels));
  }

  function rewardsSection(run) {
    return el("section", { id: "rewards" }, el("h2", { text: "Reward distribution (graded samples)" }), histogram(run.overview.rewards, "rewards", 2));
  }

  function phasesSection(run) {
    const phases = run.overview.phases;
    const most = Math.max(1e-9, ...phases.filter((p) => p.phase !== "total").map((p) => p.max));
    const rows = phases.map((p) => { const bar = el("span", { class: "hbar" }); bar.style.width = Math.round(160 * Math.min(1, p.median / most)) + "px";
      return el("tr", { class: "phase-row", data: { phase: p.phase } }, td(p.phase), td(p.count), td(p.min, 2), td(p.median, 2), td(p.p90, 2), td(p.max, 2), td(p.mean, 2), el("td", {}, bar)); });
    return el("section", { id: "phases" }, el("h2", { text: "Seconds per phase" }),
      el("p", { class: "muted" }, "tokens/s (sampled tokens / agent seconds): ", show(run.overview.tokens_per_second, 1),
        " · median per rollout: ", show(run.overview.tokens_per_second_median, 1), " · sampled tokens: ", show(run.overview.sampled_tokens)),
      table(["phase", "n", "min", "median", "p90", "max", "mean", "median"], rows));
  }

  function failuresSection(run) {
    const groups = run.overview.failures;
    if (!groups.length) return el("section", { id: "failures" }, el("h2", { text: "Failures" }), el("p", { class: "muted", text: "none" }));
    const rows = groups.map((g) => el("tr", { class: "failure-row" }, el("td", {}, badge(g.outcome)), td(g.count), td(g.earlier), td(g.reason),
      el("td", {}, ...g.keys.flatMap((k, i) => [i ? " " : "", rolloutLink(k)]))));
    return el("section", { id: "failures" }, el("h2", { text: "Failures by reason" }),
      table(["outcome", "count", "earlier attempts", "reason", "rollouts"], rows));
  }

  function drawRun(run) {
    document.getElementById("run-title").textContent = run.title || "";
    document.getElementById("run-meta").textContent = (run.kind === "serve" ? "serve samples" : "rollout run") + " · " + run.rollouts.length + " rollouts · tokenizer: " + (run.tokenizer || "none (ids shown)") + (live ? " · following the run" : "");
    const nav = COMPARING ? el("p", {}, el("a", { href: "#/", id: "to-compare", text: "← the two runs compared" })) : null;
    fill(el("h1", { text: "Run", class: "page-run" }), nav, outcomeBoxes(run), rolloutsSection(run), tasksSection(run), rewardsSection(run), nodesSection(run), phasesSection(run), failuresSection(run));
    drawRolloutRows();
  }

  async function showRun() {
    drawRun(await getRun());
    window.scrollTo(0, 0);
  }

  // -- two runs side by side ----------------------------------------------------
  function drawCompare() {
    const cmp = COMPARE;
    const [a, b] = cmp.runs;
    const cols = (f, digits) => cmp.runs.map((r) => td(f(r), digits));
    const summary = [
      ["rollouts", (r) => r.rollouts], ["pass@1 (mean over tasks)", (r) => r["pass@1"], 3], ["pass@k (mean over tasks)", (r) => r["pass@k"], 3],
      ["sampled tokens", (r) => r.sampled_tokens], ["tokens/s", (r) => r.tokens_per_second, 1],
    ].map(([name, f, digits]) => el("tr", { class: "compare-summary" }, td(name), ...cols(f, digits)));
    const outcomes = cmp.outcomes.map((o) => el("tr", { class: "compare-outcome", data: { outcome: o } }, el("td", {}, badge(o)), ...cmp.runs.map((r) => td(r.outcomes[o] || 0))));
    const cell = (t, name, digits) => td(t ? t[name] : null, digits);
    const tasks = cmp.tasks.map((t) => el("tr", { class: "compare-task", data: { task: t.instance_id } }, td(t.instance_id),
      ...t.runs.flatMap((x) => [cell(x, "graded"), cell(x, "solved"), cell(x, "pass@1", 3), cell(x, "pass@k", 3)])));
    const side = (title, f) => el("div", { class: "compare-grid" }, ...cmp.runs.map((r, i) => el("div", { class: "compare-run", data: { run: i } }, el("h3", { text: (i ? "B: " : "A: ") + r.title }), f(r))));
    const names = ["", "A: " + a.title, "B: " + b.title];
    app.replaceChildren(el("h1", { text: "Two runs compared", class: "page-compare" }),
      el("p", {}, el("a", { href: "#/run", id: "to-run", text: "run A's rollouts →" })),
      el("section", { id: "compare-summary" }, el("h2", { text: "Outcomes" }), table(names, [...outcomes, ...summary])),
      el("section", { id: "compare-tasks" }, el("h2", { text: "pass@k per task" }),
        table(["task", ...["A", "B"].flatMap((x) => [x + " graded", x + " solved", x + " pass@1", x + " pass@k"])], tasks)),
      el("section", { id: "compare-rewards" }, el("h2", { text: "Reward distribution (graded samples)" }), side("rewards", (r) => histogram(r.rewards, "rewards", 2))),
      el("section", { id: "compare-tokens" }, el("h2", { text: "Sampled tokens per rollout" }), side("tokens", (r) => histogram(r.tokens, "rollouts", 0))));
  }

  async function showCompare() {
    await getRun();
    await getCompare(false);
    document.getElementById("run-title").textContent = COMPARE.runs.map((r) => r.title).join(" vs ");
    document.getElementById("run-meta").textContent = "two runs";
    drawCompare();
    window.scrollTo(0, 0);
  }

  // -- the rollout page -----------------------------------------------------
  function preBlock(id, capped, what) {
    if (!capped) return el("section", { id }, el("h3", { text: what }), unknown("no file"));
    const note = capped.truncated ? el("p", { class: "muted", text: "showing " + capped.text.length + " characters of a " + capped.size + "-byte file" }) : null;
    return el("section", { id }, el("h3", { text: what }), note, el("pre", { text: capped.text }));
  }

  function diffBlock(capped) {
    if (!capped) return preBlock("diff", null, "Diff");
    const lines = capped.text.split("\n");
    const pre = el("pre", { class: "diff" });
    if (lines.length > 20000) pre.textContent = capped.text;
    else for (const line of lines) {
      const cls = line.startsWith("+") && !line.startsWith("+++") ? "diff-add" : line.startsWith("-") && !line.startsWith("---") ? "diff-del" : line.startsWith("@@") ? "diff-hunk" : "";
      pre.append(el("span", { class: cls, text: line + "\n" }));
    }
    const note = capped.truncated ? el("p", { class: "muted", text: "first " + capped.text.length + " characters of " + capped.size + " bytes" }) : null;
    return el("section", { id: "diff" }, el("h3", { text: "Diff" }), note, capped.text ? pre : el("p", { class: "muted", text: "empty diff" }));
  }

  function gradeBlock(row) {
    const g = row.grade;
    if (!g) return el("section", { id: "grade" }, el("h3", { text: "Grade" }), unknown("not graded"));
    return el("section", { id: "grade" }, el("h3", { text: "Grade" }),
      el("p", {}, "reward ", show(g.reward, 3), " · applied cleanly: ", show(g.applied_cleanly), g.error ? " · error: " : "", g.error || ""),
      el("pre", { text: JSON.stringify(g.details, null, 2) }));
  }

  function parseStatus(turn) {
    if (turn.ill_formed === true) return "ill-formed";
    if (turn.ill_formed === false) return "parsed";
    return null;
  }

  function turnRow(turn) {
    const mode = turn.prompt_mode ? turn.prompt_mode + (turn.splice_fallback ? " (fallback: " + turn.splice_fallback + ")" : "") : null;
    return el("tr", { class: "turn-row", data: { turn: turn.id } }, td(turn.id), td(turn.offset_seconds, 2), td(turn.engine_seconds, 3),
      td(turn.prompt_tokens), td(turn.output_tokens), td(turn.finish_reason), td(turn.tool_calls ? (turn.tool_calls.join(", ") || "none") : null),
      td(parseStatus(turn)), td(mode), td(turn.trained_in_sample === undefined ? null : turn.trained_in_sample === null ? "no" : "sample " + turn.trained_in_sample),
      td(turn.realigned ? "REALIGN" : ""));
  }
  const TURN_HEAD = ["turn", "start s", "engine s", "prompt tok", "output tok", "finish", "tool calls", "parse", "prompt mode", "trained", "drift"];

  function treeBlock(session) {
    const chains = session.chains;
    const byParent = {};
    for (const c of chains) (byParent[c.parent === null ? "root" : c.parent] ||= []).push(c);
    function branch(parent, root) {
      const list = el("ul", { class: root ? "tree root" : "tree" });
      for (const c of byParent[parent] || []) {
        const kind = c.kind || "chain";
        const head = el("div", { class: "chain-head" }, el("span", { class: "kind kind-" + kind.replace(/ /g, "-"), text: kind }),
          " chain of leaf " + c.leaf + " · " + c.turns.length + " turns",
          c.after !== null && c.after !== undefined ? " · after turn " + c.after : "", c.spawned_by ? " · spawned by " + c.spawned_by : "");
        const rows = c.turns.map((id) => session.turns[String(id)]).filter(Boolean).map(turnRow);
        list.append(el("li", { class: "chain chain-" + kind.replace(/ /g, "-"), data: { kind, leaf: c.leaf } }, head, table(TURN_HEAD, rows, "turns"), branch(c.leaf, false)));
      }
      return list;
    }
    const extra = session.unsampled.length ? el("div", {}, el("h3", { text: "Turns in no sample" }), table(TURN_HEAD, session.unsampled.map(turnRow), "turns unsampled")) : null;
    const note = session.facts_known ? null : el("p", { class: "muted", text: "this directory has no session file: timing, tool calls and parse status are unknown" });
    return el("section", { id: "session" }, el("h2", { text: "Session" }), note, branch("root", true), extra);
  }

  function legend(sample, classes) {
    const counts = {};
    for (const c of sample.classes) counts[c] = (counts[c] || 0) + 1;
    const names = { p: "prompt", c: "context (not sampled here)", t: "trained", d: "masked after drift (REALIGN)", o: "sampled, trained in another sample" };
    return el("div", { class: "legend" }, ...Object.keys(names).map((code) => el("span", {}, el("span", { class: "tok " + classes[code], text: names[code] }), " " + (counts[code] || 0))),
      el("span", { class: "muted", text: "red underline: low log-prob (darker = less likely); hover a token for its id and log-prob" }));
  }

  function tokenView(sample, vocab, classes) {
    const n = sample.tokens.length;
    const texts = new Array(n);
    for (let i = 0; i < n; i++) { const id = sample.tokens[i]; const t = vocab[id]; texts[i] = t === undefined ? "⟨" + id + "⟩" : t; }
    // Rows: a token range [start, end) or a marker (start = -1 - marker index), laid out
    // once the box is on the page (its width says where rows wrap).
    const starts = [], ends = [];
    const markers = sample.markers;
    let count = 0;
    const box = el("div", { class: "tokens", tabIndex: 0 });
    const spacer = el("div", { class: "spacer" });
    const rows = el("div", { class: "rows" });
    box.append(spacer, rows);
    function layout() {
      const probe = el("span", { class: "tok", text: "0123456789" });
      rows.append(probe);
      const charWidth = probe.getBoundingClientRect().width / 10 || 7.2;
      probe.remove();
      const wrap = Math.max(20, Math.floor((box.clientWidth - 8.5 * charWidth - 16) / charWidth));
      let mi = 0, start = 0, chars = 0;
      for (let i = 0; i < n; i++) {
        while (mi < markers.length && markers[mi].at <= i) {
          if (i > start) { starts.push(start); ends.push(i); start = i; chars = 0; }
          starts.push(-1 - mi); ends.push(0); mi++;
        }
        const t = texts[i];
        if (chars && chars + t.length > wrap) { starts.push(start); ends.push(i); start = i; chars = 0; }
        chars += t.length;
        if (t.indexOf("\n") >= 0) { starts.push(start); ends.push(i + 1); start = i + 1; chars = 0; }
      }
      if (start < n) { starts.push(start); ends.push(n); }
      for (; mi < markers.length; mi++) { starts.push(-1 - mi); ends.push(0); }
      count = starts.length;
      box.style.height = Math.min(count * LH + 4, Math.max(240, 0.6 * window.innerHeight)) + "px";
      const firstT = sample.classes.indexOf("t");
      spacer.style.height = count * LH + "px";
      for (let r = 0; r < count; r++) {
        if (starts[r] < 0) {
          const m = markers[-1 - starts[r]];
          jump.append(el("option", { value: r, text: m.label + " @" + m.at }));
          if (m.kind === "turn" && !(String(m.turn) in turnRows)) turnRows[String(m.turn)] = r;
        }
        else if (firstTrained < 0 && firstT >= starts[r] && firstT < ends[r]) firstTrained = r;
      }
      if (firstTrained >= 0) jump.insertBefore(el("option", { value: firstTrained, text: "first trained token" }), jump.children[1] || null);
      // Open where training starts, not on the system prompt: the first trained token's
      // row near the top (the marker rows before it in view).
      if (firstTrained >= 0) box.scrollTop = Math.max(0, (firstTrained - 3) * LH);
    }
    let firstTrained = -1;
    const turnRows = {};
    const pl = sample.prompt_length;
    function heat(i) {
      if (sample.classes[i] !== "t") return "";
      const lp = sample.logprobs[i - pl];
      if (lp === null || lp === undefined) return "";
      const p = Math.exp(lp);
      return p > 0.9 ? "" : p > 0.5 ? " h1" : p > 0.2 ? " h2" : p > 0.05 ? " h3" : " h4";
    }
    function markerRow(m) {
      const parts = [m.label];
      if (m.kind === "turn") {
        parts.push(m.prompt_mode || "mode unknown", "finish " + (m.finish_reason || "unknown"),
          m.tool_calls ? "tools: " + (m.tool_calls.join(", ") || "none") : "tools unknown",
          m.ill_formed === true ? "ill-formed" : m.ill_formed === false ? "parsed" : "parse unknown");
        if (!m.placed) parts.push("position unknown");
      } else if (m.reason) parts.push(m.reason);
      return el("div", { class: "row marker marker-" + m.kind, data: { kind: m.kind }, text: parts.join(" · ") });
    }
    let drawn = [-1, -1];
    let laidOut = false;
    function draw() {
      if (!laidOut) { laidOut = true; layout(); }
      const first = Math.max(0, Math.floor(box.scrollTop / LH) - OVERSCAN);
      const last = Math.min(count, Math.ceil((box.scrollTop + box.clientHeight) / LH) + OVERSCAN);
      if (first === drawn[0] && last === drawn[1]) return;
      drawn = [first, last];
      const frag = document.createDocumentFragment();
      for (let r = first; r < last; r++) {
        let row;
        if (starts[r] < 0) row = markerRow(markers[-1 - starts[r]]);
        else {
          row = el("div", { class: "row" }, el("span", { class: "ln", text: starts[r] }));
          for (let i = starts[r]; i < ends[r]; i++) {
            const t = texts[i];
            const span = document.createElement("span");
            span.className = "tok " + classes[sample.classes[i]] + heat(i);
            span.dataset.i = i;
            span.textContent = t.indexOf("\n") >= 0 ? t.replace(/\n/g, "↵") : t;
            row.append(span);
          }
        }
        row.style.top = r * LH + "px";
        frag.append(row);
      }
      rows.replaceChildren(frag);
    }
    let pending = false;
    box.addEventListener("scroll", () => { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); } });
    const tip = document.getElementById("tip");
    box.addEventListener("mouseover", (e) => {
      const i = e.target.dataset ? e.target.dataset.i : undefined;
      if (i === undefined) { tip.hidden = true; return; }
      const k = Number(i);
      const lp = k >= pl ? sample.logprobs[k - pl] : null;
      const names = { p: "prompt", c: "context", t: "trained", d: "masked after drift", o: "trained in another sample" };
      tip.textContent = "#" + k + "  id " + sample.tokens[k] + "  " + names[sample.classes[k]] +
        (lp !== null && lp !== undefined && sample.classes[k] === "t" ? "\nlog-prob " + lp.toFixed(4) + "  p " + Math.exp(lp).toFixed(4) : "") +
        "\n" + JSON.stringify(texts[k]);
      tip.hidden = false;
      tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 320) + "px";
      tip.style.top = (e.clientY + 90 > window.innerHeight ? e.clientY - 70 : e.clientY + 16) + "px";
    });
    box.addEventListener("mouseleave", () => { tip.hidden = true; });
    const jump = el("select", { class: "jump", on: { change: (e) => { if (e.target.value !== "") box.scrollTop = Number(e.target.value) * LH; } } },
      el("option", { value: "", text: "jump to…" }));
    function hasTurn(id) { return sample.turns.some((t) => String(t) === String(id)); }
    function trainsTurn(id) {
      const m = markers.find((x) => x.kind === "turn" && String(x.turn) === String(id));
      return !!m && sample.classes[m.at] === "t";
    }
    function showTurn(id) {
      if (!laidOut) draw();
      const r = turnRows[String(id)];
      if (r === undefined) return false;
      box.scrollIntoView({ block: "center" });
      box.scrollTop = Math.max(0, (r - 2) * LH);
      draw();
      return true;
    }
    return { box, jump, draw, hasTurn, trainsTurn, showTurn };
  }

  function samplesBlock(detail, classes) {
    const section = el("section", { id: "samples" }, el("h2", { text: "Samples (tokens)" }));
    if (!detail.decoded) section.append(el("p", { class: "muted", text: "no tokenizer: ids shown (pass --tokenizer)" }));
    const views = [];
    detail.session.samples.forEach((s, k) => {
      const view = tokenView(s, detail.vocab, classes);
      views.push(view);
      const modes = [...new Set(s.markers.filter((m) => m.kind === "turn").map((m) => m.prompt_mode || "unknown"))].join(", ");
      section.append(el("div", { class: "sample", data: { sample: k } },
        el("div", { class: "sample-head" }, el("b", { text: "sample " + k }), " · leaf " + show(s.leaf) + " segment " + s.segment + " · " + s.tokens.length + " tokens (prompt " + s.prompt_length + ", trained " + s.trained_tokens + ") · prompt mode: " + (modes || "unknown") + (s.truncated ? " · truncated" : ""), view.jump),
        legend(s, classes), view.box));
    });
    if (!detail.session.samples.length) section.append(el("p", { class: "muted", text: "no samples for this rollout" }));
    return { section, views };
  }

  async function showRollout(key) {
    const run = await getRun();
    const detail = await getRollout(key);
    if (!detail) { app.replaceChildren(el("p", { id: "missing", text: "no rollout " + key })); return; }
    const row = detail.row;
    const task = detail.task || {};
    const timings = Object.entries(row.timings || {}).map(([p, s]) => p + " " + s.toFixed(2) + "s").join(" · ");
    const { section, views } = samplesBlock(detail, run.classes);
    fill(
      el("h1", { class: "page-rollout" }, el("a", { href: "#/", text: "run" }), " / ", el("span", { id: "rollout-key", text: key })),
      el("p", {}, badge(row.outcome), " reward ", show(row.reward, 3), " · harness ", row.harness || unknown(), " · ", show(row.turns), " turns · ", show(row.sampled_tokens), " sampled tokens", row.error ? " · " : "", row.error ? el("span", { class: "error", text: row.error }) : null),
      el("p", { class: "muted", text: timings || "no timings" }),
      row.node_id || (row.rescheduled || []).length ? el("div", { id: "node" }, el("p", {}, "ran on node ", row.node_ip || unknown(), " (", row.node_id || unknown(), ")"),
        (row.rescheduled || []).length ? el("ul", {}, ...rescheduledList(row)) : null) : null,
      el("section", { id: "task" }, el("h3", { text: "Task " + (task.instance_id || "") }), task.problem_statement ? el("pre", { text: task.problem_statement }) : unknown("problem statement not recorded")),
      gradeBlock(row), diffBlock(detail.diff), preBlock("log", detail.log, "Agent log (tail)"),
      treeBlock(detail.session), section);
    window.scrollTo(0, 0);
    for (const v of views) v.draw();
    // A click on a turn's row shows its tokens: in the sample that trains it, else the first holding it.
    document.getElementById("session").addEventListener("click", (e) => {
      const row = e.target.closest("tr.turn-row");
      if (!row) return;
      const id = row.dataset.turn;
      const view = views.find((v) => v.trainsTurn(id)) || views.find((v) => v.hasTurn(id));
      if (view) view.showTurn(id);
    });
  }

  function route() {
    const hash = location.hash;
    let done;
    if (hash.startsWith("#/rollout/")) {
      let key = hash.slice(10);
      try { key = decodeURIComponent(key); } catch (e) { /* a malformed escape: the raw text */ }
      done = showRollout(key);
    } else if (currentPage() === "compare") done = showCompare();
    else done = showRun();
    done.then(() => {
      document.body.dataset.ready = hash || "#/";
      // The next frame is painted with the page drawn (the benchmark reads this time).
      requestAnimationFrame(() => { document.body.dataset.paintedAt = String(performance.now()); });
    }, (e) => { app.replaceChildren(el("p", { class: "error", text: String(e) })); });
  }
  window.addEventListener("hashchange", () => { delete document.body.dataset.ready; route(); });
  route();
})();

// The dashboard: renders the page its shell names (body[data-page]) from the JSON API.
// No framework and no build step. Every value from the API goes into the page as text
// (textContent, never innerHTML). Streams are read with fetch(), not EventSource, so that
// the key can go in an Authorization header; docs/ui.md says how a stream resumes.
"use strict";

(() => {
  const KEY = "orchestratord.key";
  const body = document.body;
  const BASE = body.dataset.base || "";
  const main = document.getElementById("main");
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const POLL_MS = 2000;

  class NeedKey extends Error {}

  // ---- small DOM helpers ----------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = String(value);
      else if (name === "data") Object.assign(node.dataset, value);
      else node.setAttribute(name, String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const link = (href, text, props) => el("a", { href: BASE + href, text, ...props });
  const code = (text) => el("code", { text });
  const badge = (status) => el("span", { class: `badge ${status}`, text: status || "?" });
  const json = (value) => el("pre", { class: "json", text: JSON.stringify(value, null, 2) });

  function section(title, ...children) {
    return el("section", {}, el("h2", { text: title }), ...children);
  }

  // rows: a list of <tr>, or a <tbody> the caller fills later
  function table(headers, rows, props) {
    const tbody = rows instanceof HTMLTableSectionElement ? rows : el("tbody", {}, rows);
    return el("table", props, el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))), tbody);
  }

  function dl(pairs) {
    return el(
      "dl",
      { class: "pairs" },
      pairs.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v ?? "–")]),
    );
  }

  function fmtTime(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
  }

  function fmtMs(ms) {
    if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
    return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
  }

  const fmtUsd = (v) =>
    v === null || v === undefined ? "–" : `$${Number(v).toFixed(6).replace(/\.?0+$/, "")}`;
  const since = (a, b) => (a && b ? Date.parse(b) - Date.parse(a) : null);
  const short = (id) => (id && id.length > 22 ? `${id.slice(0, 18)}…` : id);

  // ---- the key and the API --------------------------------------------------------------

  function authHeaders() {
    const key = sessionStorage.getItem(KEY);
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  function askForKey(message) {
    const form = document.getElementById("key-form");
    form.hidden = false;
    document.getElementById("key-message").textContent = message;
    main.replaceChildren();
    document.getElementById("key-input").focus();
  }

  function setUpKeyForm() {
    const form = document.getElementById("key-form");
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const key = document.getElementById("key-input").value.trim();
      if (key) sessionStorage.setItem(KEY, key);
      location.reload();
    });
    const forget = document.getElementById("forget-key");
    forget.hidden = !sessionStorage.getItem(KEY);
    forget.addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      location.reload();
    });
  }

  async function api(path, { allow } = {}) {
    const res = await fetch(BASE + path, { headers: authHeaders(), cache: "no-store" });
    if (res.status === 401) {
      const had = sessionStorage.getItem(KEY);
      askForKey(had ? "That key was refused (unknown, revoked or mistyped)." : "");
      throw new NeedKey();
    }
    const data = await res.json().catch(() => null);
    if (!res.ok && !(allow && allow.includes(res.status))) {
      const why = data && data.message ? `${data.code}: ${data.message}` : `HTTP ${res.status}`;
      throw new Error(why);
    }
    return { status: res.status, data, headers: res.headers };
  }

  // One message at the top of the page: the latest error, until a read succeeds.
  function showError(err) {
    if (err instanceof NeedKey) return;
    let box = document.getElementById("page-error");
    if (!box) {
      box = el("p", { id: "page-error", class: "error", role: "alert" });
      main.prepend(box);
    }
    box.textContent = String(err.message || err);
  }

  function clearError() {
    const box = document.getElementById("page-error");
    if (box) box.remove();
  }

  // ---- live streams ---------------------------------------------------------------------

  const live = document.getElementById("live");
  let reconnects = 0;

  function setLive(state) {
    live.hidden = false;
    live.dataset.state = state;
    live.dataset.reconnects = String(reconnects);
    const words = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…" };
    live.textContent = words[state] || state;
  }

  // One SSE block's fields, as the spec reads them: "field: value" lines, ":" comments.
  function parseBlock(lines) {
    const ev = { id: null, event: "message", data: [] };
    for (const line of lines) {
      if (line === "" || line.startsWith(":")) continue;
      const at = line.indexOf(":");
      const field = at < 0 ? line : line.slice(0, at);
      let value = at < 0 ? "" : line.slice(at + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") ev.id = value;
      else if (field === "event") ev.event = value;
      else if (field === "data") ev.data.push(value);
    }
    return ev;
  }

  // Follows an SSE stream until onEvent returns true (its last event). A
  // dropped connection is opened again with Last-Event-ID: the id of the last whole event
  // handed on, so the server sends what came after it. Events are handed on only once
  // whole (their blank line read); half an event lost with a connection comes again.
  async function follow(path, onEvent) {
    let last = null;
    let wait = 500;
    for (;;) {
      setLive(last === null && reconnects === 0 ? "connecting" : "reconnecting");
      const headers = { ...authHeaders(), Accept: "text/event-stream" };
      if (last !== null) headers["Last-Event-ID"] = last;
      let ended = false;
      try {
        const res = await fetch(BASE + path, { headers, cache: "no-store" });
        if (res.status === 401) {
          askForKey("");
          return;
        }
        if (res.status >= 400 && res.status < 500 && res.status !== 429) {
          // no retry mends this (a key without read scope, an unknown id)
          const why = await res.json().catch(() => null);
          showError(new Error(why && why.message ? `${why.code}: ${why.message}` : `HTTP ${res.status}`));
          setLive("ended");
          return;
        }
        if (!res.ok) throw new Error(`HTTP ${res.status}`);
        setLive("live");
        wait = 500;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        let lines = [];
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let nl;
          while ((nl = buffer.indexOf("\n")) >= 0) {
            const line = buffer.slice(0, nl).replace(/\r$/, "");
            buffer = buffer.slice(nl + 1);
            if (line !== "") {
              lines.push(line);
              continue;
            }
            const ev = parseBlock(lines);
            lines = [];
            if (ev.data.length === 0) continue;
            if (ev.id !== null) last = ev.id;
            if (onEvent(ev.event, JSON.parse(ev.data.join("\n")))) ended = true;
          }
          if (ended) {
            await reader.cancel();
            break;
          }
        }
      } catch (err) {
        console.warn("stream dropped", path, err);
      }
      if (ended) {
        setLive("ended");
        return;
      }
      reconnects += 1;
      setLive("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(wait * 2, 5000);
    }
  }

  // Repeats fn every POLL_MS (never two at once) while the page is shown.
  async function poll(fn) {
    for (;;) {
      try {
        const more = await fn();
        clearError();
        if (more === false) return;
      } catch (err) {
        if (err instanceof NeedKey) return;
        showError(err);
      }
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  }

  // ---- budgets --------------------------------------------------------------------------

  // A bar of used (and reserved) against a limit; words: what it says beside it.
  function gauge(label, used, reserved, limit, fmt = (v) => String(v ?? 0), words = null) {
    const bar = el("div", { class: "bar" });
    if (limit) {
      const pct = (v) => `${Math.min(100, (100 * (v || 0)) / limit).toFixed(2)}%`;
      const u = el("span", { class: "used" });
      u.style.width = pct(used);
      const r = el("span", { class: "reserved" });
      r.style.width = pct(reserved);
      bar.append(u, r);
    } else {
      bar.classList.add("unlimited");
    }
    const parts = [`${fmt(used)} used`];
    if (reserved !== null) parts.push(`${fmt(reserved)} reserved`);
    parts.push(`${limit ? fmt(limit) : "no"} limit`);
    return el("div", { class: "gauge", data: { budget: label } }, el("span", { class: "label", text: label }), bar, el("span", { class: "figures", text: words || parts.join(" · ") }));
  }

  function budgets(run) {
    const b = run.budgets || {};
    const u = run.usage || {};
    const r = run.reserved || {};
    const wall = since(run.created_at, run.ended_at || new Date().toISOString());
    return el(
      "div",
      { class: "gauges" },
      gauge("tokens in", u.tokens_in, r.tokens_in, b.max_tokens_in),
      gauge("tokens out", u.tokens_out, r.tokens_out, b.max_tokens_out),
      gauge("cost", u.cost_usd, r.cost_usd, b.max_cost_usd, fmtUsd),
      gauge("wall time", wall, null, b.max_wall_ms, fmtMs),
    );
  }

  // ---- pages ----------------------------------------------------------------------------

  async function runsPage() {
    const params = new URLSearchParams(location.search);
    const flow = el("input", { name: "flow_id", value: params.get("flow_id") || "", placeholder: "flow id", size: 40 });
    const status = el(
      "select",
      { name: "status" },
      ["", "running", "succeeded", "failed", "cancelled"].map((s) => el("option", { value: s, text: s || "any status" })),
    );
    status.value = params.get("status") || "";
    const filters = el("form", { class: "filters", method: "get", action: `${BASE}/ui` }, flow, status, el("button", { type: "submit", text: "Filter" }));
    status.addEventListener("change", () => filters.requestSubmit());
    const tbody = el("tbody", { id: "runs" });
    const more = el("p", { class: "muted" });
    main.replaceChildren(el("h1", { text: "Runs" }), filters, el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ["run", "status", "mode", "flow", "steps", "tokens out", "cost", "created"].map((h) => el("th", { text: h })))), tbody), more);
    const query = new URLSearchParams({ limit: "100" });
    for (const name of ["flow_id", "status", "after"]) if (params.get(name)) query.set(name, params.get(name));
    await poll(async () => {
      const { data, headers } = await api(`/v1/runs?${query}`);
      tbody.replaceChildren(
        ...data.map((run) =>
          el(
            "tr",
            { data: { runId: run.run_id, status: run.status } },
            el("td", {}, link(`/ui/runs/${encodeURIComponent(run.run_id)}`, run.run_id)),
            el("td", {}, badge(run.status)),
            el("td", { text: run.mode }),
            el("td", {}, link(`/ui?flow_id=${encodeURIComponent(run.flow_id)}`, short(run.flow_id), { title: run.flow_id })),
            el("td", { class: "num", text: run.step_count }),
            el("td", { class: "num", text: (run.usage || {}).tokens_out }),
            el("td", { class: "num", text: fmtUsd((run.usage || {}).cost_usd) }),
            el("td", { text: fmtTime(run.created_at) }),
          ),
        ),
      );
      if (data.length === 0) tbody.append(el("tr", {}, el("td", { colspan: 8, class: "muted", text: "No runs match." })));
      const next = headers.get("x-next-after");
      more.replaceChildren(next ? link(`/ui?${new URLSearchParams({ ...Object.fromEntries(params), after: next })}`, "Older runs →") : "");
      return !params.get("after"); // a later page stays as it was read
    });
  }

  // One step's row in the run's timeline, and its tokens.
  class StepView {
    constructor(stepId, page) {
      this.id = stepId;
      this.page = page;
      this.record = null;
      this.seen = new Set(); // token indexes shown: a token resent after a resume is dropped
      this.tokens = el("div", { class: "tokens", data: { stepId } });
      this.count = el("span", { class: "num" });
      this.head = el("div", { class: "step-head" });
      this.bar = el("div", { class: "timeline" });
      this.error = el("div", { class: "step-error" });
      this.node = el("li", { class: "step", data: { stepId, status: "queued" } }, this.head, this.bar, this.tokens, this.error);
      this.render();
    }

    token(data) {
      if (this.seen.has(data.i)) {
        this.node.dataset.repeats = String(Number(this.node.dataset.repeats || 0) + 1);
        return;
      }
      this.seen.add(data.i);
      this.tokens.append(el("span", { class: "tok", text: data.t, data: { i: data.i } }));
      this.counted();
    }

    counted() {
      const usage = (this.record && this.record.usage) || {};
      const n = Math.max(usage.tokens_out ?? 0, this.seen.size);
      this.count.textContent = `${n} tokens · ${fmtUsd(usage.cost_usd)}`;
    }

    setStatus(status) {
      this.node.dataset.status = status;
      this.render();
    }

    async refresh() {
      // only the answer to the latest read counts: an earlier one may arrive after it
      const asked = (this.asked = (this.asked || 0) + 1);
      const { data } = await api(`/v1/steps/${encodeURIComponent(this.id)}`);
      if (asked !== this.asked) return;
      this.record = data;
      this.node.dataset.status = data.status;
      this.node.dataset.position = data.position;
      this.render();
      this.page.placeSteps();
    }

    render() {
      const s = this.record || { step_id: this.id };
      const status = this.node.dataset.status;
      this.counted();
      const queued = since(s.created_at, s.started_at);
      const ran = since(s.started_at, s.ended_at);
      this.head.replaceChildren(
        el("span", { class: "pos", text: s.position === undefined ? "#?" : `#${s.position}` }),
        el("span", { class: "type", text: s.type || "step" }),
        badge(status),
        el("span", { class: "where", text: s.pool_id ? `${s.pool_id}/${s.replica_id}` : "" }),
        el("span", { class: "timing", text: `queued ${fmtMs(queued)} · ran ${fmtMs(ran)}` }),
        this.count,
        link(`/ui/steps/${encodeURIComponent(this.id)}`, "provenance", { class: "more" }),
      );
      this.drawBar();
      const err = s.error;
      this.error.replaceChildren(err ? el("p", { class: "error", text: `${err.code}: ${err.message}` }) : "");
    }

    drawBar() {
      const s = this.record;
      const span = this.page.span();
      this.bar.replaceChildren();
      if (!s || !span) return;
      const x = (iso) => (100 * (Date.parse(iso) - span.start)) / span.width;
      const end = s.ended_at || new Date().toISOString();
      const q = el("span", { class: "queued" });
      q.style.left = `${x(s.created_at)}%`;
      q.style.width = `${Math.max(0, x(s.started_at || end) - x(s.created_at))}%`;
      const r = el("span", { class: `ran ${this.node.dataset.status}` });
      if (s.started_at) {
        r.style.left = `${x(s.started_at)}%`;
        r.style.width = `${Math.max(0.5, x(end) - x(s.started_at))}%`;
      }
      this.bar.append(q, r);
    }
  }

  async function runPage() {
    const runId = body.dataset.runId;
    const path = `/v1/runs/${encodeURIComponent(runId)}`;
    const header = el("div", { class: "run-head" });
    const gauges = el("div");
    const cost = el("div");
    const list = el("ol", { class: "steps", id: "steps" });
    const facts = el("tbody", { id: "facts" });
    const checkpoints = el("tbody", { id: "checkpoints" });
    const steps = new Map();
    const factIds = new Set();
    let run = null;

    const page = {
      span() {
        if (!run) return null;
        const start = Date.parse(run.created_at);
        const end = run.ended_at ? Date.parse(run.ended_at) : Date.now();
        return { start, width: Math.max(end - start, 1) };
      },
      placeSteps() {
        const views = [...steps.values()].sort((a, b) => (a.record?.position ?? 1e15) - (b.record?.position ?? 1e15));
        list.append(...views.map((v) => v.node));
      },
    };

    function renderRun() {
      const replay = run.mode !== "record" ? link(`/ui/runs/${encodeURIComponent(runId)}/replay`, "replay report") : null;
      header.replaceChildren(
        el("h1", {}, "Run ", code(run.run_id), " ", badge(run.status)),
        dl([
          ["flow", link(`/ui?flow_id=${encodeURIComponent(run.flow_id)}`, run.flow_id)],
          ["mode", el("span", {}, run.mode, " ", replay)],
          ["source run", run.source_run_id ? link(`/ui/runs/${encodeURIComponent(run.source_run_id)}`, run.source_run_id) : null],
          ["seed", String(run.seed ?? "–")],
          ["created", fmtTime(run.created_at)],
          ["ended", fmtTime(run.ended_at)],
        ]),
      );
      body.dataset.status = run.status;
      gauges.replaceChildren(budgets(run));
      const u = run.usage || {};
      cost.replaceChildren(
        dl([
          ["cost", fmtUsd(u.cost_usd)],
          ["priced cost", fmtUsd(u.priced_cost_usd)],
          ["unpriced steps", String(u.unpriced_steps ?? 0)],
          ["price table", run.price_table || "–"],
        ]),
      );
      for (const view of steps.values()) view.drawBar();
    }

    let reloading = null;
    function reloadRun() {
      // one read of the run at a time; a change meanwhile asks for one more
      if (reloading) return reloading.then(() => reloadRun());
      reloading = api(path)
        .then(({ data }) => {
          run = data;
          renderRun();
        })
        .catch(showError)
        .finally(() => {
          reloading = null;
        });
      return reloading;
    }

    let lastFact = null;
    let readingFacts = null;
    function loadFacts() {
      // new facts only (the list pages by fact id); one read at a time, then one more
      if (readingFacts) return readingFacts.then(() => loadFacts());
      const after = lastFact ? `?after=${encodeURIComponent(lastFact)}` : "";
      readingFacts = api(`${path}/facts${after}`)
        .then(({ data }) => data.forEach(addFact))
        .catch(showError)
        .finally(() => {
          readingFacts = null;
        });
      return readingFacts;
    }

    function addFact(f) {
      lastFact = f.fact_id;
      if (factIds.has(f.fact_id)) return;
      factIds.add(f.fact_id);
      const by = f.emitted_by_step ? link(`/ui/steps/${encodeURIComponent(f.emitted_by_step)}`, short(f.emitted_by_step)) : "–";
      facts.append(el("tr", { data: { factId: f.fact_id } }, el("td", { text: f.fact_type ?? f.type }), el("td", {}, json(f.data)), el("td", {}, by), el("td", { text: fmtTime(f.created_at) })));
    }

    async function loadCheckpoints() {
      const { data } = await api(`${path}/checkpoints`);
      checkpoints.replaceChildren(
        ...data.map((c) =>
          el("tr", {}, el("td", {}, code(c.checkpoint_id)), el("td", {}, c.step_id ? link(`/ui/steps/${encodeURIComponent(c.step_id)}`, short(c.step_id)) : "–"), el("td", {}, code(short(c.state_hash))), el("td", { text: fmtTime(c.created_at) })),
        ),
      );
    }

    function view(stepId) {
      let v = steps.get(stepId);
      if (!v) {
        v = new StepView(stepId, page);
        steps.set(stepId, v);
        list.append(v.node);
        v.refresh().catch(showError);
      }
      return v;
    }

    let ticker = null;
    function onEvent(type, data) {
      if (type === "run_end") {
        reloadRun();
        loadCheckpoints().catch(showError);
        clearInterval(ticker);
        return true;
      }
      if (type === "fact") {
        if (!factIds.has(data.fact_id)) loadFacts();
        return false;
      }
      if (!data.step_id) return false;
      const v = view(data.step_id);
      // the stream starts at the run's beginning: a step read as ended needs no new read
      const settled = v.record && TERMINAL.has(v.record.status);
      if (type === "token") v.token(data);
      else if (settled) return false;
      else if (type === "started") {
        v.setStatus("running");
        v.refresh().catch(showError);
        reloadRun(); // what the step reserved
      } else if (type === "end" || type === "error") {
        v.setStatus(type === "end" ? "succeeded" : "failed");
        v.refresh().catch(showError);
        reloadRun();
      } else if (type === "checkpoint") loadCheckpoints().catch(showError);
      return false;
    }

    try {
      run = (await api(path)).data;
    } catch (err) {
      if (err instanceof NeedKey) return;
      main.replaceChildren(el("h1", { text: "Run" }), el("p", { class: "error", role: "alert", text: err.message }));
      return;
    }
    main.replaceChildren(
      header,
      section("Budgets", gauges),
      section("Cost", cost),
      section("Steps", list),
      section("Facts", table(["type", "data", "step", "created"], facts)),
      section("Checkpoints", table(["checkpoint", "step", "state hash", "created"], checkpoints)),
    );
    renderRun();
    const known = (await api(`${path}/steps`)).data;
    for (const s of known) {
      const v = new StepView(s.step_id, page);
      v.record = s;
      v.node.dataset.status = s.status;
      v.render();
      steps.set(s.step_id, v);
    }
    page.placeSteps();
    await loadFacts();
    await loadCheckpoints();
    // the timeline's bars and the wall-time gauge move while the run goes on
    ticker = setInterval(() => {
      if (!run || run.ended_at) return;
      gauges.replaceChildren(budgets(run));
      for (const view of steps.values()) view.drawBar();
    }, 1000);
    // the run's stream from its start: every step's events and its facts, then run_end
    await follow(`${path}/stream`, onEvent);
  }

  function tokenRow(tokens, cls) {
    return (tokens || []).map((t) => el("span", { class: `tok ${cls}`, text: t }));
  }

  function shown(side) {
    if (!side) return "–";
    if ("t" in side) return JSON.stringify(side.t) + (side.token_id !== undefined && side.token_id !== null ? ` (token ${side.token_id})` : "");
    if ("end" in side) return `end of stream (${side.end})`;
    if ("error" in side) return `error ${JSON.stringify(side.error)}`;
    return JSON.stringify(side);
  }

  function divergenceView(d, first) {
    const ctx = d.context || {};
    const exp = d.expected && "t" in d.expected ? d.expected.t : shown(d.expected);
    const act = d.actual && "t" in d.actual ? d.actual.t : shown(d.actual);
    return el(
      "div",
      { class: `divergence${first ? " first" : ""}`, id: first ? "first-divergence" : null, data: { tokenIndex: d.token_index } },
      el("h3", { text: `${first ? "First divergence" : "Divergence"}: step #${d.position}, token ${d.token_index}` }),
      dl([
        ["token index", String(d.token_index)],
        ["expected", el("span", { class: "expected", text: shown(d.expected) })],
        ["actual", el("span", { class: "actual", text: shown(d.actual) })],
        ["replayed step", link(`/ui/steps/${encodeURIComponent(d.step_id)}`, d.step_id)],
        ["recorded step", d.recorded_step_id ? link(`/ui/steps/${encodeURIComponent(d.recorded_step_id)}`, d.recorded_step_id) : null],
      ]),
      el(
        "p",
        { class: "context tokens" },
        tokenRow(ctx.before, "ctx"),
        el("span", { class: "tok expected", title: "expected", text: exp }),
        el("span", { class: "tok actual", title: "actual", text: act }),
        tokenRow(ctx.expected_after, "ctx after"),
      ),
    );
  }

  async function replayPage() {
    const runId = body.dataset.runId;
    await poll(async () => {
      const { status, data } = await api(`/v1/runs/${encodeURIComponent(runId)}/replay-report`, { allow: [404, 422] });
      if (status !== 200) {
        main.replaceChildren(el("h1", {}, "Replay of ", code(runId)), el("p", { class: "error", role: "alert", text: data.message }));
        return false;
      }
      const c = data.counts;
      let first = true;
      const rows = data.steps.map((s) =>
        el(
          "tr",
          { class: s.outcome, data: { outcome: s.outcome } },
          el("td", { class: "num", text: `#${s.position}` }),
          el("td", {}, s.step_id ? link(`/ui/steps/${encodeURIComponent(s.step_id)}`, short(s.step_id)) : "–"),
          el("td", {}, s.recorded_step_id ? link(`/ui/steps/${encodeURIComponent(s.recorded_step_id)}`, short(s.recorded_step_id)) : "–"),
          el("td", {}, badge(s.status || "pending")),
          el("td", {}, el("span", { class: `outcome ${s.outcome}`, text: s.outcome })),
          el("td", { class: "num", text: s.tokens_out }),
        ),
      );
      const details = data.steps.flatMap((s) => {
        const out = [];
        if (s.divergence) {
          out.push(divergenceView(s.divergence, first));
          first = false;
        }
        if (s.miss) out.push(el("div", { class: "miss" }, el("h3", { text: `Replay miss at step #${s.position}` }), json(s.miss)));
        return out;
      });
      main.replaceChildren(
        el("h1", {}, "Replay report of ", link(`/ui/runs/${encodeURIComponent(runId)}`, runId)),
        dl([
          ["mode", data.mode],
          ["source run", data.source_run_id ? link(`/ui/runs/${encodeURIComponent(data.source_run_id)}`, data.source_run_id) : null],
          ["verdict", el("span", { class: data.diverged ? "outcome diverged" : "outcome identical", text: data.diverged ? "diverged" : "identical so far" })],
          ["complete", data.complete ? "yes" : "no"],
          ["counts", `${c.identical} identical · ${c.diverged} diverged · ${c.missed} missed · ${c.failed} failed · ${c.pending} pending · ${c.not_replayed} not replayed`],
        ]),
        ...details,
        section("Steps", table(["pos", "replayed step", "recorded step", "status", "outcome", "tokens"], rows)),
      );
      return !data.complete;
    });
  }

  async function stepPage() {
    const stepId = body.dataset.stepId;
    const path = `/v1/steps/${encodeURIComponent(stepId)}`;
    const tokens = el("div", { class: "tokens", data: { stepId } });
    const seen = new Set();
    const top = el("div");
    const details = el("div");

    function render(s) {
      const p = s.placement_decision;
      const candidates = p
        ? table(
            ["pool", "replica", "eligible", "free slots", "reason"],
            p.candidates.map((c) => el("tr", {}, el("td", { text: c.pool_id }), el("td", { text: c.replica_id }), el("td", { text: c.eligible ? "yes" : "no" }), el("td", { class: "num", text: c.free_slots }), el("td", { text: c.reason || "" }))),
          )
        : "";
      const prov = s.provenance ? dl(Object.entries(s.provenance).map(([k, v]) => [k, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)])) : el("p", { class: "muted", text: "Provenance comes with the step's end." });
      body.dataset.status = s.status;
      top.replaceChildren(
        el("h1", {}, "Step ", code(s.step_id), " ", badge(s.status)),
        dl([
          ["run", link(`/ui/runs/${encodeURIComponent(s.run_id)}`, s.run_id)],
          ["position", `#${s.position}`],
          ["type", s.type],
          ["pool / replica", s.pool_id ? `${s.pool_id} / ${s.replica_id}` : null],
          ["queued", fmtMs(since(s.created_at, s.started_at))],
          ["ran", fmtMs(since(s.started_at, s.ended_at))],
          ["usage", `${s.usage?.tokens_in ?? 0} in · ${s.usage?.tokens_out ?? 0} out · ${fmtUsd(s.usage?.cost_usd)}`],
          ["replay of", s.replay_of ? link(`/ui/steps/${encodeURIComponent(s.replay_of)}`, s.replay_of) : null],
          ["replay outcome", s.replay_outcome],
        ]),
        s.error ? el("p", { class: "error", text: `${s.error.code}: ${s.error.message}` }) : "",
      );
      details.replaceChildren(
        section("Provenance", prov),
        section("Placement", p ? dl([["rule", p.rule], ["chosen", p.chosen ? `${p.chosen.pool_id} / ${p.chosen.replica_id}` : null], ["tie break", p.tie_break]]) : "", candidates),
        section("Policy", json(s.policy_decision)),
        section("Input", json(s.input)),
        section("Output", json(s.output)),
      );
    }

    let step;
    try {
      step = (await api(path)).data;
    } catch (err) {
      if (err instanceof NeedKey) return;
      main.replaceChildren(el("h1", { text: "Step" }), el("p", { class: "error", role: "alert", text: err.message }));
      return;
    }
    render(step);
    main.replaceChildren(top, section("Tokens", tokens), details);
    await follow(`${path}/stream`, (type, data) => {
      if (type === "token" && !seen.has(data.i)) {
        seen.add(data.i);
        tokens.append(el("span", { class: "tok", text: data.t, data: { i: data.i } }));
      }
      if (type === "end" || type === "error") {
        api(path).then(({ data: s }) => render(s), showError);
        return true;
      }
      return false;
    });
  }

  async function poolsPage() {
    const holder = el("div", { id: "pools" });
    main.replaceChildren(el("h1", { text: "Pools" }), holder);
    await poll(async () => {
      const { data } = await api("/v1/pools");
      holder.replaceChildren(
        ...data.map((p) => {
          const load = p.load || {};
          const slots = (load.slots_busy || 0) + (load.slots_free || 0);
          const replicas = table(
            ["replica", "state", "health", "breaker", "slots busy / free", "model", "detail"],
            p.replicas.map((r) =>
              el(
                "tr",
                { data: { replicaId: r.replica_id, state: r.state } },
                el("td", {}, code(r.replica_id)),
                el("td", {}, badge(r.state)),
                el("td", { text: `${r.health?.live ? "live" : "down"}, ${r.health?.ready ? "ready" : "not ready"}` }),
                el(
                  "td",
                  { class: "breaker", data: { breaker: r.breaker?.state || "closed" } },
                  badge(r.breaker?.state || "closed"),
                  r.breaker?.failures ? el("span", { class: "muted", text: ` ${r.breaker.failures} failures` }) : "",
                ),
                el("td", { class: "num", text: `${r.busy} / ${r.free}` }),
                el("td", { text: r.model || r.capabilities?.model || "" }),
                el("td", { class: "muted", text: r.health?.detail || "" }),
              ),
            ),
          );
          return el(
            "article",
            { class: "pool", data: { poolId: p.pool_id, health: p.health } },
            el("h2", {}, code(p.pool_id), " ", badge(p.health), " ", el("span", { class: "muted", text: `${p.engine} · ${p.capabilities?.model || ""}` })),
            gauge("slots", load.slots_busy, null, slots, undefined, `${load.slots_busy ?? 0} busy · ${load.slots_free ?? 0} free · ${load.queue_depth ?? 0} queued`),
            dl([
              ["tags", Object.entries(p.tags || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "–"],
            ]),
            replicas,
          );
        }),
      );
      if (data.length === 0) holder.append(el("p", { class: "muted", text: "No pools." }));
    });
  }

  const PAGES = { runs: runsPage, run: runPage, replay: replayPage, step: stepPage, pools: poolsPage };

  setUpKeyForm();
  const render = PAGES[body.dataset.page];
  if (render) render().catch(showError);
})();

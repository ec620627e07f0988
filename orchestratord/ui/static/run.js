// /ui/runs/{run_id}: the run, its budgets and cost, each step on a timeline with its
// tokens, its facts and checkpoints; follows the run's stream from its beginning.
"use strict";

(() => {
  const {
    body, main, NeedKey, el, link, code, badge, json, section, table, dl, fmtTime, fmtMs,
    fmtUsd, since, short, api, showError, follow, gauge, start,
  } = window.orchestratord;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

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

  start(runPage);
})();

// /ui/runs/{run_id}/replay: a replay run's report, its first divergence highlighted;
// read again every 2 s until the report is complete.
"use strict";

(() => {
  const {
    body, main, el, link, code, badge, json, section, table, dl, short, api, poll, start,
  } = window.orchestratord;

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

  start(replayPage);
})();

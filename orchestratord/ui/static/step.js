// /ui/steps/{step_id}: one step's provenance, placement, policy, input and output, and
// its tokens; follows the step's stream.
"use strict";

(() => {
  const {
    body, main, NeedKey, el, link, code, badge, json, section, table, dl, fmtMs, fmtUsd, since,
    api, showError, follow, start,
  } = window.orchestratord;

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

  start(stepPage);
})();

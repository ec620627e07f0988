// /ui: runs, newest first, filtered by flow and status; read again every 2 s.
"use strict";

(() => {
  const { BASE, main, el, link, badge, fmtTime, fmtUsd, short, api, poll, start } = window.orchestratord;

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

  start(runsPage);
})();

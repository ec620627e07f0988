// /ui/pools: each pool's health and load and each replica's state, health and breaker;
// read again every 2 s.
"use strict";

(() => {
  const { main, el, code, badge, table, dl, api, poll, gauge, start } = window.orchestratord;

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

  start(poolsPage);
})();

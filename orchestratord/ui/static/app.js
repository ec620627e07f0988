// The dashboard's shared script, loaded first by every page (docs/ui.md): the API read with
// the tab's key and the key form, the stream reader that resumes with Last-Event-ID, the DOM
// helpers and formats. Each page's own script (runs.js, run.js, replay.js, step.js, pools.js)
// is loaded after it, takes what it needs from window.orchestratord, and calls start().
// No framework and no build step. Every value from the API goes into the page as text
// (textContent, never innerHTML). Streams are read with fetch(), not EventSource, so that
// the key can go in an Authorization header; docs/ui.md says how a stream resumes.
"use strict";

(() => {
  const KEY = "orchestratord.key";
  const body = document.body;
  const BASE = body.dataset.base || "";
  const main = document.getElementById("main");
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

  // ---- gauges ---------------------------------------------------------------------------

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

  // The page's script calls this once it is loaded: the key form, then the page itself.
  function start(render) {
    setUpKeyForm();
    render().catch(showError);
  }

  // what the page scripts share; each is loaded after this file (all `defer`, so in order)
  window.orchestratord = Object.freeze({
    body, BASE, main, NeedKey, el, link, code, badge, json, section, table, dl, fmtTime, fmtMs,
    fmtUsd, since, short, api, showError, clearError, follow, poll, gauge, start,
  });
})();

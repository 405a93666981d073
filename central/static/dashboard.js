// edgesched fleet dashboard: vanilla JS, no build step, nothing loaded from elsewhere.
// Live data comes from central's Server-Sent Events stream (/v1/stream); the token is taken
// from the URL fragment (#token=...), kept in sessionStorage for this tab, sent as ?token= to
// the stream (EventSource cannot set headers) and as "Authorization: Bearer" to fetch().
"use strict";

(() => {
  const TOKEN_KEY = "edgesched.dashboard.token";
  const TELEMETRY_POLL_MS = 5000;
  const SERIES_KEEP_S = 600; // sparklines and the event strip show the last 10 minutes
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;
  const STATES = ["connected", "suspect", "partitioned", "dead"];

  const $ = (id) => document.getElementById(id);

  let token = "";
  let source = null;
  let retryTimer = null;
  let backoff = BACKOFF_MIN_MS;
  let authFailed = false;
  let policyBusy = false;
  let lastSnapshot = null;
  const series = new Map(); // node id -> [{at, cpu, mem, power}]
  const telemetryOff = new Map(); // node id -> time (ms) before which we do not poll it
  const cards = new Map(); // node id -> {root, fields...}

  // --- token ---------------------------------------------------------------------------------

  function readToken() {
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    const fromUrl = fragment.get("token");
    if (fromUrl !== null) {
      sessionStorage.setItem(TOKEN_KEY, fromUrl);
      // Keep the token out of the address bar (and out of anything copied from it).
      history.replaceState(null, "", location.pathname + location.search);
      return fromUrl;
    }
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  function showAuth(message) {
    $("auth-message").textContent = message;
    $("auth").hidden = false;
  }

  function hideAuth() {
    $("auth").hidden = true;
  }

  function setLink(state, text) {
    const el = $("link");
    el.dataset.link = state;
    el.textContent = text;
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + token };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    return { status: response.status, ok: response.ok, data };
  }

  function problemText(reply) {
    const d = reply.data;
    if (d && typeof d === "object" && d.detail) {
      return (d.field ? d.field + ": " : "") + d.detail + " (" + reply.status + ")";
    }
    return "HTTP " + reply.status;
  }

  // --- the stream ----------------------------------------------------------------------------

  function connect() {
    clearTimeout(retryTimer);
    retryTimer = null;
    if (source) {
      source.close();
      source = null;
    }
    if (!token) {
      authFailed = true;
      setLink("error", "no token");
      showAuth(
        "No API token. Open the address central printed at start (…/dashboard/#token=…), " +
          "or paste central's token (the api-token file in its state_dir) below.",
      );
      return;
    }
    authFailed = false;
    setLink("connecting", "connecting…");
    const es = new EventSource("/v1/stream?token=" + encodeURIComponent(token));
    source = es;
    es.addEventListener("snapshot", (event) => {
      if (source !== es) return;
      let snap;
      try {
        snap = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      backoff = BACKOFF_MIN_MS;
      hideAuth();
      setLink("live", "live");
      const first = lastSnapshot === null;
      lastSnapshot = snap;
      render(snap);
      if (first) pollTelemetry(); // backfill the sparklines at once
    });
    es.onerror = () => {
      if (source !== es) return;
      es.close();
      source = null;
      diagnose();
    };
  }

  async function diagnose() {
    setLink("error", "disconnected");
    let status = 0;
    try {
      status = (await api("GET", "/v1/status")).status;
    } catch (_) {
      status = 0; // central unreachable
    }
    if (status === 401 || status === 403) {
      authFailed = true;
      setLink("error", "token rejected");
      showAuth(
        "Central rejected this token (HTTP " + status + "). Open the address central printed " +
          "(…/dashboard/#token=…) or paste a valid token below.",
      );
      return;
    }
    const wait = Math.round(backoff * (0.5 + Math.random() * 0.5));
    backoff = Math.min(BACKOFF_MAX_MS, backoff * 2);
    setLink("error", "reconnecting in " + Math.ceil(wait / 1000) + " s");
    retryTimer = setTimeout(connect, wait);
  }

  // --- rendering helpers ---------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) node.append(child);
    return node;
  }

  const dash = "—";

  function fmtTime(unix) {
    if (typeof unix !== "number") return dash;
    return new Date(unix * 1000).toLocaleTimeString([], { hour12: false });
  }

  function fmtAgo(seconds) {
    if (typeof seconds !== "number" || !isFinite(seconds)) return dash;
    if (seconds < 60) return seconds.toFixed(1) + " s ago";
    if (seconds < 3600) return Math.round(seconds / 60) + " min ago";
    return (seconds / 3600).toFixed(1) + " h ago";
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
  }

  // --- header --------------------------------------------------------------------------------

  function ensureOption(select, value) {
    if (value == null) return;
    if (![...select.options].some((o) => o.value === value)) {
      const text = value === "config" ? "from config file" : value;
      select.append(el("option", { value, text, disabled: true }));
    }
  }

  // Input central refused since start (GET /v1/status "refused": channel -> reason -> count):
  // the total on the chip, each non-zero channel and reason in its title.
  function renderRefused(byChannel) {
    const lines = [];
    let total = 0;
    for (const [channel, reasons] of Object.entries(byChannel)) {
      for (const [reason, count] of Object.entries(reasons || {})) {
        if (!count) continue;
        total += count;
        lines.push(channel + " · " + reason + ": " + count);
      }
    }
    const chip = $("refused");
    chip.textContent = "refused " + total;
    chip.dataset.bad = String(total > 0);
    chip.title = "input central refused since start" + (lines.length ? "\n" + lines.join("\n") : "");
  }

  function renderHeader(snap) {
    const status = snap.status || {};
    $("central-id").textContent = status.central || dash;
    const broker = $("broker");
    broker.dataset.ok = String(Boolean(status.broker_connected));
    broker.textContent = status.broker_connected ? "broker connected" : "broker disconnected";
    renderRefused(status.refused || {});
    const counts = { connected: 0, suspect: 0, partitioned: 0, dead: 0 };
    for (const node of snap.nodes || []) {
      if (node.state in counts) counts[node.state] += 1;
    }
    for (const state of STATES) $("count-" + state).textContent = String(counts[state]);
    $("count-total").textContent = String((snap.nodes || []).length);
    const policy = snap.policy || {};
    $("policy-mode").textContent = policy.mode || dash;
    $("policy-tidal").textContent = policy.tidal_profile || dash;
    if (!policyBusy) {
      for (const [id, value] of [
        ["mode-select", policy.mode],
        ["tidal-select", policy.tidal_profile],
      ]) {
        const select = $(id);
        if (document.activeElement === select || value == null) continue;
        ensureOption(select, value);
        select.value = value;
      }
    }
  }

  async function switchPolicy(field, value) {
    const result = $("policy-result");
    policyBusy = true;
    result.dataset.ok = "";
    result.textContent = "switching " + field + " to " + value + "…";
    try {
      const reply = await api("POST", "/v1/policy", { [field]: value });
      if (reply.ok && reply.data) {
        result.dataset.ok = "true";
        result.textContent =
          "central: mode " + reply.data.mode + ", tidal " + reply.data.tidal_profile;
        $("policy-mode").textContent = reply.data.mode;
        $("policy-tidal").textContent = reply.data.tidal_profile;
      } else {
        result.dataset.ok = "false";
        result.textContent = "refused: " + problemText(reply);
      }
    } catch (err) {
      result.dataset.ok = "false";
      result.textContent = "central unreachable: " + err;
    } finally {
      policyBusy = false;
      if (lastSnapshot) renderHeader(lastSnapshot);
    }
  }

  // --- nodes ---------------------------------------------------------------------------------

  function addSample(nodeId, sample) {
    if (!sample || typeof sample.at !== "number") return;
    let points = series.get(nodeId);
    if (!points) {
      points = [];
      series.set(nodeId, points);
    }
    if (points.length && points[points.length - 1].at >= sample.at) {
      if (points.some((p) => p.at === sample.at)) return;
      points.push(sampleOf(sample));
      points.sort((a, b) => a.at - b.at);
    } else {
      points.push(sampleOf(sample));
    }
    const horizon = points[points.length - 1].at - SERIES_KEEP_S;
    while (points.length && points[0].at < horizon) points.shift();
  }

  function sampleOf(s) {
    return {
      at: s.at,
      cpu: typeof s.cpu_util === "number" ? s.cpu_util : null,
      mem: typeof s.mem_util === "number" ? s.mem_util : null,
      power: typeof s.power_w === "number" ? s.power_w : null,
    };
  }

  function makeCard(nodeId) {
    const badge = el("span", { class: "badge state", "data-state": "unknown", text: "unknown" });
    const cpuCanvas = el("canvas", { class: "spark-cpu", width: 200, height: 28 });
    const powerCanvas = el("canvas", { class: "spark-power", width: 200, height: 28 });
    const cpuVal = el("span", { class: "val cpu-val", text: dash });
    const powerVal = el("span", { class: "val power-val", text: dash });
    const hw = el("div", { class: "node-hw", text: dash });
    const sync = el("dd", { class: "sync", text: dash });
    const doc = el("dd", { class: "doc mono", text: dash });
    const since = el("dd", { class: "since", text: dash });
    const tasks = el("dd", { class: "tstates", text: dash });
    const root = el(
      "article",
      { class: "node", "data-node": nodeId, "data-state": "unknown" },
      el("div", { class: "node-head" }, el("span", { class: "node-id", text: nodeId }), badge),
      hw,
      el("div", { class: "spark" }, el("span", { text: "CPU" }), cpuCanvas, cpuVal),
      el("div", { class: "spark" }, el("span", { text: "power" }), powerCanvas, powerVal),
      el(
        "dl",
        { class: "kv" },
        el("dt", { text: "sync" }),
        sync,
        el("dt", { text: "document" }),
        doc,
        el("dt", { text: "status" }),
        since,
        el("dt", { text: "tasks" }),
        tasks,
      ),
    );
    return { root, badge, cpuCanvas, powerCanvas, cpuVal, powerVal, hw, sync, doc, since, tasks };
  }

  function renderNodes(snap) {
    const container = $("nodes");
    const nodes = snap.nodes || [];
    const seen = new Set();
    if (!nodes.length) {
      if (!container.querySelector(".empty")) {
        container.replaceChildren(el("p", { class: "empty", text: "No node has spoken to central yet." }));
      }
      cards.clear();
      return;
    }
    container.querySelector(".empty")?.remove();
    for (const node of nodes) {
      seen.add(node.id);
      let card = cards.get(node.id);
      if (!card) {
        card = makeCard(node.id);
        cards.set(node.id, card);
      }
      container.append(card.root); // keeps the server's order (sorted by id)
      updateCard(card, node, snap);
    }
    for (const [id, card] of cards) {
      if (!seen.has(id)) {
        card.root.remove();
        cards.delete(id);
      }
    }
  }

  function updateCard(card, node, snap) {
    const state = node.state || "unknown";
    card.root.dataset.state = state;
    card.badge.dataset.state = state;
    card.badge.textContent = state;
    const reg = node.registration || {};
    const hw = [
      reg.arch,
      reg.server_class,
      typeof reg.cpu === "number" ? reg.cpu + " CPU" : null,
      typeof reg.mem_gib === "number" ? reg.mem_gib + " GiB" : null,
      reg.accel ? reg.accel + " accel" : null,
      reg.site ? "@" + reg.site : null,
    ].filter((x) => x !== null && x !== undefined && x !== "");
    card.hw.textContent = hw.length ? hw.join(" · ") : dash;
    card.hw.title = reg.cpu_model || "";

    if (node.telemetry && typeof node.telemetry === "object") addSample(node.id, node.telemetry);
    const points = series.get(node.id) || [];
    const latest = node.telemetry || points[points.length - 1] || null;
    const cpu = latest ? (latest.cpu_util ?? latest.cpu) : null;
    const power = latest ? (latest.power_w ?? latest.power) : null;
    card.cpuVal.textContent = typeof cpu === "number" ? Math.round(cpu * 100) + " %" : dash;
    card.powerVal.textContent = typeof power === "number" ? power.toFixed(0) + " W" : dash;
    drawSpark(card.cpuCanvas, points, "cpu", 1, cssVar("--cpu"));
    const maxPower = Math.max(1, ...points.map((p) => p.power || 0)) * 1.15;
    drawSpark(card.powerCanvas, points, "power", maxPower, cssVar("--power"));

    const sync = node.sync;
    if (sync && typeof sync === "object") {
      card.sync.textContent =
        (sync.last_update_s_ago == null ? "no update yet" : fmtAgo(sync.last_update_s_ago)) +
        (sync.fresh ? "" : " · stale");
      card.sync.classList.toggle("stale", !sync.fresh);
    } else {
      card.sync.textContent = dash;
      card.sync.classList.remove("stale");
    }
    const doc = node.document || {};
    const hash = typeof doc.content_hash === "string" ? doc.content_hash.slice(0, 10) : dash;
    card.doc.textContent = "epoch " + (doc.epoch ?? dash) + " · " + hash;
    card.doc.title = doc.content_hash || "";
    const away = typeof node.status_since === "number" && typeof snap.at === "number"
      ? " since " + fmtAgo(snap.at - node.status_since)
      : "";
    card.since.textContent = (node.status || dash) + away;
    const counts = Object.entries(node.tasks || {}).sort();
    card.tasks.replaceChildren(
      ...(counts.length
        ? counts.map(([s, n]) => el("span", { class: "tstate tstate-" + s, text: s + " " + n }))
        : [dash]),
    );
  }

  function drawSpark(canvas, points, key, max, colour) {
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const values = points.filter((p) => typeof p[key] === "number");
    if (values.length < 2) {
      ctx.fillStyle = cssVar("--muted");
      ctx.font = "10px system-ui, sans-serif";
      ctx.fillText(values.length ? "collecting…" : "no samples", 4, height / 2 + 3);
      return;
    }
    const t1 = values[values.length - 1].at;
    const t0 = Math.min(values[0].at, t1 - 60);
    const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (width - 2) + 1;
    const y = (v) => height - 2 - Math.max(0, Math.min(1, v / max)) * (height - 4);
    ctx.beginPath();
    values.forEach((p, i) => (i ? ctx.lineTo(x(p.at), y(p[key])) : ctx.moveTo(x(p.at), y(p[key]))));
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5;
    ctx.stroke();
    ctx.lineTo(x(t1), height);
    ctx.lineTo(x(values[0].at), height);
    ctx.closePath();
    ctx.globalAlpha = 0.15;
    ctx.fillStyle = colour;
    ctx.fill();
    ctx.globalAlpha = 1;
  }

  let polling = false;

  async function pollTelemetry() {
    if (polling || !token || authFailed || !lastSnapshot) return;
    polling = true;
    try {
      await pollEachNode();
    } finally {
      polling = false;
    }
  }

  async function pollEachNode() {
    const now = Date.now();
    for (const node of lastSnapshot.nodes || []) {
      if ((telemetryOff.get(node.id) || 0) > now) continue;
      const points = series.get(node.id) || [];
      const since = points.length ? points[points.length - 1].at : 0;
      let reply;
      try {
        reply = await api(
          "GET",
          "/v1/nodes/" + encodeURIComponent(node.id) + "/telemetry?since=" + since,
        );
      } catch (_) {
        return; // central unreachable: the stream's reconnect handles it
      }
      if (!reply.ok || !reply.data || !Array.isArray(reply.data.samples)) {
        telemetryOff.set(node.id, now + 60000); // not served (older central) or unknown node
        continue;
      }
      for (const sample of reply.data.samples) addSample(node.id, sample);
    }
    if (lastSnapshot) renderNodes(lastSnapshot);
  }

  // --- tasks ---------------------------------------------------------------------------------

  function decidedBy(task) {
    const reason = task.reason || "";
    let who = "central";
    if (reason.startsWith("kept on")) who = "central (reconcile)";
    else if (task.replacement) who = "central (failover)";
    const nodes = Object.entries(task.decided_by || {})
      .filter(([, by]) => by && by !== "central" && !by.startsWith("central:"))
      .map(([node, by]) => node + (by === "edge-autonomous" ? " (offline)" : " (" + by + ")"));
    return nodes.length ? who + "; " + nodes.join(", ") : who;
  }

  function cell(label, text, cls) {
    const content = el("span", { class: cls || "", text: text == null ? dash : String(text) });
    return el("td", { "data-label": label }, content);
  }

  function renderTasks(snap) {
    const rows = [];
    for (const task of snap.tasks || []) {
      const copies = Object.entries(task.copies || {})
        .sort()
        .map(([node, c]) => node + " (" + (c.state || "?") + ", e" + (c.epoch ?? "?") + ")");
      const running = (task.running_on || []).join(", ");
      // the task's own state fleet-wide (its lifecycle), not central's assignment
      const phase = task.phase || task.state;
      const shown = task.exit_code != null && phase === "failed"
        ? phase + " (" + task.exit_code + ")"
        : task.unknown_since != null ? phase + " (cut off)" : phase;
      const row = el(
        "tr",
        { "data-task": task.id, "data-state": phase || "" },
        cell("task", task.id, "mono"),
        cell("state", shown, "tstate-" + phase),
        cell("node", task.node),
        el(
          "td",
          {
            "data-label": "running on",
            title: copies.length ? "copies: " + copies.join("; ") : "no copy reported",
          },
          el("span", { text: running || dash }),
        ),
        cell("epoch", task.epoch),
        cell("decided by", decidedBy(task)),
        cell("reason", task.reason, "reason"),
      );
      rows.push(row);
    }
    for (const task of snap.node_tasks || []) {
      const by = task.decided_by === "edge-autonomous"
        ? task.node + " (offline)"
        : task.decided_by === "edge-connected"
          ? task.node + " (connected)"
          : task.decided_by || dash;
      rows.push(
        el(
          "tr",
          { class: "local", "data-task": task.id, "data-state": task.state || "" },
          cell("task", task.id, "mono"),
          cell("state", task.state, "tstate-" + task.state),
          cell("node", task.node),
          cell("running on", task.state === "running" ? task.node : dash),
          cell("epoch", dash),
          cell("decided by", by),
          cell("reason", "submitted at the node", "reason"),
        ),
      );
    }
    const body = $("tasks").tBodies[0];
    if (!rows.length) {
      rows.push(el("tr", { class: "empty" }, el("td", { colSpan: 7, text: "No tasks." })));
    }
    body.replaceChildren(...rows);
  }

  // --- events --------------------------------------------------------------------------------

  function renderEvents(snap) {
    const events = (snap.events || []).slice().reverse(); // newest first
    const list = $("events");
    if (!events.length) {
      list.replaceChildren(el("li", { class: "empty", text: "No events yet." }));
    } else {
      list.replaceChildren(
        ...events.map((e) =>
          el(
            "li",
            { "data-kind": e.kind },
            el("time", { text: fmtTime(e.at), dateTime: new Date(e.at * 1000).toISOString() }),
            el("span", { class: "kind", "data-kind": e.kind, text: e.kind }),
            el("span", { class: "detail", text: e.detail }),
          ),
        ),
      );
    }
    drawStrip(snap);
  }

  function drawStrip(snap) {
    const canvas = $("strip");
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const now = typeof snap.at === "number" ? snap.at : Date.now() / 1000;
    const t0 = now - SERIES_KEEP_S;
    ctx.strokeStyle = cssVar("--line");
    ctx.beginPath();
    ctx.moveTo(0, height / 2);
    ctx.lineTo(width, height / 2);
    ctx.stroke();
    ctx.fillStyle = cssVar("--muted");
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillText("-10 min", 2, height - 2);
    ctx.fillText("now", width - 20, height - 2);
    const colours = {};
    for (const span of document.querySelectorAll(".strip-legend span")) {
      colours[span.dataset.kind] = getComputedStyle(span).getPropertyValue("--kind").trim();
    }
    for (const e of snap.events || []) {
      if (e.at < t0) continue;
      const x = ((e.at - t0) / SERIES_KEEP_S) * (width - 4) + 2;
      ctx.fillStyle = colours[e.kind] || cssVar("--unknown");
      ctx.fillRect(x - 1.5, 4, 3, height - 16);
    }
  }

  // --- all of it -----------------------------------------------------------------------------

  function render(snap) {
    renderHeader(snap);
    renderNodes(snap);
    renderTasks(snap);
    renderEvents(snap);
    $("updated").textContent = "updated " + fmtTime(snap.at);
  }

  function start() {
    token = readToken();
    $("mode-select").addEventListener("change", (e) => switchPolicy("mode", e.target.value));
    $("tidal-select").addEventListener("change", (e) =>
      switchPolicy("tidal_profile", e.target.value),
    );
    $("policy-form").addEventListener("submit", (e) => e.preventDefault());
    $("token-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const value = $("token-input").value.trim();
      if (!value) return;
      token = value;
      sessionStorage.setItem(TOKEN_KEY, value);
      $("token-input").value = "";
      backoff = BACKOFF_MIN_MS;
      connect();
    });
    window.addEventListener("hashchange", () => {
      const fresh = readToken();
      if (fresh && fresh !== token) {
        token = fresh;
        backoff = BACKOFF_MIN_MS;
        connect();
      }
    });
    window.addEventListener("resize", () => lastSnapshot && render(lastSnapshot));
    setInterval(pollTelemetry, TELEMETRY_POLL_MS);
    connect();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

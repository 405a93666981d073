// edgesched fleet dashboard: vanilla JS, no build step, nothing loaded from elsewhere.
// Live data comes from central's Server-Sent Events stream (/v1/stream); the token is taken
// from the URL fragment (#token=...), kept in sessionStorage for this tab, sent as ?token= to
// the stream (EventSource cannot set headers) and as "Authorization: Bearer" to fetch().
"use strict";

(() => {
  const TOKEN_KEY = "edgesched.dashboard.token";
  const TELEMETRY_POLL_MS = 5000; // the selected node's sparklines
  const TASKS_REFRESH_MS = 2000; // the task page shown, while the stream is live
  const FLEET_POLL_MS = 30000; // the day's series (a point a minute)
  const STALE_AFTER_MS = 4000; // no snapshot for this long: the view is stale
  const SERIES_KEEP_S = 600; // sparklines and the event strip show the last 10 minutes
  const NODES_PER_PAGE = 50;
  const TASKS_PER_PAGE = 50;
  const TASK_REQUESTS_PER_PAGE = 10; // a filtered page follows next this often at most
  const ROUTINE_EVENTS = new Set(["placed", "pruned"]);
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;
  const STATES = ["connected", "suspect", "partitioned", "dead"];
  const SERVICES_REFRESH_MS = TASKS_REFRESH_MS; // the services, while their panel is on screen
  const SITES_REFRESH_MS = TASKS_REFRESH_MS; // the sites, while their panel is on screen
  const SITE_DECISIONS_SHOWN = 10; // per site, newest first (GET /v1/sites?decisions=)
  const SERVICE_SAMPLES_KEEP = 500; // changes of a service's counts this page keeps
  const LOAD_FRESH_S = 300; // an autoscaler acts on no older load report (central's services.py)
  // Events of services (central/services.py), with how the timeline names them.
  const EVENT_LABELS = {
    service: "service created",
    "service-changed": "service changed",
    scaled: "scaled",
    "replica-started": "replica started",
    "replica-stopped": "replica stopped",
    "rollout-stalled": "rollout stalled",
    "service-deleted": "service deleted",
  };
  const SERVICE_EVENT_KINDS = new Set(Object.keys(EVENT_LABELS));
  const SCALE_KINDS = new Set(["service", "service-changed", "scaled"]); // may set the count
  // "<service>: <reason>: <what>", the reason first (manual, load or forecast)
  const REASON_RE = /^([a-z0-9](?:[a-z0-9-]*[a-z0-9])?): (manual|load|forecast): ([\s\S]*)$/;

  const $ = (id) => document.getElementById(id);

  let token = "";
  let source = null;
  let retryTimer = null;
  let backoff = BACKOFF_MIN_MS;
  let authFailed = false;
  let policyBusy = false;
  let lastSnapshot = null;
  let lastSnapshotAt = 0; // Date.now() of the last snapshot taken
  let staleSince = null; // Date.now() when the view went stale, or null while live
  const series = new Map(); // node id -> [{at, cpu, mem, power}] (the selected node's)
  const nodeView = { text: "", state: "", page: 0, selected: null };
  const taskView = {
    prefix: "", phase: "", origin: "", node: "",
    cursors: [null], // the "after" of each page visited
    page: 0,
    next: null,
    rows: [],
    total: 0,
    busy: false, // a load is under way (the periodic refresh waits for it)
    seq: 0,
    error: "",
    selected: null,
  };
  let fleetSeries = [];
  let serverOffset = 0; // central's clock minus this page's, from the last snapshot (s)
  const serviceView = {
    rows: [],
    loaded: false,
    error: "",
    busy: false,
    again: false, // a load was asked for while one was under way
    onScreen: true, // the panel is in the viewport (an IntersectionObserver says)
    selected: null,
    detail: null, // the open service's GET /v1/services/{name}
    wantedEvents: [], // the open service's counts from its events: [{at, to, from}]
    samples: new Map(), // service -> [{at, wanted, running, live}], a point per change
    eventsSeenAt: 0,
  };

  const siteView = { rows: [], loaded: false, error: "", busy: false, onScreen: true };

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
    if (state === "live") markFresh();
    else if (lastSnapshot !== null) markStale();
  }

  // A stale view is unmistakable: a banner naming since when, and the content greyed.
  function markStale() {
    if (staleSince === null) staleSince = lastSnapshotAt || Date.now();
    const at = new Date(staleSince).toLocaleTimeString([], { hour12: false });
    const link = $("link").textContent;
    $("stale-message").textContent =
      "Central's live stream is gone (" + link + "): everything below is as it was at " + at +
      ", not as it is now.";
    $("stale").hidden = false;
    document.body.dataset.stale = "true";
  }

  function markFresh() {
    staleSince = null;
    $("stale").hidden = true;
    document.body.dataset.stale = "false";
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
      const first = lastSnapshot === null;
      lastSnapshot = snap;
      lastSnapshotAt = Date.now();
      if (typeof snap.at === "number") serverOffset = snap.at - Date.now() / 1000;
      setLink("live", "live");
      render(snap);
      if (first) {
        loadTasks();
        loadFleet();
        loadServices();
        loadSites();
      }
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
    $("count-tasks").textContent = String(snap.tasks_total ?? 0);
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

  // --- fleet -------------------------------------------------------------------------------

  function fmtPower(w) {
    if (typeof w !== "number") return dash;
    return w >= 10000 ? (w / 1000).toFixed(1) + " kW" : w.toFixed(0) + " W";
  }

  function fmtEnergy(wh) {
    if (typeof wh !== "number") return dash;
    return wh >= 1000 ? (wh / 1000).toFixed(2) + " kWh" : wh.toFixed(0) + " Wh";
  }

  function fmtCores(c) {
    return typeof c === "number" ? (c >= 100 ? c.toFixed(0) : c.toFixed(1)) : dash;
  }

  function renderFleet(snap) {
    const f = snap.fleet;
    const policy = snap.policy || {};
    $("tidal-profile").textContent = "profile " + (policy.tidal_profile || dash);
    if (!f) {
      $("fleet-util").textContent = "collecting…";
      return;
    }
    $("fleet-util").textContent = typeof f.util === "number" ? Math.round(f.util * 100) + " %" : dash;
    $("fleet-measured").textContent = f.nodes_measured + " nodes measured";
    $("fleet-power").textContent = fmtPower(f.power_w);
    $("fleet-energy").textContent = fmtEnergy(f.energy_today_wh);
    $("fleet-demand").textContent = fmtCores(f.demand_cpu) + " / " + fmtCores(f.capacity_cpu);
    $("fleet-forecast").textContent =
      typeof f.forecast_cpu === "number" ? fmtCores(f.forecast_cpu) + " cores" : "not yet";
    $("tidal-window").textContent = f.window || "outside any window";
    const classes = new Set([...Object.keys(f.shares || {}), ...Object.keys(f.used || {})]);
    const body = $("shares").tBodies[0];
    if (!classes.size) {
      body.replaceChildren(
        el("tr", { class: "empty" }, el("td", { colSpan: 3, text: "No class has a share or a task yet." })),
      );
    } else {
      body.replaceChildren(
        ...[...classes].sort().map((c) =>
          el(
            "tr",
            { "data-class": c },
            el("td", { text: c }),
            shareCell((f.shares || {})[c]),
            shareCell((f.used || {})[c]),
          ),
        ),
      );
    }
    drawFleet();
  }

  function shareCell(share) {
    const pct = typeof share === "number" ? Math.round(share * 100) : null;
    const bar = el("span", { class: "bar" });
    bar.style.width = (pct ?? 0) + "%";
    return el("td", {}, el("span", { class: "barwrap" }, bar), el("span", { text: pct === null ? dash : pct + " %" }));
  }

  async function loadFleet() {
    if (!token || authFailed) return;
    try {
      const since = Date.now() / 1000 - 86400;
      const reply = await api("GET", "/v1/fleet?since=" + since.toFixed(0));
      if (reply.ok && reply.data && Array.isArray(reply.data.series)) {
        fleetSeries = reply.data.series;
        drawFleet();
      }
    } catch (_) {
      // central unreachable: the stream's reconnect says so
    }
  }

  function prepare(canvas) {
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return null;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    return { ctx, width, height };
  }

  function line(ctx, points, x, y, colour, dashed) {
    ctx.beginPath();
    let started = false;
    for (const [t, v] of points) {
      if (typeof v !== "number") {
        started = false;
        continue;
      }
      if (started) ctx.lineTo(x(t), y(v));
      else ctx.moveTo(x(t), y(v));
      started = true;
    }
    ctx.setLineDash(dashed ? [4, 3] : []);
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5;
    ctx.stroke();
    ctx.setLineDash([]);
  }

  function axes(ctx, width, height, t0, t1, label) {
    ctx.fillStyle = cssVar("--muted");
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillText(label, 2, 10);
    ctx.fillText(fmtTime(t0), 2, height - 2);
    const right = fmtTime(t1);
    ctx.fillText(right, width - ctx.measureText(right).width - 2, height - 2);
  }

  function drawFleet() {
    const pts = fleetSeries.slice();
    const now = lastSnapshot && lastSnapshot.fleet;
    if (now && (!pts.length || now.at > pts[pts.length - 1].at)) {
      pts.push({ ...now, energy_wh: now.energy_today_wh });
    }
    for (const [id, draw] of [
      ["chart-cores", drawCores],
      ["chart-power", drawPower],
    ]) {
      const c = prepare($(id));
      if (!c) continue;
      if (pts.length < 2) {
        c.ctx.fillStyle = cssVar("--muted");
        c.ctx.font = "11px system-ui, sans-serif";
        c.ctx.fillText("collecting: a point a minute, for the last 24 hours", 6, c.height / 2);
        continue;
      }
      draw(c, pts);
    }
  }

  function drawCores({ ctx, width, height }, pts) {
    const t0 = pts[0].at;
    const t1 = pts[pts.length - 1].at;
    const max = Math.max(1, ...pts.map((p) => Math.max(p.capacity_cpu || 0, p.demand_cpu || 0, p.forecast_cpu || 0))) * 1.1;
    const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (width - 4) + 2;
    const y = (v) => height - 14 - (v / max) * (height - 28);
    line(ctx, pts.map((p) => [p.at, p.capacity_cpu]), x, y, cssVar("--unknown"));
    line(ctx, pts.map((p) => [p.at, p.demand_cpu]), x, y, cssVar("--cpu"));
    // the forecast made at t is for t .. t+15 min: drawn where it was meant to come true
    line(ctx, pts.map((p) => [p.at + 900, p.forecast_cpu]).filter(([t]) => t <= t1 + 900), x, y, "#e36209", true);
    axes(ctx, width, height, t0, t1, "max " + fmtCores(max / 1.1) + " cores");
  }

  function drawPower({ ctx, width, height }, pts) {
    const t0 = pts[0].at;
    const t1 = pts[pts.length - 1].at;
    const maxW = Math.max(1, ...pts.map((p) => p.power_w || 0)) * 1.1;
    const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (width - 4) + 2;
    const yW = (v) => height - 14 - (v / maxW) * (height - 28);
    const yU = (v) => height - 14 - v * (height - 28);
    line(ctx, pts.map((p) => [p.at, p.power_w]), x, yW, cssVar("--power"));
    line(ctx, pts.map((p) => [p.at, p.util]), x, yU, cssVar("--connected"));
    axes(ctx, width, height, t0, t1, "max " + fmtPower(maxW / 1.1) + " · utilization 0–100 %");
  }

  // --- nodes -------------------------------------------------------------------------------

  function hardware(reg) {
    reg = reg || {};
    return [
      reg.arch,
      reg.server_class,
      typeof reg.cpu === "number" ? reg.cpu + " CPU" : null,
      typeof reg.mem_gib === "number" ? reg.mem_gib + " GiB" : null,
      reg.accel ? reg.accel + " accel" : null,
      reg.site ? "@" + reg.site : null,
    ]
      .filter((x) => x !== null && x !== undefined && x !== "")
      .join(" · ");
  }

  function filteredNodes(snap) {
    const text = nodeView.text.toLowerCase();
    return (snap.nodes || []).filter((n) => {
      if (nodeView.state && (n.state || "unknown") !== nodeView.state) return false;
      if (!text) return true;
      return (n.id + " " + hardware(n.registration)).toLowerCase().includes(text);
    });
  }

  function renderNodes(snap) {
    const all = snap.nodes || [];
    const nodes = filteredNodes(snap);
    const pages = Math.max(1, Math.ceil(nodes.length / NODES_PER_PAGE));
    nodeView.page = Math.min(nodeView.page, pages - 1);
    const start = nodeView.page * NODES_PER_PAGE;
    const shown = nodes.slice(start, start + NODES_PER_PAGE);
    $("nodes-info").textContent = nodes.length
      ? start + 1 + "–" + (start + shown.length) + " of " + nodes.length +
        (nodes.length !== all.length ? " (of " + all.length + ")" : "")
      : "none";
    $("nodes-prev").disabled = nodeView.page === 0;
    $("nodes-next").disabled = nodeView.page >= pages - 1;
    const body = $("nodes").tBodies[0];
    if (!shown.length) {
      const text = all.length ? "No node matches." : "No node has spoken to central yet.";
      body.replaceChildren(el("tr", { class: "empty" }, el("td", { colSpan: 8, text })));
    } else {
      body.replaceChildren(...shown.map((n) => nodeRow(n, snap)));
    }
    if (nodeView.selected) renderNodeDetail(snap);
  }

  function nodeRow(node, snap) {
    const state = node.state || "unknown";
    const t = node.telemetry || {};
    const sync = node.sync || {};
    const counts = Object.entries(node.tasks || {}).sort();
    const away = typeof node.status_since === "number" && typeof snap.at === "number"
      ? " since " + fmtAgo(snap.at - node.status_since)
      : "";
    const row = el(
      "tr",
      {
        class: "node" + (nodeView.selected === node.id ? " selected" : ""),
        "data-node": node.id,
        "data-state": state,
        tabIndex: 0,
      },
      cell("node", node.id, "mono node-id"),
      el("td", { "data-label": "state" }, el("span", { class: "badge state", "data-state": state, text: state })),
      cell("hardware", hardware(node.registration) || dash, "muted"),
      cell("CPU", typeof t.cpu_util === "number" ? Math.round(t.cpu_util * 100) + " %" : dash, "num"),
      cell("power", typeof t.power_w === "number" ? t.power_w.toFixed(0) + " W" : dash, "num"),
      el(
        "td",
        { "data-label": "tasks" },
        el(
          "span",
          { class: "tstates" },
          ...(counts.length
            ? counts.map(([s, n]) => el("span", { class: "tstate tstate-" + s, text: s + " " + n }))
            : [dash]),
        ),
      ),
      el(
        "td",
        { "data-label": "sync" },
        el("span", {
          class: sync.fresh === false ? "stale" : "",
          text: (sync.last_update_s_ago == null ? "no update yet" : fmtAgo(sync.last_update_s_ago)) +
            (sync.fresh === false ? " · stale" : ""),
        }),
      ),
      cell("status", (node.status || dash) + away),
    );
    row.addEventListener("click", () => selectNode(node.id));
    row.addEventListener("keydown", (e) => e.key === "Enter" && selectNode(node.id));
    return row;
  }

  function selectNode(nodeId) {
    if (nodeView.selected !== nodeId) series.clear();
    nodeView.selected = nodeId;
    $("node-detail").hidden = false;
    if (lastSnapshot) renderNodes(lastSnapshot);
    pollTelemetry();
  }

  function renderNodeDetail(snap) {
    const node = (snap.nodes || []).find((n) => n.id === nodeView.selected);
    $("node-detail-title").textContent = nodeView.selected + (node ? " · " + (node.state || "unknown") : " · gone");
    if (!node) return;
    const doc = node.document || {};
    const reg = node.registration || {};
    const kv = [
      ["hardware", hardware(reg) || dash],
      ["CPU model", reg.cpu_model || dash],
      ["status", (node.status || dash) + (node.status_cause ? " (" + node.status_cause + ")" : "")],
      ["document", "epoch " + (doc.epoch ?? dash) + " · " + (doc.content_hash || dash).slice(0, 16)],
      ["tasks", Object.entries(node.tasks || {}).map(([s, n]) => s + " " + n).join(", ") || dash],
    ];
    $("node-detail-kv").replaceChildren(...kv.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
    if (node.telemetry) addSample(node.telemetry);
    const points = series.get("selected") || [];
    const latest = points[points.length - 1];
    $("node-cpu-val").textContent = latest && typeof latest.cpu === "number" ? Math.round(latest.cpu * 100) + " %" : dash;
    $("node-power-val").textContent = latest && typeof latest.power === "number" ? latest.power.toFixed(0) + " W" : dash;
    drawSpark($("node-cpu"), points, "cpu", 1, cssVar("--cpu"));
    const maxPower = Math.max(1, ...points.map((p) => p.power || 0)) * 1.15;
    drawSpark($("node-power"), points, "power", maxPower, cssVar("--power"));
  }

  function addSample(sample) {
    if (!sample || typeof sample.at !== "number") return;
    let points = series.get("selected");
    if (!points) {
      points = [];
      series.set("selected", points);
    }
    if (points.some((p) => p.at === sample.at)) return;
    points.push({
      at: sample.at,
      cpu: typeof sample.cpu_util === "number" ? sample.cpu_util : null,
      power: typeof sample.power_w === "number" ? sample.power_w : null,
    });
    points.sort((a, b) => a.at - b.at);
    const horizon = points[points.length - 1].at - SERIES_KEEP_S;
    while (points.length && points[0].at < horizon) points.shift();
  }

  function drawSpark(canvas, points, key, max, colour) {
    const c = prepare(canvas);
    if (!c) return;
    const { ctx, width, height } = c;
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
    line(ctx, values.map((p) => [p.at, p[key]]), x, y, colour);
  }

  let polling = false;

  async function pollTelemetry() {
    const nodeId = nodeView.selected;
    if (polling || !nodeId || !token || authFailed) return;
    polling = true;
    try {
      const points = series.get("selected") || [];
      const since = points.length ? points[points.length - 1].at : 0;
      const reply = await api("GET", "/v1/nodes/" + encodeURIComponent(nodeId) + "/telemetry?since=" + since);
      if (nodeView.selected !== nodeId) return;
      if (reply.ok && reply.data && Array.isArray(reply.data.samples)) {
        for (const sample of reply.data.samples) addSample(sample);
      }
      if (lastSnapshot) renderNodeDetail(lastSnapshot);
    } catch (_) {
      // central unreachable: the stream's reconnect handles it
    } finally {
      polling = false;
    }
  }

  // --- tasks -------------------------------------------------------------------------------

  function decidedBy(task) {
    const reason = task.reason || "";
    if (task.origin === "node") {
      const by = task.decided_by;
      return (task.node || "a node") + (by === "edge-autonomous" ? " (offline)" : by === "edge-connected" ? " (connected)" : "");
    }
    if (reason.startsWith("kept on")) return "central (reconcile)";
    if (task.replacement) return "central (failover)";
    return "central";
  }

  function cell(label, text, cls) {
    const content = el("span", { class: cls || "", text: text == null ? dash : String(text) });
    return el("td", { "data-label": label }, content);
  }

  function shownPhase(task) {
    const phase = task.phase || task.state;
    if (task.exit_code != null && (phase === "failed" || phase === "exited")) {
      return phase + " (" + task.exit_code + ")";
    }
    return task.unknown_since != null ? phase + " (cut off)" : phase;
  }

  function taskQuery(limit, after) {
    const q = new URLSearchParams({ limit: String(limit) });
    if (after) q.set("after", after);
    for (const key of ["prefix", "phase", "origin", "node"]) {
      if (taskView[key]) q.set(key, taskView[key]);
    }
    return "/v1/tasks?" + q.toString();
  }

  // One page of tasks from central (server-side: filters, order, paging). A filtered page
  // may come in parts (central bounds each request's work): follow next until it is full.
  async function loadTasks() {
    if (!token || authFailed) return;
    const seq = ++taskView.seq; // a newer load (a click, a filter) makes this one moot
    taskView.busy = true;
    try {
      const rows = [];
      let after = taskView.cursors[taskView.page];
      let next = null;
      let total = 0;
      for (let i = 0; i < TASK_REQUESTS_PER_PAGE; i++) {
        const reply = await api("GET", taskQuery(TASKS_PER_PAGE - rows.length, after));
        if (seq !== taskView.seq) return;
        if (!reply.ok || !reply.data) {
          taskView.error = "central refused the query: " + problemText(reply);
          renderTasks();
          return;
        }
        rows.push(...reply.data.tasks);
        next = reply.data.next;
        total = reply.data.total;
        after = next;
        if (!next || rows.length >= TASKS_PER_PAGE) break;
      }
      taskView.error = "";
      taskView.rows = rows;
      taskView.next = next;
      taskView.total = total;
      renderTasks();
      document.body.dataset.tasksLoaded = String(seq); // (for the benchmark)
    } catch (err) {
      if (seq !== taskView.seq) return;
      taskView.error = "central unreachable: " + err;
      renderTasks();
    } finally {
      if (seq === taskView.seq) taskView.busy = false;
    }
    if (taskView.selected) loadTaskDetail();
  }

  function filtersOn() {
    return Boolean(taskView.prefix || taskView.phase || taskView.origin || taskView.node);
  }

  function renderTasks() {
    const rows = taskView.rows.map((task) => {
      const copies = Object.entries(task.copies || {})
        .sort()
        .map(([node, c]) => node + " (" + (c.state || "?") + ", e" + (c.epoch ?? "?") + ")");
      const phase = task.phase || task.state;
      const row = el(
        "tr",
        {
          class: (task.origin === "node" ? "local" : "") + (taskView.selected === task.id ? " selected" : ""),
          "data-task": task.id,
          "data-state": phase || "",
          tabIndex: 0,
        },
        cell("task", task.id, "mono"),
        cell("state", shownPhase(task), "tstate-" + phase),
        cell("node", task.node),
        el(
          "td",
          { "data-label": "running on", title: copies.length ? "copies: " + copies.join("; ") : "no copy reported" },
          el("span", { text: (task.running_on || []).join(", ") || dash }),
        ),
        cell("origin", task.origin === "node" ? "node" : "central"),
        cell("decided by", decidedBy(task)),
        cell("reason", task.reason || (task.origin === "node" ? "decided at the node" : dash), "reason"),
      );
      row.addEventListener("click", () => selectTask(task.id));
      row.addEventListener("keydown", (e) => e.key === "Enter" && selectTask(task.id));
      return row;
    });
    const body = $("tasks").tBodies[0];
    if (!rows.length) {
      const text = taskView.error || (filtersOn() ? "No task matches." : "No tasks.");
      rows.push(el("tr", { class: "empty" }, el("td", { colSpan: 7, text })));
    }
    body.replaceChildren(...rows);
    const first = taskView.page * TASKS_PER_PAGE;
    $("tasks-info").textContent =
      (taskView.error && taskView.rows.length ? "⚠ " : "") +
      "page " + (taskView.page + 1) +
      (taskView.rows.length ? " · " + (first + 1) + "–" + (first + taskView.rows.length) : "") +
      (filtersOn() ? " (filtered)" : "") + " · " + taskView.total + " tasks";
    $("tasks-prev").disabled = taskView.page === 0;
    $("tasks-next").disabled = !taskView.next;
  }

  function resetTaskPages() {
    taskView.cursors = [null];
    taskView.page = 0;
    loadTasks();
  }

  function selectTask(taskId) {
    taskView.selected = taskId;
    $("task-detail").hidden = false;
    $("task-logs").textContent = "—";
    renderTasks();
    loadTaskDetail();
  }

  async function loadTaskDetail() {
    const taskId = taskView.selected;
    if (!taskId) return;
    let reply;
    try {
      reply = await api("GET", "/v1/tasks/" + encodeURIComponent(taskId));
    } catch (err) {
      return;
    }
    if (taskView.selected !== taskId) return;
    $("task-detail-title").textContent = taskId;
    if (!reply.ok || !reply.data) {
      $("task-detail-kv").replaceChildren(el("dt", { text: "error" }), el("dd", { text: problemText(reply) }));
      $("task-copies").tBodies[0].replaceChildren();
      return;
    }
    const t = reply.data;
    const spec = t.spec || {};
    const kv = [
      ["state", shownPhase(t)],
      ["exit code", t.exit_code ?? dash],
      ["restarts", t.restarts ?? dash],
      ["node", t.node || dash],
      ["running on", (t.running_on || []).join(", ") || dash],
      ["origin", t.origin],
      ["decided by", decidedBy(t)],
      ["reason", t.reason || dash],
      ["submitted", fmtTime(t.submitted_at)],
      ["started", fmtTime(t.started_at)],
      ["finished", fmtTime(t.finished_at)],
      ["unknown since", t.unknown_since == null ? dash : fmtTime(t.unknown_since)],
      ["epoch", t.epoch ?? dash],
      ["command", Array.isArray(spec.command) ? spec.command.join(" ") : dash],
      ["asks", spec.cpu != null ? spec.cpu + " CPU · " + (spec.mem_gib ?? 0) + " GiB · " + (spec.workload || "") : dash],
    ];
    $("task-detail-kv").replaceChildren(...kv.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })]));
    const copies = Object.entries(t.copies || {}).sort();
    $("task-copies").tBodies[0].replaceChildren(
      ...(copies.length
        ? copies.map(([node, c]) =>
            el(
              "tr",
              { "data-node": node },
              cell("node", node, "mono"),
              cell("state", c.state, "tstate-" + c.state),
              cell("epoch", c.epoch ?? dash),
              cell("updated", fmtTime(c.updated_at)),
            ),
          )
        : [el("tr", { class: "empty" }, el("td", { colSpan: 4, text: "No node reports a copy." }))]),
    );
  }

  async function loadTaskLogs() {
    const taskId = taskView.selected;
    if (!taskId) return;
    const out = $("task-logs");
    out.textContent = "asking central…";
    try {
      const response = await fetch("/v1/tasks/" + encodeURIComponent(taskId) + "/logs?tail=200", {
        headers: { Authorization: "Bearer " + token },
        cache: "no-store",
      });
      const text = await response.text();
      if (taskView.selected !== taskId) return;
      if (response.ok) {
        out.textContent = text || "(no output)";
      } else {
        let detail = text;
        try {
          const d = JSON.parse(text);
          detail = d.detail || d.title || text;
        } catch (_) {
          // not problem JSON: shown as it came
        }
        out.textContent = "no output: " + detail + " (HTTP " + response.status + ")";
      }
    } catch (err) {
      out.textContent = "central unreachable: " + err;
    }
  }

  // --- services ------------------------------------------------------------------------------
  // GET /v1/services (a summary per service) every SERVICES_REFRESH_MS while the panel is on
  // screen and the stream is live, and at once when the stream brings a service event; the
  // open service's GET /v1/services/{name} with it. The replica-count chart's "wanted" steps
  // come from the service's scaling events (GET /v1/events once when it is opened, then the
  // stream's); its "running" steps are what this page saw since it was loaded (a point kept
  // per change, for every service listed).

  function serverNow() {
    return Date.now() / 1000 + serverOffset;
  }

  // "web: forecast: 3 -> 5 replicas (...)" -> [service, reason, the rest]
  function scaleReason(detail) {
    const m = REASON_RE.exec(detail || "");
    return m ? { service: m[1], why: m[2], rest: m[3] } : null;
  }

  function arrows(text) {
    return String(text).replace(/ -> /g, " → ");
  }

  // The replica count an event of a service set (and the one before, if it says): null if
  // it set none (a template change alone, a replica started).
  function wantedFrom(event, name) {
    const detail = event.detail || "";
    if (!detail.startsWith(name + ": ")) return null;
    if (event.kind === "service-deleted") return { at: event.at, to: 0, from: null };
    if (!SCALE_KINDS.has(event.kind)) return null;
    let m = /created with (\d+) replicas/.exec(detail);
    if (m) return { at: event.at, to: Number(m[1]), from: null };
    m = /(?:^|[:;] )(?:replicas )?(\d+) -> (\d+)(?: replicas)?(?:$|[;( ])/.exec(detail.slice(name.length + 2));
    return m ? { at: event.at, to: Number(m[2]), from: Number(m[1]) } : null;
  }

  function noteServiceSample(s, at) {
    let points = serviceView.samples.get(s.name);
    if (!points) {
      points = [];
      serviceView.samples.set(s.name, points);
    }
    const last = points[points.length - 1];
    if (last && last.wanted === s.replicas && last.running === s.running && last.live === s.live) return;
    points.push({ at, wanted: s.replicas, running: s.running, live: s.live });
    if (points.length > SERVICE_SAMPLES_KEEP) points.splice(0, points.length - SERVICE_SAMPLES_KEEP);
  }

  async function loadServices() {
    if (!token || authFailed) return;
    if (serviceView.busy) {
      serviceView.again = true;
      return;
    }
    serviceView.busy = true;
    try {
      const reply = await api("GET", "/v1/services");
      if (reply.ok && reply.data && Array.isArray(reply.data.services)) {
        const at = serverNow();
        serviceView.rows = reply.data.services;
        serviceView.error = "";
        const names = new Set();
        for (const s of serviceView.rows) {
          names.add(s.name);
          noteServiceSample(s, at);
        }
        for (const name of [...serviceView.samples.keys()]) {
          if (!names.has(name)) serviceView.samples.delete(name);
        }
      } else {
        serviceView.error = "central refused the list: " + problemText(reply);
      }
      serviceView.loaded = true;
      renderServices();
      if (serviceView.selected) await loadServiceDetail();
    } catch (err) {
      serviceView.error = "central unreachable: " + err;
      renderServices();
    } finally {
      serviceView.busy = false;
    }
    if (serviceView.again) {
      serviceView.again = false;
      loadServices();
    }
  }

  function rolloutText(s) {
    const r = s.rollout || {};
    const outdated = r.outdated || 0;
    const slots = outdated + (outdated === 1 ? " slot" : " slots");
    if (r.stalled) return "stalled: " + slots + " keep the old revision";
    return outdated ? slots + " to roll out" : "up to date";
  }

  function loadText(s) {
    const load = s.load;
    if (!load || typeof load.cores !== "number") return "no load reported";
    // central says whether its autoscaler still acts on it (its clock may run faster: a demo)
    const stale = typeof load.fresh === "boolean" ? !load.fresh : serverNow() - load.at > LOAD_FRESH_S;
    const old = stale ? " (stale)" : "";
    return "load " + fmtCores(load.cores) + " cores" + old;
  }

  function autoscaleCell(s) {
    const rule = (s.spec || {}).autoscale;
    if (!rule) return cell("autoscale", "manual", "muted");
    const parts = [loadText(s)];
    if (rule.metric === "forecast") {
      parts.push(
        typeof s.forecast_peak === "number"
          ? "forecast peak " + fmtCores(s.forecast_peak) + " cores"
          : "no forecast yet",
      );
    }
    parts.push(rule.target_per_replica + " cores a replica");
    return el(
      "td",
      { "data-label": "autoscale", title: "autoscaled on " + rule.metric },
      el("span", { class: "autoscale", text: "by " + rule.metric + ": " + parts.join(" · ") }),
    );
  }

  // The reason chip and what changed; the why in brackets (the autoscaler's arithmetic) is in
  // the tooltip and the service's detail, to keep the row short.
  function reasonCell(s) {
    const parsed = scaleReason(s.name + ": " + (s.reason || ""));
    const what = parsed ? parsed.rest : s.reason || dash;
    const cut = what.indexOf(" (");
    const content = [arrows(cut > 0 ? what.slice(0, cut) : what)];
    if (parsed) content.unshift(el("span", { class: "why", "data-why": parsed.why, text: parsed.why }), " ");
    const when = el("span", { class: "muted", text: " · " + fmtTime(s.at) });
    return el(
      "td",
      { "data-label": "last change", class: "last-change", title: arrows(s.reason || "") },
      el("span", {}, ...content, when),
    );
  }

  function serviceState(s) {
    if (s.deleted) return "deleting";
    if ((s.rollout || {}).stalled) return "stalled";
    return s.running < s.replicas ? "short" : "ok";
  }

  function serviceRow(s) {
    const phases = Object.entries(s.phases || {}).sort().map(([p, n]) => p + " " + n).join(", ");
    const spec = s.spec || {};
    const label = el("span", {}, el("span", { class: "mono svc-name", text: s.name }));
    if (s.deleted) label.append(" ", el("span", { class: "badge", "data-state": "dead", text: "deleting" }));
    const name = el("td", { "data-label": "service" }, label);
    const row = el(
      "tr",
      {
        class: "service" + (serviceView.selected === s.name ? " selected" : ""),
        "data-service": s.name,
        "data-state": serviceState(s),
        tabIndex: 0,
      },
      name,
      el("td", { "data-label": "wanted", title: "within [" + spec.min + ", " + spec.max + "]" },
        el("span", { class: "num svc-wanted", text: String(s.replicas) })),
      el("td", { "data-label": "running" }, el("span", { class: "num svc-running", text: String(s.running) })),
      el("td", { "data-label": "live", title: phases ? "live by phase: " + phases : "no live replica" },
        el("span", { class: "num svc-live", text: String(s.live) })),
      cell("revision", s.revision, "mono"),
      cell("rollout", rolloutText(s), (s.rollout || {}).stalled ? "stale" : ""),
      reasonCell(s),
      autoscaleCell(s),
    );
    row.addEventListener("click", () => selectService(s.name));
    row.addEventListener("keydown", (e) => e.key === "Enter" && selectService(s.name));
    return row;
  }

  function renderServices() {
    const body = $("services").tBodies[0];
    const rows = serviceView.rows.map(serviceRow);
    if (!rows.length) {
      let td;
      if (serviceView.error) td = el("td", { colSpan: 8, text: serviceView.error });
      else if (!serviceView.loaded) td = el("td", { colSpan: 8, text: "Loading services…" });
      else {
        td = el(
          "td",
          { colSpan: 8 },
          "No services. Create one with ",
          el("code", { text: "edgesched service apply <file>" }),
          " or ",
          el("code", { text: "POST /v1/services" }),
          ".",
        );
      }
      rows.push(el("tr", { class: "empty" }, td));
    } else if (serviceView.error) {
      rows.push(el("tr", { class: "empty" }, el("td", { colSpan: 8, text: "⚠ " + serviceView.error })));
    }
    body.replaceChildren(...rows);
    const all = serviceView.rows;
    const wanted = all.reduce((n, s) => n + (s.replicas || 0), 0);
    const running = all.reduce((n, s) => n + (s.running || 0), 0);
    $("services-info").textContent = all.length
      ? "· " + all.length + (all.length === 1 ? " service" : " services") + " · " + running + " of " + wanted + " replicas running"
      : "";
  }

  function selectService(name) {
    if (serviceView.selected !== name) serviceView.wantedEvents = [];
    serviceView.selected = name;
    serviceView.detail = null;
    $("service-detail").hidden = false;
    $("service-detail-title").textContent = name;
    renderServices();
    loadServiceEvents(name);
    loadServiceDetail();
  }

  // The service's scaling events central still keeps (its notable ring holds 1,000).
  async function loadServiceEvents(name) {
    try {
      const kinds = [...SCALE_KINDS, "service-deleted"].join(",");
      const reply = await api("GET", "/v1/events?limit=1000&kind=" + encodeURIComponent(kinds));
      if (serviceView.selected !== name || !reply.ok || !reply.data) return;
      mergeServiceEvents(reply.data.events || []);
      drawServiceChart();
    } catch (_) {
      // central unreachable: the stream's reconnect says so
    }
  }

  function mergeServiceEvents(events) {
    const name = serviceView.selected;
    if (!name) return;
    const known = new Set(serviceView.wantedEvents.map((w) => w.at + "|" + w.to));
    for (const e of events) {
      const w = wantedFrom(e, name);
      if (w && !known.has(w.at + "|" + w.to)) {
        known.add(w.at + "|" + w.to);
        serviceView.wantedEvents.push(w);
      }
    }
    serviceView.wantedEvents.sort((a, b) => a.at - b.at);
  }

  async function loadServiceDetail() {
    const name = serviceView.selected;
    if (!name) return;
    let reply;
    try {
      reply = await api("GET", "/v1/services/" + encodeURIComponent(name));
    } catch (_) {
      return;
    }
    if (serviceView.selected !== name) return;
    if (!reply.ok || !reply.data) {
      serviceView.detail = null;
      $("service-detail-title").textContent = name + (reply.status === 404 ? " · gone" : "");
      $("service-detail-kv").replaceChildren(el("dt", { text: "error" }), el("dd", { text: problemText(reply) }));
      $("service-replicas").tBodies[0].replaceChildren();
      drawServiceChart();
      return;
    }
    const s = reply.data;
    serviceView.detail = s;
    noteServiceSample(s, serverNow());
    renderServiceDetail(s);
  }

  function renderServiceDetail(s) {
    const spec = s.spec || {};
    const template = spec.template || {};
    const spread = spec.spread || {};
    const phases = Object.entries(s.phases || {}).sort().map(([p, n]) => p + " " + n).join(", ");
    $("service-detail-title").textContent =
      s.name + " · " + s.running + " of " + s.replicas + " running" + (s.deleted ? " · deleting" : "");
    const kv = [
      ["replicas", s.replicas + " wanted (min " + spec.min + ", max " + spec.max + ") · " + s.live + " live"],
      ["live by phase", phases || dash],
      ["revision", s.revision],
      ["rollout", rolloutText(s)],
      ["last change", arrows(s.reason || dash) + " · " + fmtTime(s.at)],
      ["autoscale", spec.autoscale ? "by " + spec.autoscale.metric + ": " + loadText(s) +
        (typeof s.forecast_peak === "number" ? " · forecast peak " + fmtCores(s.forecast_peak) + " cores" : "") +
        " · " + spec.autoscale.target_per_replica + " cores a replica" : "manual"],
      ["spread", (spread.max_per_node ? "at most " + spread.max_per_node + " a node" : "no per-node bound") +
        ((spread.across || []).length ? " · across " + spread.across.join(", ") : "")],
      ["template", (Array.isArray(template.command) ? template.command.join(" ") : dash) +
        (template.cpu != null ? " · " + template.cpu + " CPU · " + (template.mem_gib ?? 0) + " GiB" : "")],
    ];
    $("service-detail-kv").replaceChildren(...kv.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })]));
    const tasks = (s.tasks || []).slice().sort((a, b) => a.slot - b.slot || a.id.localeCompare(b.id));
    $("service-replicas").tBodies[0].replaceChildren(
      ...(tasks.length
        ? tasks.map((r) => {
            const node = r.node
              ? el("button", {
                  type: "button",
                  class: "linkish mono",
                  text: r.node,
                  title: "open node " + r.node,
                  onclick: (event) => {
                    event.stopPropagation();
                    selectNode(r.node);
                    $("node-detail").scrollIntoView({ block: "nearest" });
                  },
                })
              : dash;
            return el(
              "tr",
              { "data-replica": r.id, "data-slot": String(r.slot), "data-phase": r.phase },
              cell("slot", r.slot, "num"),
              cell("revision", r.revision + (r.revision !== s.revision ? " (old)" : ""), "mono"),
              cell("phase", r.phase + (r.stopping ? " (stopping)" : ""), "tstate-" + r.phase),
              el("td", { "data-label": "node", class: "replica-node" }, node),
              cell("task", r.id, "mono muted"),
            );
          })
        : [el("tr", { class: "empty" }, el("td", { colSpan: 5, text: "No replica." }))]),
    );
    drawServiceChart();
  }

  function stepLine(ctx, pts, t1, x, y, colour, dashed) {
    if (!pts.length) return;
    ctx.beginPath();
    ctx.moveTo(x(pts[0].at), y(pts[0].v));
    for (let i = 1; i < pts.length; i++) {
      ctx.lineTo(x(pts[i].at), y(pts[i - 1].v));
      ctx.lineTo(x(pts[i].at), y(pts[i].v));
    }
    ctx.lineTo(x(t1), y(pts[pts.length - 1].v));
    ctx.setLineDash(dashed ? [4, 3] : []);
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5;
    ctx.stroke();
    ctx.setLineDash([]);
  }

  // Wanted: the scaling events' steps (else this page's samples); running: this page's samples.
  function drawServiceChart() {
    const canvas = $("service-chart");
    const name = serviceView.selected;
    const samples = (name && serviceView.samples.get(name)) || [];
    const now = serverNow();
    let wanted = [];
    const events = serviceView.wantedEvents;
    if (events.length) {
      if (events[0].from !== null) wanted.push({ at: events[0].at - 1, v: events[0].from });
      wanted.push(...events.map((w) => ({ at: w.at, v: w.to })));
    }
    const current = serviceView.detail;
    if (current && (!wanted.length || wanted[wanted.length - 1].v !== current.replicas)) {
      // a count the kept events do not show (a change older than them): as the samples saw it
      wanted = wanted.concat(samples.filter((p) => !wanted.length || p.at > wanted[wanted.length - 1].at)
        .map((p) => ({ at: p.at, v: p.wanted })));
    }
    const running = samples.map((p) => ({ at: p.at, v: p.running }));
    canvas.dataset.wanted = wanted.map((p) => p.v).filter((v, i, a) => i === 0 || a[i - 1] !== v).join(",");
    canvas.dataset.running = running.map((p) => p.v).join(",");
    const c = prepare(canvas);
    if (!c) return;
    const { ctx, width, height } = c;
    if (!wanted.length && !running.length) {
      ctx.fillStyle = cssVar("--muted");
      ctx.font = "11px system-ui, sans-serif";
      ctx.fillText("no count known yet", 6, height / 2);
      return;
    }
    const first = Math.min(...[...wanted, ...running].map((p) => p.at));
    const t1 = now;
    const t0 = t1 - Math.min(Math.max(30, (t1 - first) * 1.08), 86400); // (a day at most)
    const clip = (pts) => {
      const before = pts.filter((p) => p.at <= t0);
      const after = pts.filter((p) => p.at > t0);
      return before.length ? [{ at: t0, v: before[before.length - 1].v }, ...after] : after;
    };
    const max = Math.max(1, ...wanted.map((p) => p.v), ...running.map((p) => p.v));
    const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (width - 4) + 2;
    const y = (v) => height - 14 - (v / max) * (height - 28);
    stepLine(ctx, clip(running), t1, x, y, cssVar("--connected"), false);
    stepLine(ctx, clip(wanted), t1, x, y, cssVar("--cpu"), true);
    axes(ctx, width, height, t0, t1, "max " + max + " replicas");
  }

  function closeService() {
    serviceView.selected = null;
    serviceView.detail = null;
    serviceView.wantedEvents = [];
    $("service-detail").hidden = true;
    renderServices();
  }

  // Called with every snapshot: a service event newer than the last one seen reloads the list
  // (when the panel is on screen) and adds to the open service's chart.
  function serviceEvents(snap) {
    const fresh = (snap.events || []).filter(
      (e) => SERVICE_EVENT_KINDS.has(e.kind) && e.at > serviceView.eventsSeenAt,
    );
    if (!fresh.length) return;
    serviceView.eventsSeenAt = Math.max(...fresh.map((e) => e.at));
    mergeServiceEvents(fresh);
    if (servicesShown()) loadServices();
  }

  function servicesShown() {
    return serviceView.onScreen && !document.hidden;
  }

  // --- sites ---------------------------------------------------------------------------------
  // GET /v1/sites every SITES_REFRESH_MS while the panel is on screen: each site's members
  // (central's state of each, what the site says of it), its coordinator and the decisions it
  // made while cut off from central (central/sites.py). Not in the snapshot.

  async function loadSites() {
    if (!token || authFailed || siteView.busy) return;
    siteView.busy = true;
    try {
      const reply = await api("GET", "/v1/sites?decisions=" + SITE_DECISIONS_SHOWN);
      if (reply.ok && reply.data && Array.isArray(reply.data.sites)) {
        siteView.rows = reply.data.sites;
        siteView.error = "";
      } else {
        siteView.error = "central refused the list: " + problemText(reply);
      }
      siteView.loaded = true;
    } catch (err) {
      siteView.error = "central unreachable: " + err;
    } finally {
      siteView.busy = false;
    }
    renderSites();
  }

  function term(holder, epoch) {
    return holder ? holder + " @ epoch " + epoch : dash;
  }

  function siteHealth(m) {
    const text = {
      connected: "connected to central",
      "alive-in-site": "cut off from central, alive in its site (seen by " + m.seen_live_by.join(", ") + ")",
      unconfirmed: "offline; no online member sees it",
    }[m.health] || m.health;
    return el("span", { class: "site-health", "data-health": m.health, text });
  }

  function siteMemberRow(m, site) {
    const seen = m.seen || {};
    const coordinating = site.coordinator && site.coordinator.node === m.id;
    const name = el("span", { class: "mono", text: m.id });
    const label = el("span", {}, name);
    if (coordinating) label.append(" ", el("span", { class: "chip", text: "coordinator" }));
    return el(
      "tr",
      { class: "site-member", "data-member": m.id, "data-health": m.health },
      el("td", { "data-label": "member" }, label),
      el("td", { "data-label": "state" }, el("span", { class: "badge state", "data-state": m.state, text: m.state })),
      el("td", { "data-label": "health" }, siteHealth(m)),
      cell("vote", m.vote ? term(m.vote.holder, m.vote.epoch) : dash, "mono"),
      cell("sees live", m.seen ? (seen.peers.length ? seen.peers.join(", ") : "nobody") : dash),
      cell("follows", m.seen && seen.coordinator ? term(seen.coordinator, seen.epoch) : dash, "mono"),
      cell("decisions", String(m.decisions), "num"),
    );
  }

  function siteDecision(d) {
    const what = d.replacement ? "failed over to " : "placed on ";
    return el(
      "li",
      { class: "site-decision", "data-task": d.task },
      el("span", { class: "mono", text: d.task }),
      " " + what,
      el("span", { class: "mono", text: d.node }),
      " by " + d.coordinator + " @ epoch " + d.epoch + " · " + d.state + " · " + fmtTime(d.at),
    );
  }

  function siteCard(site) {
    const c = site.coordinator;
    const coordinator = el(
      "span",
      { class: "site-coordinator" },
      "coordinator: ",
      c ? el("b", { text: c.node }) : el("span", { class: "muted", text: "none (central decides)" }),
      c ? " · epoch " + c.epoch + " since " + fmtTime(c.since) + " over " + c.members.join(", ") : "",
    );
    const bridge = site.bridge.up
      ? el("span", { class: "chip", "data-ok": "true", text: "bridge up" })
      : el("span", { class: "chip", "data-ok": "false", text: "bridge down since " + fmtTime(site.bridge.down_since) });
    const table = el(
      "table",
      { class: "data site-members" },
      el("thead", {}, el("tr", {}, ...["member", "state", "health", "vote", "sees live", "follows", "decisions"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...site.members.map((m) => siteMemberRow(m, site))),
    );
    const decisions = site.decisions;
    const shown = decisions.recent.length;
    const heading = el(
      "h4",
      { class: "site-decisions-h" },
      decisions.total
        ? decisions.total + (decisions.total === 1 ? " decision" : " decisions") + " made while cut off" +
          (decisions.total > shown ? " (newest " + shown + ")" : "")
        : "No decision made while cut off",
    );
    const list = el("ol", { class: "site-decisions" }, ...decisions.recent.map(siteDecision));
    return el(
      "article",
      { class: "site", "data-site": site.site, "data-cut": String(!site.bridge.up || !!c) },
      el("header", {}, el("h3", { class: "mono", text: site.site }), bridge, coordinator),
      el("div", { class: "table-wrap" }, table),
      heading,
      list,
    );
  }

  function renderSites() {
    const box = $("sites");
    const rows = siteView.rows;
    const out = rows.map(siteCard);
    if (!rows.length) {
      let text = "No site: nodes with [edge] site_peers appear here once they write their site state.";
      if (siteView.error) text = siteView.error;
      else if (!siteView.loaded) text = "Loading sites…";
      out.push(el("p", { class: "empty muted", text }));
    } else if (siteView.error) {
      out.push(el("p", { class: "empty muted", text: "⚠ " + siteView.error }));
    }
    box.replaceChildren(...out);
    const coordinated = rows.filter((s) => s.coordinator).length;
    $("sites-info").textContent = rows.length
      ? "· " + rows.length + (rows.length === 1 ? " site" : " sites") + " · " + coordinated + " coordinating cut off"
      : "";
  }

  function sitesShown() {
    return siteView.onScreen && !document.hidden;
  }

  // --- events ------------------------------------------------------------------------------

  function renderEvents(snap) {
    const filter = $("event-filter");
    const kinds = new Set((snap.events || []).map((e) => e.kind));
    for (const kind of [...kinds].sort()) {
      if (![...filter.options].some((o) => o.value === "kind:" + kind)) {
        filter.append(el("option", { value: "kind:" + kind, text: EVENT_LABELS[kind] || kind }));
      }
    }
    const chosen = filter.value;
    const events = (snap.events || [])
      .filter((e) =>
        !chosen ? true : chosen === "notable" ? !ROUTINE_EVENTS.has(e.kind) : "kind:" + e.kind === chosen,
      )
      .slice()
      .reverse(); // newest first
    const list = $("events");
    if (!events.length) {
      list.replaceChildren(el("li", { class: "empty", text: chosen ? "No such event kept." : "No events yet." }));
    } else {
      list.replaceChildren(
        ...events.map((e) =>
          el(
            "li",
            { "data-kind": e.kind },
            el("time", { text: fmtTime(e.at), dateTime: new Date(e.at * 1000).toISOString() }),
            el("span", { class: "kind", "data-kind": e.kind, text: EVENT_LABELS[e.kind] || e.kind }),
            eventDetail(e),
          ),
        ),
      );
    }
    drawStrip(snap);
  }

  // A service event's reason (manual, load, forecast) comes first, as a chip.
  function eventDetail(e) {
    const parsed = SERVICE_EVENT_KINDS.has(e.kind) ? scaleReason(e.detail) : null;
    if (!parsed) return el("span", { class: "detail", text: e.detail });
    return el(
      "span",
      { class: "detail" },
      el("span", { class: "why", "data-why": parsed.why, text: parsed.why }),
      " " + parsed.service + ": " + arrows(parsed.rest),
    );
  }

  function drawStrip(snap) {
    const c = prepare($("strip"));
    if (!c) return;
    const { ctx, width, height } = c;
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

  // --- all of it ---------------------------------------------------------------------------

  function render(snap) {
    const began = performance.now();
    renderHeader(snap);
    renderFleet(snap);
    renderNodes(snap);
    renderEvents(snap);
    serviceEvents(snap);
    if (serviceView.selected) drawServiceChart(); // (its right edge is now)
    $("updated").textContent = "updated " + fmtTime(snap.at);
    // how long the last snapshot took to render, for bench/bench_dashboard.py
    document.body.dataset.renderMs = (performance.now() - began).toFixed(2);
  }

  function debounce(fn, ms) {
    let timer = null;
    return () => {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    };
  }

  function wire() {
    $("mode-select").addEventListener("change", (e) => switchPolicy("mode", e.target.value));
    $("tidal-select").addEventListener("change", (e) => switchPolicy("tidal_profile", e.target.value));
    for (const form of document.querySelectorAll("form")) {
      if (form.id !== "token-form") form.addEventListener("submit", (e) => e.preventDefault());
    }
    $("token-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const value = $("token-input").value.trim();
      if (!value) return;
      token = value;
      sessionStorage.setItem(TOKEN_KEY, value);
      $("token-input").value = "";
      backoff = BACKOFF_MIN_MS;
      connect();
      resetTaskPages();
      loadServices();
      loadSites();
    });
    // nodes: filter and pages (client-side: the stream holds every node)
    const nodesAgain = () => lastSnapshot && renderNodes(lastSnapshot);
    $("node-filter").addEventListener("input", () => {
      nodeView.text = $("node-filter").value.trim();
      nodeView.page = 0;
      nodesAgain();
    });
    $("node-state").addEventListener("change", () => {
      nodeView.state = $("node-state").value;
      nodeView.page = 0;
      nodesAgain();
    });
    $("nodes-prev").addEventListener("click", () => {
      nodeView.page = Math.max(0, nodeView.page - 1);
      nodesAgain();
    });
    $("nodes-next").addEventListener("click", () => {
      nodeView.page += 1;
      nodesAgain();
    });
    $("node-detail-close").addEventListener("click", () => {
      nodeView.selected = null;
      $("node-detail").hidden = true;
      nodesAgain();
    });
    $("node-show-tasks").addEventListener("click", () => {
      taskView.node = nodeView.selected || "";
      $("task-node").value = taskView.node;
      resetTaskPages();
      $("tasks-h").scrollIntoView();
    });
    // tasks: filters and pages (server-side)
    const typed = debounce(() => {
      taskView.prefix = $("task-prefix").value.trim();
      taskView.node = $("task-node").value.trim();
      resetTaskPages();
    }, 250);
    $("task-prefix").addEventListener("input", typed);
    $("task-node").addEventListener("input", typed);
    for (const id of ["task-phase", "task-origin"]) {
      $(id).addEventListener("change", () => {
        taskView.phase = $("task-phase").value;
        taskView.origin = $("task-origin").value;
        resetTaskPages();
      });
    }
    $("tasks-prev").addEventListener("click", () => {
      if (taskView.page === 0) return;
      taskView.page -= 1;
      loadTasks();
    });
    $("tasks-next").addEventListener("click", () => {
      if (!taskView.next) return;
      taskView.cursors[taskView.page + 1] = taskView.next;
      taskView.page += 1;
      loadTasks();
    });
    $("task-detail-close").addEventListener("click", () => {
      taskView.selected = null;
      $("task-detail").hidden = true;
      renderTasks();
    });
    $("task-logs-load").addEventListener("click", loadTaskLogs);
    $("event-filter").addEventListener("change", () => lastSnapshot && renderEvents(lastSnapshot));
    $("service-detail-close").addEventListener("click", closeService);
    if ("IntersectionObserver" in window) {
      new IntersectionObserver((entries) => {
        const shown = entries.some((e) => e.isIntersecting);
        const was = serviceView.onScreen;
        serviceView.onScreen = shown;
        if (shown && !was && lastSnapshot) loadServices(); // scrolled back to: fresh at once
      }).observe($("services-section"));
    }
    if ("IntersectionObserver" in window) {
      new IntersectionObserver((entries) => {
        const shown = entries.some((e) => e.isIntersecting);
        const was = siteView.onScreen;
        siteView.onScreen = shown;
        if (shown && !was && lastSnapshot) loadSites();
      }).observe($("sites-section"));
    }
  }

  function start() {
    token = readToken();
    wire();
    window.addEventListener("hashchange", () => {
      const fresh = readToken();
      if (fresh && fresh !== token) {
        token = fresh;
        backoff = BACKOFF_MIN_MS;
        connect();
        resetTaskPages();
        loadServices();
        loadSites();
      }
    });
    window.addEventListener("resize", () => lastSnapshot && render(lastSnapshot));
    setInterval(pollTelemetry, TELEMETRY_POLL_MS);
    setInterval(() => {
      const live = source !== null && staleSince === null && lastSnapshot !== null;
      if (live && !document.hidden && !taskView.busy) loadTasks();
    }, TASKS_REFRESH_MS);
    setInterval(loadFleet, FLEET_POLL_MS);
    setInterval(() => {
      const live = source !== null && staleSince === null && lastSnapshot !== null;
      if (live && servicesShown() && !serviceView.busy) loadServices();
    }, SERVICES_REFRESH_MS);
    setInterval(() => {
      const live = source !== null && staleSince === null && lastSnapshot !== null;
      if (live && sitesShown()) loadSites();
    }, SITES_REFRESH_MS);
    setInterval(() => {
      // a stream that went quiet without an error (a proxy holding it) is stale too
      if (lastSnapshot !== null && staleSince === null && Date.now() - lastSnapshotAt > STALE_AFTER_MS) {
        setLink("error", "no snapshot for " + Math.round((Date.now() - lastSnapshotAt) / 1000) + " s");
      }
    }, 1000);
    connect();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

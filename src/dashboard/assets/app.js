// sandbox-gateway dashboard: the page's whole behaviour. It calls the gateway's e2b API with
// the session cookie and the CSRF token of this page, and a sandbox's envd through the data
// plane (Connect, JSON codec) for the terminal. Text from sandboxes only ever goes into the
// page as text (textContent), never as markup.
"use strict";

const csrf = document.querySelector('meta[name="dashboard-csrf"]').content;
const isAdmin = document.querySelector('meta[name="dashboard-admin"]').content === "true";
const LIST_EVERY = 400;
const METRICS_EVERY = 2000;
const LOGS_EVERY = 1000;
const SPARK_POINTS = 30;
// What the page keeps of a log, and the largest message it takes from a sandbox's envd.
const MAX_LOG_LINES = 5000;
const MAX_FRAME = 4 << 20;

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
  return (await apiResponse(method, path, body)).data;
}

// The answer's JSON and its page token (`x-next-token`), if it has one.
async function apiResponse(method, path, body) {
  const init = { method, headers: { "x-dashboard-csrf": csrf }, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401) {
    // The session expired (or was ended elsewhere): back to the sign-in page.
    window.location.assign("/dashboard");
    throw new ApiError(401, "signed out");
  }
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    data = null;
  }
  if (!res.ok) {
    throw new ApiError(res.status, (data && data.message) || text || res.statusText);
  }
  return { data, next: res.headers.get("x-next-token") };
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function mib(bytes) {
  return `${Math.round(bytes / 1048576)} MiB`;
}

function say(id, text, bad) {
  const p = document.getElementById(id);
  p.textContent = text;
  p.classList.toggle("error", !!bad);
}

// ---- tabs ----

const loaders = {};
for (const b of document.querySelectorAll("nav.tabs button")) {
  b.addEventListener("click", () => {
    for (const o of document.querySelectorAll("nav.tabs button")) o.classList.toggle("on", o === b);
    for (const s of document.querySelectorAll("section.tab")) {
      s.classList.toggle("on", s.id === `tab-${b.dataset.tab}`);
    }
    if (loaders[b.dataset.tab]) loaders[b.dataset.tab]();
  });
}

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/dashboard/logout", { method: "POST", headers: { "x-dashboard-csrf": csrf } });
  window.location.assign("/dashboard");
});

// ---- sandboxes ----

const rows = new Map(); // sandboxID -> {tr, cells, data, spark: [{cpu, mem}]}

function sparkline(points) {
  // Two polylines in one small SVG: CPU % (of 100) and memory (of its total).
  const w = 120;
  const h = 28;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("class", "spark");
  const line = (values, cls) => {
    if (values.length === 0) return;
    const step = values.length > 1 ? w / (SPARK_POINTS - 1) : 0;
    const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(h - 1 - v * (h - 2)).toFixed(1)}`);
    const pl = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    pl.setAttribute("points", pts.join(" "));
    pl.setAttribute("class", cls);
    svg.append(pl);
  };
  line(points.map((p) => Math.min(1, p.cpu / 100)), "cpu");
  line(points.map((p) => Math.min(1, p.mem)), "mem");
  return svg;
}

function actionButton(label, title, run) {
  return el("button", {
    title,
    onclick: async (ev) => {
      const b = ev.currentTarget;
      b.disabled = true;
      try {
        await run();
        say("sandboxes-status", `${label}: done`);
      } catch (e) {
        say("sandboxes-status", `${label} failed: ${e.message}`, true);
      } finally {
        b.disabled = false;
        refreshSandboxes();
      }
    },
  }, label);
}

function renderRow(s) {
  let row = rows.get(s.sandboxID);
  if (!row) {
    const id = s.sandboxID;
    const cells = {};
    const tr = el("tr", { "data-sandbox": id });
    for (const name of ["id", "template", "state", "node", "age", "ends", "metadata", "usage", "actions"]) {
      cells[name] = el("td", { class: name });
      tr.append(cells[name]);
    }
    cells.id.append(el("code", {}, id));
    cells.actions.append(
      actionButton("Pause", "pause (memory and files kept)", () => api("POST", `/sandboxes/${id}/pause`)),
      actionButton("Resume", "resume a paused sandbox", () =>
        api("POST", `/sandboxes/${id}/resume`, { timeout: 300, autoPause: false })),
      actionButton("+5 min", "extend the timeout by five minutes from now", () => {
        const left = Math.max(0, (new Date(rows.get(id).data.endAt) - Date.now()) / 1000);
        return api("POST", `/sandboxes/${id}/timeout`, { timeout: Math.ceil(left) + 300 });
      }),
      actionButton("Kill", "kill the sandbox", async () => {
        if (!window.confirm(`Kill ${id}? Its files and processes are gone for good.`)) return;
        if (detail && detail.id === id) closeDetail();
        await api("DELETE", `/sandboxes/${id}`);
      }),
      el("button", { title: "follow logs and open a terminal", onclick: () => openDetail(id) }, "Open"),
    );
    row = { tr, cells, data: s, spark: [] };
    rows.set(id, row);
    document.querySelector("#sandboxes tbody").append(tr);
  }
  row.data = s;
  const c = row.cells;
  c.template.textContent = s.alias || s.templateID;
  c.state.textContent = s.state;
  c.state.className = `state ${s.state}`;
  c.node.textContent = s.clientID;
  c.age.textContent = duration(Date.now() - new Date(s.startedAt));
  c.ends.textContent = duration(new Date(s.endAt) - Date.now());
  c.metadata.textContent = Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(" ");
  for (const b of c.actions.querySelectorAll("button")) {
    if (b.textContent === "Pause") b.hidden = s.state !== "running";
    if (b.textContent === "Resume") b.hidden = s.state !== "paused";
  }
}

let listing = false;
async function refreshSandboxes() {
  if (listing) return;
  listing = true;
  try {
    const list = [];
    let next = null;
    // A page at a time (100 is the API's most), as far as ten pages.
    for (let pages = 0; pages < 10; pages += 1) {
      const q = `state=running,paused&limit=100${next ? `&nextToken=${encodeURIComponent(next)}` : ""}`;
      const res = await apiResponse("GET", `/v2/sandboxes?${q}`);
      list.push(...res.data);
      next = res.next;
      if (!next) break;
    }
    const seen = new Set();
    for (const s of list) {
      seen.add(s.sandboxID);
      renderRow(s);
    }
    for (const [id, row] of rows) {
      if (!seen.has(id)) {
        row.tr.remove();
        rows.delete(id);
      }
    }
    say("sandboxes-status", `${list.length} sandbox${list.length === 1 ? "" : "es"}`);
  } catch (e) {
    if (e.status !== 401) say("sandboxes-status", `listing failed: ${e.message}`, true);
  } finally {
    listing = false;
  }
}

async function refreshMetrics() {
  const ids = [...rows.keys()].filter((id) => rows.get(id).data.state === "running").slice(0, 100);
  if (ids.length === 0) return;
  try {
    const got = await api("GET", `/sandboxes/metrics?sandbox_ids=${ids.map(encodeURIComponent).join(",")}`);
    for (const [id, m] of Object.entries(got.sandboxes || {})) {
      const row = rows.get(id);
      if (!row) continue;
      row.spark.push({ cpu: m.cpuUsedPct, mem: m.memTotal ? m.memUsed / m.memTotal : 0 });
      if (row.spark.length > SPARK_POINTS) row.spark.shift();
      const cell = row.cells.usage;
      cell.replaceChildren(
        sparkline(row.spark),
        el("span", { class: "figures" }, `${m.cpuUsedPct.toFixed(1)} % · ${mib(m.memUsed)}`),
      );
    }
  } catch (_) {
    // Metrics are a nicety; the list says what is wrong.
  }
}

// ---- one sandbox: logs and terminal ----

let detail = null; // {id, logTimer, cursor, seen, term}

function closeDetail() {
  if (!detail) return;
  clearInterval(detail.logTimer);
  if (detail.term) detail.term.close();
  detail = null;
  document.getElementById("detail").hidden = true;
}

document.getElementById("detail-close").addEventListener("click", closeDetail);

function openDetail(id) {
  closeDetail();
  document.getElementById("detail").hidden = false;
  document.getElementById("detail-title").textContent = id;
  document.getElementById("logs").textContent = "";
  detail = { id, cursor: null, seen: new Set(), term: null };
  followLogs();
  detail.logTimer = setInterval(followLogs, LOGS_EVERY);
  detail.term = new Terminal(id, document.getElementById("terminal"));
  detail.term.open();
}

async function followLogs() {
  const d = detail;
  if (!d) return;
  const q = d.cursor === null ? "limit=1000" : `cursor=${d.cursor}&direction=forward&limit=1000`;
  try {
    const got = await api("GET", `/v2/sandboxes/${d.id}/logs?${q}`);
    if (d !== detail) return;
    const pre = document.getElementById("logs");
    for (const e of got.logs || []) {
      // The cursor asks again from the newest entry's millisecond: what was shown at that
      // millisecond is remembered, and only that.
      const at = new Date(e.timestamp).getTime();
      const key = `${e.timestamp}|${e.message}`;
      if (at === d.cursor && d.seen.has(key)) continue;
      if (at !== d.cursor) {
        d.cursor = Math.max(d.cursor || 0, at);
        d.seen = new Set();
      }
      d.seen.add(key);
      const fields = Object.entries(e.fields || {}).map(([k, v]) => ` ${k}=${v}`).join("");
      pre.append(el("div", { class: `log ${e.level}` }, `${e.timestamp} ${e.level} ${e.message}${fields}`));
    }
    while (pre.childElementCount > MAX_LOG_LINES) pre.firstElementChild.remove();
    pre.scrollTop = pre.scrollHeight;
  } catch (e) {
    if (d === detail && e.status !== 401) {
      document.getElementById("logs").append(el("div", { class: "log error" }, `logs: ${e.message}`));
      clearInterval(d.logTimer);
    }
  }
}

// A terminal of our own: a shell on a pty in the sandbox, started through envd's Connect API
// (process.Process/Start, a server stream) and fed with SendInput. The screen handles what a
// shell prompt and line editing need (text, CR, LF, backspace, clear to end of line, bell) and
// drops other escape sequences.
class Terminal {
  constructor(id, screen) {
    this.id = id;
    this.screen = screen;
    this.lines = [""];
    this.col = 0;
    this.pid = null;
    this.token = null;
    this.abort = new AbortController();
    this.pending = "";
    this.escape = null;
    this.decoder = new TextDecoder();
    this.onKey = (ev) => this.key(ev);
  }

  status(text) {
    document.getElementById("terminal-status").textContent = text;
  }

  envd(path, body, extra) {
    return fetch(path, {
      method: "POST",
      signal: this.abort.signal,
      headers: {
        "e2b-sandbox-id": this.id,
        "x-access-token": this.token,
        "connect-protocol-version": "1",
        ...extra,
      },
      body,
    });
  }

  async open() {
    this.screen.textContent = "";
    this.status("connecting…");
    try {
      const info = await api("GET", `/sandboxes/${this.id}`);
      this.token = info.envdAccessToken;
      const msg = new TextEncoder().encode(JSON.stringify({
        process: { cmd: "/bin/bash", args: ["-l", "-i"], envs: { TERM: "dumb" } },
        pty: { size: { cols: 100, rows: 30 } },
      }));
      const frame = new Uint8Array(5 + msg.length);
      new DataView(frame.buffer).setUint32(1, msg.length);
      frame.set(msg, 5);
      const res = await this.envd("/process.Process/Start", frame, {
        "content-type": "application/connect+json",
      });
      if (!res.ok) throw new Error(`the sandbox answered ${res.status}: ${await res.text()}`);
      this.screen.addEventListener("keydown", this.onKey);
      this.status("connected: click the terminal and type");
      await this.read(res.body.getReader());
      this.status("the shell ended");
    } catch (e) {
      if (e.name !== "AbortError") this.status(`terminal: ${e.message}`);
    }
  }

  async read(reader) {
    let buf = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const joined = new Uint8Array(buf.length + value.length);
      joined.set(buf);
      joined.set(value, buf.length);
      buf = joined;
      while (buf.length >= 5) {
        const flags = buf[0];
        const len = new DataView(buf.buffer, buf.byteOffset + 1, 4).getUint32(0);
        if (len > MAX_FRAME) throw new Error(`the sandbox sent a message of ${len} bytes`);
        if (buf.length < 5 + len) break;
        const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + len)));
        buf = buf.slice(5 + len);
        if (flags & 2) {
          if (msg.error) this.status(`terminal: ${msg.error.message || msg.error.code}`);
          return;
        }
        const ev = msg.event || {};
        if (ev.start) this.pid = ev.start.pid;
        if (ev.data && ev.data.pty) {
          const bytes = Uint8Array.from(atob(ev.data.pty), (c) => c.charCodeAt(0));
          this.write(this.decoder.decode(bytes, { stream: true }));
        }
        if (ev.end) return;
      }
    }
  }

  write(text) {
    for (const ch of text) {
      if (this.escape !== null) {
        // ESC [ … final byte (CSI), ESC ] … BEL (OSC), or ESC and one character.
        this.escape += ch;
        const kind = this.escape[0];
        const ended = kind === "[" ? this.escape.length > 1 && ch >= "@" && ch <= "~"
          : kind === "]" ? ch === "\x07" || this.escape.endsWith("\x1b\\")
          : true;
        if (ended) {
          if (kind === "[" && ch === "K") {
            const last = this.lines.length - 1;
            this.lines[last] = this.lines[last].slice(0, this.col);
          }
          this.escape = null;
        }
        continue;
      }
      const last = this.lines.length - 1;
      if (ch === "\x1b") this.escape = "";
      else if (ch === "\r") this.col = 0;
      else if (ch === "\n") {
        this.lines.push("");
        this.col = 0;
      } else if (ch === "\b") this.col = Math.max(0, this.col - 1);
      else if (ch === "\x07") continue;
      else if (ch >= " ") {
        const line = this.lines[last].padEnd(this.col, " ");
        this.lines[last] = line.slice(0, this.col) + ch + line.slice(this.col + 1);
        this.col += 1;
      }
    }
    if (this.lines.length > 2000) this.lines.splice(0, this.lines.length - 2000);
    this.screen.textContent = this.lines.join("\n");
    this.screen.scrollTop = this.screen.scrollHeight;
  }

  key(ev) {
    if (this.pid === null) return;
    let s = null;
    if (ev.key === "Enter") s = "\r";
    else if (ev.key === "Backspace") s = "\x7f";
    else if (ev.key === "Tab") s = "\t";
    else if (ev.key === "Escape") s = "\x1b";
    else if (ev.ctrlKey && ev.key.length === 1) s = String.fromCharCode(ev.key.toUpperCase().charCodeAt(0) - 64);
    else if (ev.key.length === 1) s = ev.key;
    if (s === null) return;
    ev.preventDefault();
    this.send(s);
  }

  send(text) {
    const bytes = new TextEncoder().encode(text);
    const b64 = btoa(String.fromCharCode(...bytes));
    // Keystrokes go in order: each waits for the one before it.
    this.queue = (this.queue || Promise.resolve()).then(() =>
      this.envd("/process.Process/SendInput",
        JSON.stringify({ process: { pid: this.pid }, input: { pty: b64 } }),
        { "content-type": "application/json" })
        .then((r) => { if (!r.ok) this.status(`input refused: ${r.status}`); })
        .catch(() => {}));
  }

  close() {
    this.screen.removeEventListener("keydown", this.onKey);
    if (this.pid !== null && this.token) {
      // The shell goes with the terminal.
      fetch("/process.Process/SendSignal", {
        method: "POST",
        headers: {
          "e2b-sandbox-id": this.id,
          "x-access-token": this.token,
          "connect-protocol-version": "1",
          "content-type": "application/json",
        },
        body: JSON.stringify({ process: { pid: this.pid }, signal: "SIGNAL_SIGKILL" }),
      }).catch(() => {});
    }
    this.abort.abort();
  }
}

// ---- templates and their builds ----

loaders.templates = async () => {
  const tbody = document.querySelector("#templates tbody");
  try {
    const list = await api("GET", "/v2/templates");
    tbody.replaceChildren(...list.map((t) => el("tr", { "data-template": t.templateID },
      el("td", {}, el("code", {}, t.templateID)),
      el("td", {}, (t.aliases || []).join(", ")),
      el("td", {}, t.buildCount),
      el("td", {}, t.public ? "yes" : "no"),
      el("td", {}, t.updatedAt),
      el("td", {}, el("button", { onclick: () => showBuilds(t.templateID) }, "Builds")),
    )));
  } catch (e) {
    tbody.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "error" }, e.message)));
  }
};

let buildTimer = null;
async function showBuilds(id) {
  clearTimeout(buildTimer);
  const box = document.getElementById("build");
  const pre = document.getElementById("build-logs");
  box.hidden = false;
  pre.textContent = "";
  let t;
  try {
    t = await api("GET", `/templates/${encodeURIComponent(id)}`);
  } catch (e) {
    document.getElementById("build-title").textContent = `${id}: ${e.message}`;
    return;
  }
  const builds = t.builds || [];
  if (builds.length === 0) {
    document.getElementById("build-title").textContent = `${id}: no builds (made by a node)`;
    return;
  }
  const last = builds[builds.length - 1];
  let offset = 0;
  const poll = async () => {
    try {
      const s = await api("GET",
        `/templates/${encodeURIComponent(id)}/builds/${encodeURIComponent(last.buildID)}/status?logsOffset=${offset}`);
      document.getElementById("build-title").textContent = `${id} build ${last.buildID}: ${s.status}`;
      for (const e of s.logEntries || []) {
        pre.append(el("div", { class: `log ${e.level}` }, `${e.timestamp} ${e.level} ${e.message}`));
      }
      offset += (s.logEntries || []).length;
      if (s.status === "building" || s.status === "waiting") buildTimer = setTimeout(poll, 1000);
    } catch (e) {
      pre.append(el("div", { class: "log error" }, e.message));
    }
  };
  poll();
}

// ---- snapshots ----

loaders.snapshots = async () => {
  const tbody = document.querySelector("#snapshots tbody");
  try {
    const list = await api("GET", "/snapshots?limit=100");
    tbody.replaceChildren(...list.map((s) => el("tr", {},
      el("td", {}, el("code", {}, s.snapshotID)),
      el("td", {}, s.sandboxID || ""),
      el("td", {}, (s.names || []).join(", ")),
    )));
  } catch (e) {
    tbody.replaceChildren(el("tr", {}, el("td", { colspan: 3, class: "error" }, e.message)));
  }
};

// ---- nodes and pools (admins) ----

if (isAdmin) {
  loaders.fleet = async () => {
    const tbody = document.querySelector("#fleet tbody");
    try {
      const got = await api("GET", "/dashboard/api/fleet");
      tbody.replaceChildren(...got.nodes.map((n) => el("tr", { "data-node": n.name || n.address },
        el("td", {}, n.name || "?"),
        el("td", {}, el("code", {}, n.address)),
        el("td", { class: n.up ? "state running" : "state down" }, n.up ? "up" : "down"),
        el("td", {}, n.runtime || ""),
        el("td", {}, n.claimed ?? ""),
        el("td", {}, n.paused ?? ""),
        el("td", {}, n.checkpoints ?? ""),
        el("td", {}, n.pools.map((p) => `${p.pool} ${p.warm}/${p.target}`).join(", ")),
      )));
    } catch (e) {
      tbody.replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "error" }, e.message)));
    }
  };
}

refreshSandboxes();
setInterval(refreshSandboxes, LIST_EVERY);
setInterval(refreshMetrics, METRICS_EVERY);

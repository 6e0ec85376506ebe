// tensorlane dashboard: plain JS, no dependencies. Polls the JSON API and
// redraws; the topology picture is SVG rendered by the server.
"use strict";
const $ = (s) => document.querySelector(s);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
function bytes(n) {
  if (n < 1024) return n + " B";
  const u = "KMGTPE"; let i = -1;
  do { n /= 1024; i++; } while (n >= 1024 && i < u.length - 1);
  return n.toFixed(1) + " " + u[i] + "iB";
}
function dur(ns) {
  if (ns < 1e3) return ns + " ns";
  if (ns < 1e6) return (ns / 1e3).toFixed(1) + " µs";
  if (ns < 1e9) return (ns / 1e6).toFixed(1) + " ms";
  return (ns / 1e9).toFixed(2) + " s";
}
async function get(path, text) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return text ? r.text() : r.json();
}
function rows(sel, html) { $(sel + " tbody").innerHTML = html.join(""); }

let colors = {};
async function loadInfo() {
  const info = await get("/api/info");
  $("#title").textContent = info.title;
  document.title = info.title;
  $("#summary").textContent = `${info.hosts} hosts · ${info.devices} devices · runtimes on ${(info.runtimes || []).join(", ") || "none"}`;
  $("#simulated").hidden = !info.simulated;
  $("#pprof-link").hidden = !info.pprof;
  const topo = await get("/api/topology");
  colors = topo.colors || {};
  $("#legend").innerHTML = Object.entries(colors).map(([k, c]) => `<span><i style="background:${esc(c)}"></i>${esc(k)}</span>`).join("");
  rows("#domains", (topo.domains || []).map((d) =>
    `<tr><td>${esc(d.kind)}</td><td>${esc(d.name)}</td><td>${esc(d.link)}</td><td>${esc((d.hosts || []).join(", "))}</td><td class="num">${(d.devices || []).length}</td></tr>`));
}

async function loadPicture() {
  const svg = await get("/api/topology.svg", true);
  const pic = $("#picture");
  const old = pic.querySelector("svg#topology");
  const tmp = document.createElement("div");
  tmp.innerHTML = svg;
  const fresh = tmp.querySelector("svg");
  if (old) old.replaceWith(fresh); else pic.insertBefore(fresh, $("#overlay"));
}

// Arrows on the picture for live transfers and those that ended in the
// last 30 s (fading with age), from the object's device to the reader's, so
// a capture of the page shows where bytes flow even between bursts.
const arrowWindow = 30000;
function drawOverlay(live, recent) {
  const pic = $("#picture"), svg = pic.querySelector("svg#topology"), ov = $("#overlay");
  if (!svg) return;
  const box = pic.getBoundingClientRect();
  ov.setAttribute("width", svg.clientWidth); ov.setAttribute("height", svg.clientHeight);
  const centre = (ep) => {
    const el = svg.querySelector(`g[data-ep="${CSS.escape(ep)}"] rect`);
    if (!el) return null;
    const r = el.getBoundingClientRect();
    return [r.left - box.left + pic.scrollLeft + r.width / 2, r.top - box.top + r.height / 2];
  };
  svg.querySelectorAll("g.device.active").forEach((g) => g.classList.remove("active"));
  const now = Date.now();
  const age = (t) => t.live ? 0 : Math.max(0, now - Date.parse(t.start) - t.duration_ns / 1e6);
  const shown = live.concat(recent.filter((t) => age(t) < arrowWindow)).slice(0, 60);
  const marks = Object.entries(pathColors).concat([["error", "#c0392b"], ["other", "#d97706"]]);
  let out = `<defs>${marks.map(([p, c]) => `<marker id="arrow-${p}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" fill="${c}"/></marker>`).join("")}</defs>`;
  const seen = new Set();
  for (const t of shown) {
    const key = t.src + ">" + t.dst;
    if (seen.has(key)) continue;
    seen.add(key);
    const a = centre(t.src), b = centre(t.dst);
    for (const ep of [t.src, t.dst]) { const g = svg.querySelector(`g[data-ep="${CSS.escape(ep)}"]`); if (g) g.classList.add("active"); }
    if (!a || !b || (a[0] === b[0] && a[1] === b[1])) continue;
    const col = t.error ? "#c0392b" : (pathColors[t.path] || "#d97706");
    const op = t.live ? 0.95 : Math.max(0.25, 0.9 - 0.65 * age(t) / arrowWindow);
    const mx = (a[0] + b[0]) / 2, my = Math.min(a[1], b[1]) - 30 - Math.abs(a[1] - b[1]) / 4;
    out += `<path class="xfer${t.live ? " live" : ""}" data-path="${esc(t.path)}" d="M${a[0]} ${a[1]} Q${mx} ${my} ${b[0]} ${b[1]}" fill="none" stroke="${col}" stroke-width="3" opacity="${op.toFixed(2)}" marker-end="url(#arrow-${t.error ? "error" : pathColors[t.path] ? esc(t.path) : "other"})"><title>${esc(t.path)} ${esc(bytes(t.bytes))} ${esc(t.src)} → ${esc(t.dst)}</title></path>`;
  }
  ov.innerHTML = out;
}

// Path colours, the same in the chart, the arrows and the tables.
const pathColors = { local: "#52606d", p2p: "#4d8a00", shm: "#7c3aed", rdma: "#0071c5", tcp: "#b45309" };

// A line chart of GB/s per path over the last minute, drawn as SVG.
async function loadThroughput() {
  const tp = await get("/api/throughput");
  const W = 420, H = 220, L = 40, R = 8, T = 10, B = 24;
  const series = Object.entries(tp.gbps || {});
  let peak = 0;
  for (const [, v] of series) for (const x of v) peak = Math.max(peak, x);
  const top = peak > 0 ? niceCeil(peak) : 1;
  const n = tp.seconds || 60;
  const X = (i) => L + (W - L - R) * i / (n - 1), Y = (v) => T + (H - T - B) * (1 - v / top);
  let out = "";
  for (let k = 0; k <= 4; k++) {
    const v = top * k / 4, y = Y(v);
    out += `<line x1="${L}" x2="${W - R}" y1="${y}" y2="${y}" stroke="#e4e7eb"/><text x="${L - 4}" y="${y + 4}" text-anchor="end" font-size="10" fill="#7b8794">${v === 0 ? "0" : String(+v.toPrecision(2))}</text>`;
  }
  out += `<text x="${L}" y="${H - 6}" font-size="10" fill="#7b8794">−60 s</text><text x="${W - R}" y="${H - 6}" text-anchor="end" font-size="10" fill="#7b8794">now</text>`;
  for (const [path, v] of series) {
    const pts = v.map((x, i) => `${X(i).toFixed(1)},${Y(x).toFixed(1)}`).join(" ");
    out += `<polyline class="series" data-path="${esc(path)}" points="${pts}" fill="none" stroke="${pathColors[path] || "#1f2933"}" stroke-width="2"/>`;
  }
  if (!series.length) out += `<text x="${W / 2}" y="${H / 2}" text-anchor="middle" fill="#9aa5b1">no transfers in the last minute</text>`;
  $("#throughput").innerHTML = out;
  // The legend gives each path's mean over the last 5 complete seconds (the
  // current second is still filling).
  const recentMean = (v) => v.slice(-6, -1).reduce((a, b) => a + b, 0) / 5;
  $("#tput-legend").innerHTML = series.map(([p, v]) => `<span><i style="background:${pathColors[p] || "#1f2933"}"></i>${esc(p)} ${String(+recentMean(v).toPrecision(3))} GB/s (5 s mean)</span>`).join("");
}
function niceCeil(x) {
  const e = Math.pow(10, Math.floor(Math.log10(x))), m = x / e;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * e;
}

function notes(t) {
  let s = "";
  if (t.error) s += `<span class="tag error">${esc(t.error_kind)}</span>${esc(t.error)}`;
  if (t.fallback) s += `<span class="tag fallback">fallback</span>`;
  if (t.degraded) s += `<span class="tag degraded">degraded: best ${esc(t.best)}</span>`;
  if (t.zero_copy) s += `<span class="tag zc">zero-copy</span>`;
  return s;
}

// The newest transfers in the main table, the rest folded away: a long
// flat list would push everything else off the screen.
const shownRecent = 10;
function recentRow(t) {
  const cls = ["transfer", t.error ? "error" : "", t.fallback ? "fallback" : "", t.degraded ? "degraded" : ""].join(" ");
  const rate = t.gbps ? t.gbps.toFixed(2) + " GB/s" : "";
  return `<tr class="${cls}" data-path="${esc(t.path)}"><td>${new Date(t.start).toLocaleTimeString()}</td><td>${esc(t.reader)}</td><td>${esc(t.src)} → ${esc(t.dst)}</td><td class="path ${esc(t.path)}">${esc(t.path || "—")}</td><td>${esc(t.best)}</td><td class="num">${bytes(t.bytes)}</td><td class="num">${dur(t.duration_ns)}</td><td class="num">${rate}</td><td class="notes">${notes(t)}</td></tr>`;
}
async function loadTransfers() {
  const x = await get("/api/transfers?limit=60");
  $("#xfer-totals").textContent = `— last ${x.recent.length}: ${x.errors} errors, ${x.fallbacks} fallbacks, ${x.degraded} degraded`;
  rows("#live", x.live.map((t) => `<tr class="live"><td>${esc(t.reader)}</td><td>${esc(t.src)} → ${esc(t.dst)}</td><td class="num">${bytes(t.bytes)}</td><td class="num">${dur(t.duration_ns)}</td></tr>`));
  if (!x.live.length) rows("#live", [`<tr><td colspan="4" class="none">none right now</td></tr>`]);
  rows("#recent", x.recent.slice(0, shownRecent).map(recentRow));
  rows("#older", x.recent.slice(shownRecent).map(recentRow));
  $("#more-recent summary").textContent = `${Math.max(0, x.recent.length - shownRecent)} older transfers`;
  drawOverlay(x.live, x.recent);
}

async function loadTables() {
  const mem = await get("/api/memory");
  rows("#memory", mem.filter((m) => m.used > 0 || m.capacity > 0).map((m) => {
    const pct = m.capacity ? (100 * m.used / m.capacity) : 0;
    return `<tr><td>${esc(m.host)}</td><td>${esc(m.device)}${m.simulated ? ' <span class="badge sim">simulated</span>' : ""}</td><td class="num">${bytes(m.used)}</td><td><div class="bar"><div style="width:${pct.toFixed(2)}%"></div></div></td><td class="num">${m.capacity ? bytes(m.capacity) : "unbounded"}</td><td class="num">${m.allocs}</td><td class="num">${bytes(m.peak)}</td></tr>`;
  }));
  const objs = await get("/api/objects");
  rows("#objects", objs.map((o) => `<tr><td>${esc(o.host)}</td><td>${esc(o.id)}</td><td>${esc(o.owner)}</td><td>${esc(o.device)}</td><td>${esc(o.dtype)}</td><td>[${esc((o.shape || []).join(", "))}]</td><td class="num">${bytes(o.bytes)}</td><td class="num">${o.pins}</td></tr>`));
  const links = await get("/api/links");
  if (Array.isArray(links) && links.length) {
    const keys = Object.keys(links[0]);
    $("#links").innerHTML = `<table><thead><tr>${keys.map((k) => `<th>${esc(k)}</th>`).join("")}</tr></thead><tbody>${links.map((l) => `<tr class="${l.degraded ? "degraded" : ""}">${keys.map((k) => `<td>${esc(typeof l[k] === "object" ? JSON.stringify(l[k]) : l[k])}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
  }
  const pl = await get("/api/placements");
  if (pl !== null) { $("#placements").textContent = JSON.stringify(pl, null, 2); $("#placements").classList.remove("none"); }
}

let tick = 0;
async function refresh() {
  try {
    if (tick % 3 === 0) await loadPicture();
    await loadTransfers();
    await loadThroughput();
    await loadTables();
    $("#status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("#status").textContent = "error: " + e.message;
  }
  tick++;
  setTimeout(refresh, 1000);
}
loadInfo().then(refresh, (e) => { $("#status").textContent = "error: " + e.message; refresh(); });

// The job's dashboard: one page over the admin API (no build step, no
// dependencies). It polls /api/job, /api/metrics and /api/checkpoints every
// second, keeps five minutes of samples in memory for the rates and
// sparklines, and draws the graph from /api/plan.
'use strict';

const POLL_MS = 1000;
const KEEP_MS = 5 * 60 * 1000;
// Rates are taken over this much of the newest samples.
const RATE_WINDOW_MS = 3000;
// Watermarks above this are the end of time (i64::MAX, which JSON numbers
// cannot hold exactly).
const END_OF_TIME = 9.2e18;
// A watermark this far past the epoch (2001) is read as wall-clock time, so
// its lag behind the clock means something.
const WALL_CLOCK_FROM = 1e12;

const view = {
  token: null,
  plan: null,
  job: null,
  samples: [], // { at, metrics }
  checkpoints: null,
  savepoints: [],
  lastSavepointPoll: 0,
  failing: false,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else if (k === 'width') node.style.width = v; // not an attribute: the page's policy refuses inline styles
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// ---- formatting ----

function count(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(a >= 1e10 ? 1 : 2) + 'G';
  if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 1 : 2) + 'M';
  if (a >= 1e4) return (n / 1e3).toFixed(a >= 1e5 ? 0 : 1) + 'k';
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

function bytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return (i === 0 ? String(n) : n.toFixed(n >= 100 ? 0 : 1)) + ' ' + units[i];
}

function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '–';
  const a = Math.abs(ms);
  if (a < 1) return ms.toFixed(2) + ' ms';
  if (a < 1000) return ms.toFixed(0) + ' ms';
  if (a < 60000) return (ms / 1000).toFixed(1) + ' s';
  if (a < 3600000) return Math.floor(ms / 60000) + ' min ' + Math.floor((a % 60000) / 1000) + ' s';
  return Math.floor(ms / 3600000) + ' h ' + Math.floor((a % 3600000) / 60000) + ' min';
}

function clock(unixMs) {
  return new Date(unixMs).toLocaleTimeString();
}

function watermarkText(wm) {
  if (wm === null || wm === undefined) return '–';
  if (wm >= END_OF_TIME) return 'end';
  if (wm >= WALL_CLOCK_FROM) return new Date(wm).toLocaleTimeString();
  return String(wm);
}

function lagOf(wm, now) {
  if (wm === null || wm === undefined || wm >= END_OF_TIME || wm < WALL_CLOCK_FROM) return null;
  return Math.max(0, now - wm);
}

// ---- the API ----

class Unauthorized extends Error {}

async function api(path, options) {
  const opts = options || {};
  const headers = { Accept: 'application/json' };
  if (view.token) headers.Authorization = 'Bearer ' + view.token;
  if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {
    method: opts.method || 'GET',
    headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
    cache: 'no-store',
  });
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (response.status === 401) throw new Unauthorized('the token was refused');
  if (!response.ok) {
    const error = new Error((body && body.error) || response.status + ' ' + response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function showError(message) {
  const box = $('error');
  box.textContent = message;
  box.hidden = !message;
}

function askForToken() {
  $('login').hidden = false;
  $('login-token').focus();
}

// ---- samples and rates ----

function remember(metrics) {
  const now = Date.now();
  view.samples.push({ at: now, metrics });
  while (view.samples.length > 2 && view.samples[0].at < now - KEEP_MS) view.samples.shift();
}

// The sample to take a rate against: the oldest within RATE_WINDOW_MS.
function baseline() {
  const last = view.samples[view.samples.length - 1];
  if (!last) return null;
  for (const s of view.samples) {
    if (s.at >= last.at - RATE_WINDOW_MS && s !== last) return s;
  }
  return view.samples.length > 1 ? view.samples[view.samples.length - 2] : null;
}

function operatorOf(metrics, name) {
  return metrics.operators.find((o) => o.name === name);
}

function rate(read, older, newer) {
  if (!older || !newer || newer.at <= older.at) return null;
  const a = read(older.metrics);
  const b = read(newer.metrics);
  if (a === null || b === null || a === undefined || b === undefined) return null;
  return Math.max(0, ((b - a) * 1000) / (newer.at - older.at));
}

// A series over the kept samples: one point per sample after the first.
function series(read) {
  const points = [];
  for (let i = 1; i < view.samples.length; i += 1) {
    const v = rate(read, view.samples[i - 1], view.samples[i]);
    points.push({ at: view.samples[i].at, v });
  }
  return points;
}

function sparkline(points, opts) {
  const o = opts || {};
  const width = o.width || 120;
  const height = o.height || 22;
  const box = svg('svg', { width, height, viewBox: `0 0 ${width} ${height}`, class: 'spark' });
  const known = points.filter((p) => p.v !== null && p.v !== undefined);
  if (known.length < 2) return box;
  // The x axis spans what is kept: from the first sample (up to five
  // minutes ago) to now.
  const now = points[points.length - 1].at;
  const span = Math.max(1, now - points[0].at);
  const max = Math.max(...known.map((p) => p.v), 1e-9);
  const x = (at) => width - ((now - at) / span) * width;
  const y = (v) => height - 1 - (v / max) * (height - 3);
  const d = known.map((p) => `${x(p.at).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ');
  box.append(svg('polyline', { points: d, class: o.cls || 'line' }));
  box.append(svg('title', {}, `max ${o.format ? o.format(max) : count(max)}`));
  return box;
}

// ---- the graph ----

const NODE_W = 168;
const NODE_H = 58;
// Wide enough for an edge's two-line label ("44.4M/s", "44% blocked").
const GAP_X = 104;
const GAP_Y = 26;

// Whether a node is drawn: the steps that tag a two-input operator's
// inputs with their side, and their union, are drawn as that operator's
// two input edges instead.
const drawn = (n) => n.part_of === null || n.part_of === undefined;

// The edges drawn into node `n`: one per input, or for an operator of two
// inputs one per side, from what feeds that side (`tag`: the node whose
// metrics and channels are the side's).
function edgesInto(n) {
  if (n.two_inputs) {
    return n.two_inputs.filter((s) => s.from !== null).map((s) => {
      const hash = n.inputs.find((i) => i.edge === 'hash') || {};
      return Object.assign({}, hash, { from: s.from, tag: s.tag, side: s.input, edge: hash.edge || 'forward' });
    });
  }
  return n.inputs;
}

function layout(plan) {
  const nodes = plan.nodes;
  const rank = new Array(nodes.length).fill(0);
  for (const n of nodes) {
    for (const i of edgesInto(n)) rank[n.index] = Math.max(rank[n.index], rank[i.from] + 1);
  }
  const columns = [];
  for (const n of nodes.filter(drawn)) {
    (columns[rank[n.index]] = columns[rank[n.index]] || []).push(n.index);
  }
  // A rank whose only nodes are hidden leaves no empty column.
  for (let c = columns.length - 1; c >= 0; c--) if (!columns[c]) columns.splice(c, 1);
  const tallest = Math.max(...columns.map((c) => c.length));
  const height = tallest * NODE_H + (tallest - 1) * GAP_Y + 40;
  const at = new Array(nodes.length);
  columns.forEach((column, c) => {
    const used = column.length * NODE_H + (column.length - 1) * GAP_Y;
    const top = (height - used) / 2;
    column.forEach((index, r) => {
      at[index] = { x: 20 + c * (NODE_W + GAP_X), y: top + r * (NODE_H + GAP_Y) };
    });
  });
  const width = 40 + columns.length * NODE_W + (columns.length - 1) * GAP_X;
  return { at, width, height };
}

// Which tasks run an operator (a fused operator runs in its head's tasks).
function tasksRunning(metrics, name) {
  return metrics.tasks.filter((t) => t.operators.includes(name)).map((t) => t.name);
}

// The operators that send through node `index`: itself, or for a union
// (which no task lists) what feeds it.
function sendersOf(index) {
  const node = view.plan.nodes[index];
  if (node.kind !== 'union') return [node.name];
  return node.inputs.flatMap((i) => sendersOf(i.from));
}

const instanceOf = (task) => task.replace(/\[\d+\]$/, '');

// The channel edges of one graph edge: from the tasks running `from` into
// the instances of keyed node `to`.
function channelEdges(metrics, from, to) {
  const senders = new Set(sendersOf(from).flatMap((name) => tasksRunning(metrics, name)));
  return metrics.edges.filter((e) => senders.has(e.from) && instanceOf(e.to) === to);
}

// `from` is a node index, `to` a name; `tag`, for a side of a two-input
// operator, the index of the node that tags the side (whose output is
// the side's records).
function edgeNumbers(from, to, kind, tag) {
  if (tag !== undefined) {
    const numbers = edgeNumbers(tag, to, kind);
    const name = view.plan.nodes[tag].name;
    numbers.records = rate((m) => (operatorOf(m, name) || {}).records_out, baseline(), view.samples[view.samples.length - 1]);
    return numbers;
  }
  const newer = view.samples[view.samples.length - 1];
  const older = baseline();
  if (!newer) return {};
  if (kind === 'hash') {
    if (!channelEdges(newer.metrics, from, to).length) return {}; // nothing known: no number, no colour
    const sum = (m, field) => channelEdges(m, from, to).reduce((s, e) => s + e[field], 0);
    const senders = new Set(channelEdges(newer.metrics, from, to).map((e) => e.from)).size || 1;
    const blockedMsPerS = rate((m) => sum(m, 'blocked_ms'), older, newer);
    const edges = channelEdges(newer.metrics, from, to);
    const capacity = edges.reduce((s, e) => s + e.capacity, 0);
    const queued = edges.reduce((s, e) => s + e.queued, 0);
    return {
      records: rate((m) => sum(m, 'records'), older, newer),
      blocked: blockedMsPerS === null ? null : Math.min(1, blockedMsPerS / 1000 / senders),
      fill: capacity ? queued / capacity : null,
    };
  }
  return { records: rate((m) => (operatorOf(m, to) || {}).records_in, older, newer) };
}

function pressureColour(share) {
  if (share === null || share === undefined) return '#8a94a6';
  const s = Math.min(1, share * 2); // half the time blocked: red
  const hue = 130 - 130 * s;
  return `hsl(${hue.toFixed(0)}, 70%, 40%)`;
}

function drawGraph() {
  const plan = view.plan;
  const newer = view.samples[view.samples.length - 1];
  const container = $('graph');
  if (!plan || !newer) return;
  const { at, width, height } = layout(plan);
  const box = svg('svg', { viewBox: `0 0 ${width} ${height}`, width: '100%', role: 'img', 'aria-label': 'job graph' });
  box.style.maxHeight = Math.max(220, Math.min(520, height)) + 'px';
  const defs = svg('defs');
  const marker = svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' });
  marker.append(svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', fill: '#5b6577' }));
  defs.append(marker);
  box.append(defs);
  const older = baseline();
  const labels = [];
  for (const n of plan.nodes.filter(drawn)) {
    edgesInto(n).forEach((input) => {
      const from = plan.nodes[input.from];
      const a = at[from.index];
      const b = at[n.index];
      const x1 = a.x + NODE_W;
      const y1 = a.y + NODE_H / 2;
      const x2 = b.x;
      // The two sides of an operator of two inputs arrive apart.
      const y2 = b.y + NODE_H / 2 + (input.side ? (input.tag === n.two_inputs[0].tag ? -10 : 10) : 0);
      const mid = (x1 + x2) / 2;
      const numbers = edgeNumbers(from.index, n.name, input.edge, input.tag);
      const colour = input.edge === 'hash' ? pressureColour(numbers.blocked) : '#9aa3b2';
      const path = svg('path', {
        d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2 - 2} ${y2}`,
        stroke: colour,
        'stroke-width': input.edge === 'hash' ? 3.5 : 2,
        'stroke-dasharray': input.edge === 'hash' ? '' : '5 4',
        fill: 'none',
        'marker-end': 'url(#arrow)',
        class: 'edge',
        'data-from': from.name,
        'data-to': n.name,
      });
      if (input.side) path.setAttribute('data-input', input.side);
      const tip = [`${from.name} → ${n.name}${input.side ? ` (${input.side})` : ''}`, input.edge === 'hash' ? `hash(${input.key_type}) [${input.codec}]` : 'fused (no channel)'];
      if (numbers.records !== null && numbers.records !== undefined) tip.push(`${count(numbers.records)} records/s`);
      if (numbers.blocked !== null && numbers.blocked !== undefined) tip.push(`sender blocked ${(numbers.blocked * 100).toFixed(0)} % of the time`);
      if (numbers.fill !== null && numbers.fill !== undefined) tip.push(`channels ${(numbers.fill * 100).toFixed(0)} % full`);
      path.append(svg('title', {}, tip.join('\n')));
      box.append(path);
      // The rate above the edge, the blocked share below it, both in the
      // gap between the columns; drawn after the nodes, so on top.
      const lines = [];
      if (input.side) lines.push(input.side.replace(' input', ''));
      if (numbers.records !== null && numbers.records !== undefined) lines.push(count(numbers.records) + '/s');
      if (input.edge === 'hash' && numbers.blocked >= 0.01) lines.push(`${(numbers.blocked * 100).toFixed(0)}% blocked`);
      if (lines.length) {
        const text = svg('text', { x: mid, y: (y1 + y2) / 2 - 5, class: 'edge-label', 'text-anchor': 'middle', fill: colour });
        lines.forEach((line, i) => text.append(svg('tspan', { x: mid, dy: i === 0 ? 0 : 17 }, line)));
        labels.push(text);
      }
    });
  }
  for (const n of plan.nodes.filter(drawn)) {
    const p = at[n.index];
    const g = svg('g', { class: 'node' + (n.stateful ? ' stateful' : '') + (n.kind === 'source' ? ' source' : ''), 'data-operator': n.name, transform: `translate(${p.x}, ${p.y})` });
    g.append(svg('rect', { width: NODE_W, height: NODE_H, rx: 7 }));
    const name = n.name.length > 22 ? n.name.slice(0, 21) + '…' : n.name;
    g.append(svg('text', { x: 10, y: 19, class: 'node-name' }, name));
    const parallel = n.parallelism ? ` ×${n.parallelism}` : '';
    g.append(svg('text', { x: 10, y: 35, class: 'node-kind' }, n.kind + parallel));
    const o = operatorOf(newer.metrics, n.name);
    if (o) {
      const out = rate((m) => (operatorOf(m, n.name) || {}).records_out, older, newer);
      const inn = rate((m) => (operatorOf(m, n.name) || {}).records_in, older, newer);
      const shown = n.kind === 'sink' || n.outputs.length === 0 ? inn : out;
      let line = shown === null ? '' : count(shown) + '/s';
      const lag = lagOf(o.watermark_ms, Date.now());
      if (lag !== null) line += (line ? ' · ' : '') + 'lag ' + duration(lag);
      g.append(svg('text', { x: 10, y: 50, class: 'node-rate' }, line));
    }
    g.append(svg('title', {}, `${n.name} (${n.kind}, id ${n.id})${n.detail ? '\n' + n.detail : ''}`));
    box.append(g);
  }
  box.append(...labels);
  container.replaceChildren(box);
}

// ---- tables ----

function cell(text, attrs) {
  return el('td', Object.assign({ text }, attrs || {}));
}

// The busiest share of time any task headed by operator `name` spent on
// batches, over the rate window; null for an operator fused behind another.
function busyShare(name, older, newer) {
  if (!older) return null;
  const tasks = newer.metrics.tasks.filter((t) => t.operators[0] === name).map((t) => t.name);
  let busiest = null;
  for (const task of tasks) {
    const r = rate((m) => (m.tasks.find((t) => t.name === task) || {}).busy_ms, older, newer);
    if (r !== null) busiest = Math.max(busiest === null ? 0 : busiest, Math.min(1, r / 1000));
  }
  return busiest;
}

function drawOperators() {
  const newer = view.samples[view.samples.length - 1];
  if (!newer || !view.plan) return;
  const older = baseline();
  const sizes = new Map(((view.checkpoints && view.checkpoints.state) || []).map((s) => [s.operator, s]));
  const now = Date.now();
  const rows = [];
  // The steps that tag a two-input operator's sides show as its lines
  // per input instead.
  for (const n of view.plan.nodes.filter(drawn)) {
    const o = operatorOf(newer.metrics, n.name);
    if (!o) continue; // a union counts nothing
    const get = (field) => (m) => (operatorOf(m, n.name) || {})[field];
    const lag = lagOf(o.watermark_ms, now);
    const lagSeries = view.samples.map((s) => {
      const op = operatorOf(s.metrics, n.name);
      return { at: s.at, v: op ? lagOf(op.watermark_ms, s.at) : null };
    });
    const size = sizes.get(n.id);
    const busy = busyShare(n.name, older, newer);
    const row = el('tr', { 'data-operator': n.name },
      cell(n.name, { class: 'name' }),
      cell(n.kind),
      cell(n.parallelism ? String(n.parallelism) : '', {
        class: 'n',
        title: o.instances.map((i) => `#${i.instance}: ${count(i.records_in)} in, ${count(i.records_out)} out`).join('\n'),
      }),
      cell(busy === null ? '' : (busy * 100).toFixed(0) + ' %', { class: 'n' + (busy !== null && busy > 0.8 ? ' warn' : ''), 'data-field': 'busy' }),
      cell(n.kind === 'source' ? '' : count(rate(get('records_in'), older, newer)), { class: 'n', 'data-field': 'in-rate' }),
      cell(count(rate(get('records_out'), older, newer)), { class: 'n', 'data-field': 'out-rate' }),
      el('td', {}, sparkline(series(get('records_out')))),
      cell(count(o.records_out), { class: 'n', 'data-field': 'records-out', 'data-value': String(o.records_out) }),
      cell(watermarkText(o.watermark_ms), { class: 'n', 'data-field': 'watermark' }),
      cell(lag === null ? '–' : duration(lag), { class: 'n' + (lag !== null && lag > 60000 ? ' warn' : ''), 'data-field': 'lag' }),
      el('td', {}, sparkline(lagSeries, { cls: 'line lag', format: duration })),
      cell(String(o.idle_inputs), { class: 'n' }),
      cell(count(o.dropped), { class: 'n' + (o.dropped ? ' warn' : '') }),
      cell(count(o.dead_lettered), { class: 'n' + (o.dead_lettered ? ' warn' : '') }),
      cell(count(o.late), { class: 'n' + (o.late ? ' warn' : '') }),
      cell(size ? bytes(size.bytes) : (n.stateful ? '–' : ''), { class: 'n', 'data-field': 'state' }),
    );
    rows.push(row);
    // An operator of two inputs: a line per input under its own.
    (o.inputs || []).forEach((input, side) => {
      const tag = n.two_inputs && n.two_inputs[side] ? view.plan.nodes[n.two_inputs[side].tag].name : null;
      const inRate = tag === null ? null : rate((m) => (operatorOf(m, tag) || {}).records_out, older, newer);
      const parts = [`${count(inRate)}/s`, `${count(input.records_in)} in all`];
      if (side === 0 && o.matched) parts.push(`${count(o.matched)} pairs out`);
      if (input.late) parts.push(`${count(input.late)} late`);
      if (input.unmatched) parts.push(`${count(input.unmatched)} unmatched`);
      if (input.buffered !== null && input.buffered !== undefined) parts.push(`${count(input.buffered)} entries in \`${input.state}\``);
      rows.push(el('tr', { class: 'input', 'data-operator': n.name, 'data-input': input.input },
        cell(`↳ ${input.input} ← ${input.from}`, { class: 'name' }),
        el('td', { colspan: '15', text: parts.join(' · '), 'data-field': 'input' }),
      ));
    });
  }
  document.querySelector('#operators tbody').replaceChildren(...rows);
}

function drawPartitions() {
  const newer = view.samples[view.samples.length - 1];
  if (!newer) return;
  const parts = newer.metrics.tasks.filter((t) => t.source);
  const NO_END = 'this source does not say where its input ends (an endless generator without a rate, a source without offsets)';
  const lagOfPart = (p) => (p.end_position === null || p.position === null ? null : Math.max(0, p.end_position - p.position));
  const maxLag = Math.max(1, ...parts.map((t) => lagOfPart(t.source) || 0));
  const rows = parts.map((t) => {
    const p = t.source;
    const lag = lagOfPart(p);
    const bar = el('div', { class: 'bar' });
    bar.append(el('span', { width: `${lag === null ? 0 : Math.max(1, (lag / maxLag) * 100).toFixed(1)}%` }));
    return el('tr', { 'data-partition': t.name },
      cell(`${p.source} / ${p.partition}`, { class: 'name' }),
      cell(p.position === null ? '–' : String(p.position), { class: 'n' }),
      cell(p.end_position === null ? 'n/a' : String(p.end_position), { class: 'n', 'data-field': 'end', title: p.end_position === null ? NO_END : '' }),
      cell(lag === null ? 'n/a' : count(lag), { class: 'n' + (lag >= 1000 ? ' warn' : ''), 'data-field': 'lag', title: lag === null ? NO_END : '' }),
      el('td', { class: 'bar-cell' }, bar),
    );
  });
  document.querySelector('#partitions tbody').replaceChildren(...rows);
}

function drawCheckpoints() {
  const data = view.checkpoints;
  const body = document.querySelector('#checkpoints tbody');
  if (!data) {
    $('checkpoint-summary').textContent = view.job && !view.job.checkpoints ? 'this job takes no checkpoints' : '';
    body.replaceChildren();
    return;
  }
  const records = data.checkpoints;
  const completed = records.filter((r) => r.outcome === 'completed');
  const failed = records.length - completed.length;
  const last = completed[completed.length - 1];
  $('checkpoint-summary').textContent =
    `${completed.length} completed, ${failed} failed of the last ${records.length}` +
    (last ? ` · newest #${last.id}, ${duration(Date.now() - last.started_unix_ms)} ago` : '');
  // Durations of the last 40 as bars, failed in red.
  const shown = records.slice(-40);
  const width = 360;
  const height = 60;
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, width: '100%', height, class: 'bars' });
  const max = Math.max(1, ...shown.map((r) => r.duration_ms));
  const w = width / 40;
  shown.forEach((r, i) => {
    const h = Math.max(1, (r.duration_ms / max) * (height - 12));
    const bar = svg('rect', { x: i * w + 1, y: height - h, width: w - 2, height: h, class: r.outcome === 'completed' ? 'ok' : 'failed' });
    bar.append(svg('title', {}, `#${r.id} ${r.kind}: ${duration(r.duration_ms)}, ${bytes(r.bytes)}${r.error ? '\n' + r.error : ''}`));
    chart.append(bar);
  });
  chart.append(svg('text', { x: 2, y: 10, class: 'axis' }, 'max ' + duration(max)));
  $('checkpoint-chart').replaceChildren(chart);
  const rows = records.slice(-8).reverse().map((r) =>
    el('tr', { class: r.outcome },
      cell(String(r.id), { class: 'n' }),
      cell(r.kind + (r.savepoint ? ` “${r.savepoint}”` : '')),
      cell(clock(r.started_unix_ms)),
      cell(duration(r.duration_ms), { class: 'n' }),
      cell(bytes(r.bytes), { class: 'n' }),
      cell(r.outcome + (r.error ? ': ' + r.error : ''), { class: r.outcome === 'completed' ? '' : 'warn' }),
    ));
  body.replaceChildren(...rows);
}

function drawState() {
  const newer = view.samples[view.samples.length - 1];
  const checkpointed = new Map(((view.checkpoints && view.checkpoints.state) || []).map((s) => [s.operator, s]));
  const rows = [];
  if (newer && view.plan) {
    for (const n of view.plan.nodes) {
      const o = operatorOf(newer.metrics, n.name);
      if (!o || !o.state.length) continue;
      const saved = checkpointed.get(n.id);
      o.state.forEach((s, i) => {
        // Entries: the table's (fjall) when there is one, else those in memory.
        const entries = s.table_entries === null ? s.memory_entries : s.table_entries;
        const reads = s.cache_hits + s.cache_misses;
        rows.push(el('tr', { 'data-operator': n.name, 'data-state': s.state },
          cell(i === 0 ? n.name : '', { class: 'name' }),
          cell(s.state),
          cell(count(entries), { class: 'n', 'data-field': 'entries', 'data-value': String(entries) }),
          cell(bytes(s.memory_bytes), { class: 'n' }),
          cell(s.table_bytes === null ? '' : bytes(s.table_bytes), { class: 'n disk' }),
          cell(s.table_entries === null || !reads ? '' : ((s.cache_hits * 100) / reads).toFixed(1) + ' %', { class: 'n disk' }),
          cell(i === 0 && saved ? bytes(saved.bytes) : '', { class: 'n' }),
        ));
      });
    }
  }
  document.querySelector('#state tbody').replaceChildren(...rows);
  // Columns of tables on disk only when a state has one (fjall).
  const onDisk = newer && newer.metrics.operators.some((o) => o.state.some((s) => s.table_entries !== null));
  $('state').classList.toggle('no-disk', !onDisk);
  const list = view.savepoints.map((s) => el('li', { text: s.name, title: s.path }));
  if (!list.length) list.push(el('li', { class: 'muted', text: 'none yet' }));
  $('savepoints').replaceChildren(...list);
}

function drawJob() {
  const job = view.job;
  if (!job) return;
  $('job-name').textContent = job.job;
  document.title = `${job.job} · Weibo`;
  const state = job.status.state;
  const badge = $('job-state');
  badge.textContent = state === 'restoring' ? `restoring #${job.status.checkpoint}` : state;
  badge.className = 'badge ' + state;
  badge.title = job.status.error || '';
  $('job-uptime').textContent = duration(job.uptime_ms);
  $('job-last-checkpoint').textContent = job.last_checkpoint ? '#' + job.last_checkpoint : '–';
  const newer = view.samples[view.samples.length - 1];
  if (newer && view.plan) {
    const read = view.plan.nodes
      .filter((n) => n.kind === 'source')
      .reduce((s, n) => s + ((operatorOf(newer.metrics, n.name) || {}).records_out || 0), 0);
    $('job-records-read').textContent = count(read);
  }
  const ended = ['finished', 'failed', 'stopped'].includes(state);
  $('savepoint-button').disabled = !job.checkpoints || ended;
  if (!job.checkpoints) $('savepoint-button').title = 'the job takes no checkpoints';
  $('updated').textContent = new Date().toLocaleTimeString();
}

function draw() {
  drawJob();
  drawGraph();
  drawOperators();
  drawPartitions();
  drawCheckpoints();
  drawState();
}

// ---- polling ----

async function poll() {
  try {
    view.job = await api('api/job');
    if (!view.plan) view.plan = await api('api/plan');
    remember(await api('api/metrics'));
    if (view.job.checkpoints) {
      view.checkpoints = await api('api/checkpoints');
      if (Date.now() - view.lastSavepointPoll > 5000) {
        view.lastSavepointPoll = Date.now();
        view.savepoints = (await api('api/savepoints')).savepoints || [];
      }
    }
    view.failing = false;
    showError('');
    draw();
  } catch (e) {
    if (e instanceof Unauthorized) {
      const badge = $('job-state');
      badge.textContent = 'needs token';
      badge.className = 'badge locked';
      badge.title = 'this admin API needs its bearer token';
      $('savepoint-button').disabled = true;
      askForToken();
      return; // polling resumes once a token is given
    }
    // A job that is still starting answers 503; anything else is shown.
    if (e.status !== 503) showError('The admin API did not answer: ' + e.message);
    view.failing = true;
  }
  setTimeout(poll, POLL_MS);
}

async function takeSavepoint(event) {
  event.preventDefault();
  const input = $('savepoint-name');
  const name = input.value.trim() || 'dashboard-' + new Date().toISOString().replace(/[:.]/g, '-');
  const button = $('savepoint-button');
  const message = $('savepoint-message');
  button.disabled = true;
  message.className = '';
  message.textContent = `taking savepoint “${name}”…`;
  try {
    const made = await api('api/savepoints', { method: 'POST', body: { name } });
    message.className = 'ok';
    message.textContent = `savepoint “${made.name}” written to ${made.path}`;
    input.value = '';
    view.lastSavepointPoll = 0;
  } catch (e) {
    message.className = 'warn';
    message.textContent = e instanceof Unauthorized ? 'the token was refused' : e.message;
  } finally {
    button.disabled = !(view.job && view.job.checkpoints);
  }
}

function start() {
  // A token may come in the URL's fragment (`#token=...`: never sent to
  // the server, so never in its logs) or from this tab's earlier login.
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.get('token')) {
    view.token = fragment.get('token');
    sessionStorage.setItem('weibo-token', view.token);
    history.replaceState(null, '', location.pathname + location.search);
  } else {
    view.token = sessionStorage.getItem('weibo-token');
  }
  $('login-form').addEventListener('submit', (event) => {
    event.preventDefault();
    view.token = $('login-token').value.trim();
    sessionStorage.setItem('weibo-token', view.token);
    $('login').hidden = true;
    poll();
  });
  $('savepoint-form').addEventListener('submit', takeSavepoint);
  poll();
}

start();

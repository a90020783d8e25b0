// The plan explorer: reads lengths and options from the page, plans them with the kernel
// component in the browser (the stowplan package, src/index.js) and draws the result. No
// server logic: any static file server that serves sdk-js/ will do (`npm run explorer`).
//
// The exported JSON starts with the plan `stowplan balance --json` prints for the same lengths
// and options (its keys before "operation"), byte for byte: with cp/tp above 1, for the
// lengths padded to the pad factor, which the export names in its file name. After the plan
// come the run's description as the CLI writes it ("operation", "source", "n", "dp_size",
// "capacity", "cost") and the page's settings ("settings", with the shareable URL).
//
// The settings live in the page's URL (query parameters, see PARAMS): loading the URL restores
// them and plans. Every plan attempt ends in one of two states, which the status line names:
// "planned" (the charts are this plan's) or "error" (the charts are cleared and the error
// shown). Editing a setting after a plan greys the charts ("stale") until the next Plan.

/** The page's elements by id. */
const $ = (id) => /** @type {HTMLElement & HTMLInputElement & HTMLSelectElement & HTMLTextAreaElement & HTMLCanvasElement} */ (document.getElementById(id));

/** The six lengths of the docs' examples. */
const DOCS = [100, 900, 50, 950, 400, 600];
/** Draw sequence blocks only while the page holds at most this many; above, fill bars alone. */
const MAX_BLOCKS = 20000;
/** Up to this many ranks, every rank's micro-batches are drawn; above, one rank at a time. */
const MAX_RANKS_DRAWN = 16;
/** Up to this many ranks, the full-width rank chart labels every column with its numbers. */
const MAX_RANKS_LABELLED = 16;
/** Up to this many ranks, the half-width (before/after) charts label every column. */
const MAX_RANKS_LABELLED_HALF = 8;
/** Lengths go into the URL while their comma-separated text is at most this long. */
const MAX_URL_LENGTHS = 4000;
/** The settings kept in the URL: query parameter → field id. */
const PARAMS = { workload: 'workload', dp: 'dp', cap: 'cap', cost: 'cost', ab: 'cost-ab', order: 'order', cp: 'cp', tp: 'tp' };

let sp; // the stowplan module, once loaded
let last = null; // { text, name } of the last plan, for the export
let shown = null; // the plan drawn (see `run`), for the fill map's hover and the rank picker
let lengthsCache = [];
let lengthsSource = '';

/** `n` with thousands separators. */
function fmt(n) {
  return typeof n === 'bigint' || Number.isInteger(n) ? BigInt(n).toLocaleString('en-US') : n.toFixed(5);
}

/** A signed difference: "+3", "−1,204", "±0". */
function signed(d) {
  return d > 0n ? `+${fmt(d)}` : d < 0n ? `−${fmt(-d)}` : '±0';
}

const COMPACT = new Intl.NumberFormat('en-US', { notation: 'compact', maximumSignificantDigits: 3 });

/** A signed difference in a few characters: "+32", "−871M", "+1.05B". */
function signedShort(d) {
  const a = d < 0n ? -d : d;
  const t = a < 10000n ? fmt(a) : COMPACT.format(Number(a));
  return d > 0n ? `+${t}` : d < 0n ? `−${t}` : '±0';
}

/** A percentage readable at any size: "4.17%", "0.0012%", "4.0e-9%". */
function pct(x) {
  const a = Math.abs(x);
  if (a === 0) return '0%';
  return `${a >= 0.01 ? x.toFixed(2) : a >= 0.0001 ? x.toFixed(4) : x.toExponential(1)}%`;
}

/** `d` over `base` in percent, signed. */
function relative(d, base) {
  return base > 0n ? (Number(d) / Number(base)) * 100 : 0;
}

/** A new element with a class and text. */
function el(tag, className = '', text = '') {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text) e.textContent = text;
  return e;
}

/** The lengths in `text`: a JSON array, or integers separated by whitespace or commas. */
function parseLengths(text) {
  const t = text.trim();
  if (!t) return [];
  const tokens = t.startsWith('[') ? JSON.parse(t) : t.split(/[\s,]+/).filter(Boolean);
  return tokens.map((x, i) => {
    const s = String(x).trim();
    if (!/^\d+$/.test(s)) throw new Error(`length ${i + 1} is not a non-negative integer: ${JSON.stringify(x)}`);
    const n = Number(s);
    return Number.isSafeInteger(n) ? n : BigInt(s);
  });
}

/** Shows `lengths` in the text area (for small inputs) and a summary line. */
function setLengths(lengths, source) {
  $('lengths').value = lengths.length <= 20000 ? lengths.join('\n') : '';
  lengthsCache = lengths;
  lengthsSource = source;
  $('lengths-summary').textContent = `${lengths.length.toLocaleString('en-US')} lengths from ${source}`;
}

async function pickWorkload() {
  const w = $('workload').value;
  if (w === 'rl-math-8k') {
    const r = await fetch(new URL('../generated/workloads/rl-math-8k.txt', import.meta.url));
    if (!r.ok) throw new Error(`workload rl-math-8k: HTTP ${r.status}`);
    setLengths(parseLengths(await r.text()), 'the built-in workload rl-math-8k');
  } else if (w === 'docs') {
    setLengths(DOCS, "the docs' example");
  }
}

/** The cost option from the page: a preset name or [A, B]. */
function costOption() {
  const c = $('cost').value;
  if (c !== 'custom') return c;
  const parts = $('cost-ab').value.split(',').map((x) => x.trim());
  if (parts.length !== 2 || !parts.every((p) => /^\d+$/.test(p))) throw new Error('the custom cost must be two non-negative integers A,B');
  return parts.map((p) => BigInt(p));
}

/** An integer field (empty: null). */
function intField(id, name) {
  const v = $(id).value.trim();
  if (v === '') return null;
  if (!/^\d+$/.test(v)) throw new Error(`${name} must be a whole number (got ${JSON.stringify(v)})`);
  return Number(v);
}

// ---------------------------------------------------------------------------------------
// Settings in the URL

/** The lengths as the URL carries them (null: too long for a URL, or a built-in workload). */
function urlLengths() {
  if ($('workload').value) return null;
  const typed = $('lengths').value.trim();
  let text;
  try {
    text = (typed ? parseLengths(typed) : lengthsCache).join(',');
  } catch {
    text = typed; // not lengths: the URL keeps the text, so that it reproduces the error
  }
  return text.length <= MAX_URL_LENGTHS ? text : null;
}

/** The page's settings as query parameters. */
function settingsQuery() {
  const q = new URLSearchParams();
  const workload = $('workload').value;
  if (workload) q.set('workload', workload);
  else {
    const lengths = urlLengths();
    if (lengths !== null) q.set('lengths', lengths);
  }
  for (const p of ['dp', 'cap', 'cost']) q.set(p, $(PARAMS[p]).value.trim());
  if ($('cost').value === 'custom') q.set('ab', $('cost-ab').value.trim());
  for (const p of ['order', 'cp', 'tp']) q.set(p, $(PARAMS[p]).value.trim());
  return q;
}

/** Writes the settings into the page's URL (no reload, no history entry) and returns it. */
function writeURL() {
  const url = new URL(location.href);
  url.search = settingsQuery().toString();
  history.replaceState(null, '', url);
  return url.href;
}

/** Puts the URL's settings into the page; returns what it could not take. */
function readURL() {
  const q = new URLSearchParams(location.search);
  const problems = [];
  for (const [param, id] of Object.entries(PARAMS)) {
    if (!q.has(param)) continue;
    const v = q.get(param) ?? '';
    const field = $(id);
    if (field.tagName === 'SELECT' && ![...field.options].some((o) => o.value === v)) {
      const known = [...field.options].map((o) => o.value).filter(Boolean).join(', ');
      problems.push(`${param}=${JSON.stringify(v)} is not one of ${known}`);
      continue;
    }
    field.value = v;
  }
  if (q.has('lengths') && !q.get('workload')) {
    $('workload').value = '';
    $('lengths').value = (q.get('lengths') ?? '').split(',').join('\n');
    lengthsSource = 'the URL';
    $('lengths-summary').textContent = 'lengths from the URL';
  } else if (q.has('workload') && !q.get('workload')) {
    problems.push('the URL names no workload and carries no lengths');
  }
  $('custom-cost').hidden = $('cost').value !== 'custom';
  return problems;
}

// ---------------------------------------------------------------------------------------
// Drawing

/** One figure of the figures grid. */
function figure(id, label, value) {
  const div = document.createElement('div');
  const dt = el('dt', '', label);
  const dd = el('dd', '', value);
  dd.id = `fig-${id}`;
  div.append(dt, dd);
  $('figures').append(div);
}

/**
 * A column chart of `values` (one column per rank) as deviations from `bound`: a column rises
 * above the bound's line by how much the rank's cost exceeds it and hangs below by how much it
 * falls short. The axis spans `scale` = [most below, most above] (charts compared side by side
 * share one), its ends labelled with the numbers. Few enough columns are labelled: with the
 * rank, its cost and its deviation, or (`half`: a half-width chart) the rank and the deviation.
 */
function deviationChart(box, values, bound, scale, half = false) {
  const [below, above] = scale;
  const span = Number(below + above) || 1;
  const zero = (Number(above) / span) * 100; // the bound's line, % from the top
  box.replaceChildren();
  const axis = el('div', 'axis');
  const mark = (cls, text, top) => {
    const s = el('span', cls, text);
    s.style.top = `${top}%`;
    axis.append(s);
  };
  if (above > 0n) mark('axis-top', `+${fmt(above)}`, 0);
  mark('axis-zero', 'bound', zero);
  if (below > 0n) mark('axis-bottom', `−${fmt(below)}`, 100);
  const plot = el('div', values.length > 64 ? 'plot dense' : 'plot');
  const argmax = values.reduce((m, v, r) => (v > values[m] ? r : m), 0);
  values.forEach((v, r) => {
    const d = v - bound;
    const col = el('div', 'rank-col');
    col.dataset.rank = String(r);
    col.dataset.cost = String(v);
    col.dataset.deviation = String(d);
    col.title = `rank ${r}${r === argmax ? ' (costliest)' : ''}: cost ${fmt(v)}, ${signed(d)} from the lower bound ${fmt(bound)} (${pct(relative(d, bound))})`;
    const h = (Math.abs(Number(d)) / span) * 100;
    const bar = el('div', d > 0n ? 'dev over' : 'dev');
    bar.style.top = `${d > 0n ? zero - h : zero}%`;
    bar.style.height = `${h}%`;
    col.append(bar);
    plot.append(col);
  });
  const line = el('div', 'zero');
  line.style.top = `${zero}%`;
  plot.append(line);
  box.append(axis, plot);
  if (values.length <= (half ? MAX_RANKS_LABELLED_HALF : MAX_RANKS_LABELLED)) {
    const labels = el('div', 'labels');
    values.forEach((v, r) => {
      const l = el('div', 'col-label', `rank ${r}`);
      if (!half) l.append(el('span', 'rank-cost', fmt(v)));
      l.append(el('span', 'rank-dev', half ? signedShort(v - bound) : signed(v - bound)));
      labels.append(l);
    });
    box.append(labels);
  }
}

/** [most below, most above] `bound` over `lists` of values. */
function spread(lists, bound) {
  let below = 0n;
  let above = 0n;
  for (const values of lists) {
    for (const v of values) {
      if (bound - v > below) below = bound - v;
      if (v - bound > above) above = v - bound;
    }
  }
  return [below, above];
}

/** The fill map's colour ramp (yellow-green-blue): light is empty, dark is full. */
const RAMP = [[255, 255, 204], [199, 233, 180], [127, 205, 187], [65, 182, 196], [29, 145, 192], [34, 94, 168], [12, 44, 132]];

/** The colour of `t` (0..1) on the ramp. */
function shade(t) {
  const x = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const f = x - i;
  return RAMP[i].map((c, k) => Math.round(c + (RAMP[i + 1][k] - c) * f));
}

/**
 * The ranks × micro-batches fill map: one canvas pixel per micro-batch (columns: ranks, as in
 * the charts above; rows: micro-batches, the first on top), scaled up. The colour scale runs
 * from the emptiest micro-batch's fill (rounded down to 10%) to 100% of the cap, and the
 * legend says so: a plan filled 80–100% still shows its differences.
 */
function drawHeat(plan) {
  const { ranks, cap } = plan;
  const dp = ranks.length;
  const count = ranks.reduce((a, r) => Math.max(a, r.count), 0);
  let lowest = null;
  let used = 0n;
  let empty = 0;
  ranks.forEach((mb, r) => {
    for (let m = 0; m < mb.count; m++) {
      const t = mb.tokens[m];
      used += t;
      if (t === 0n) empty++;
      const f = Number(t) / Number(cap);
      if (lowest === null || f < lowest.f) lowest = { f, r, m };
    }
  });
  const floor = lowest ? Math.floor(lowest.f * 10) / 10 : 0;
  const canvas = $('heatmap');
  canvas.width = dp;
  canvas.height = Math.max(1, count);
  canvas.dataset.ranks = String(dp);
  canvas.dataset.microBatches = String(count);
  const ctx = canvas.getContext('2d');
  const img = ctx.createImageData(dp, canvas.height);
  ranks.forEach((mb, r) => {
    for (let m = 0; m < count; m++) {
      const at = (m * dp + r) * 4;
      if (m >= mb.count) img.data.set([255, 255, 255, 255], at);
      else img.data.set([...shade((Number(mb.tokens[m]) / Number(cap) - floor) / (1 - floor || 1)), 255], at);
    }
  });
  ctx.putImageData(img, 0, 0);
  const rowPx = count <= 16 ? 16 : count <= 64 ? 6 : Math.max(1, Math.floor(400 / count));
  canvas.style.height = `${Math.min(400, count * rowPx)}px`;
  $('heat-wrap').style.maxWidth = `${Math.max(dp * 48, 240)}px`;
  $('heat-mark').hidden = true;
  $('legend-low').textContent = floor > 0 ? `${Math.round(floor * 100)}% or less` : '0%';
  $('legend-cap').textContent = `100% of the cap (${fmt(cap)} tokens)`;
  $('heat-axes').textContent = `columns: ranks 0 to ${dp - 1}, left to right; rows: micro-batches 0 to ${count - 1}, top to bottom. ` +
    `Colour scale: ${floor > 0 ? `${Math.round(floor * 100)}% (the emptiest micro-batch's fill, rounded down)` : '0%'} to 100% of the cap.`;
  const mean = (Number(used) / (Number(cap) * dp * count)) * 100;
  $('heat-note').textContent = `${fmt(dp)} ranks × ${fmt(count)} micro-batches: filled ${mean.toFixed(1)}% of the cap on average` +
    (lowest ? `, the emptiest ${(lowest.f * 100).toFixed(1)}% (rank ${lowest.r}, micro-batch ${lowest.m})` : '') +
    (empty ? `; ${fmt(empty)} micro-batches are empty` : '') + '.';
  $('heat-info').textContent = 'Hover over the fill map for a micro-batch\'s figures.';
}

/** The micro-batch under the mouse in the fill map, or null. */
function heatCell(event) {
  if (!shown?.ranks) return null;
  const canvas = $('heatmap');
  const box = canvas.getBoundingClientRect();
  const r = Math.floor(((event.clientX - box.left) / box.width) * canvas.width);
  const m = Math.floor(((event.clientY - box.top) / box.height) * canvas.height);
  const mb = shown.ranks[r];
  if (!mb || m < 0 || m >= mb.count) return null;
  return { r, m, mb };
}

function heatHover(event) {
  const cell = heatCell(event);
  const canvas = $('heatmap');
  if (!cell) {
    canvas.title = '';
    return;
  }
  const { r, m, mb } = cell;
  const t = mb.tokens[m];
  const text = `rank ${r}, micro-batch ${m}: ${fmt(t)} of ${fmt(shown.cap)} tokens (${((Number(t) / Number(shown.cap)) * 100).toFixed(1)}%), ` +
    `${fmt(mb.batches[m].length)} sequences, cost ${fmt(mb.costs[m])}`;
  $('heat-info').textContent = text;
  canvas.title = text;
}

/** The micro-batches of `which` ranks as columns filled by their sequences. */
function drawFill(plan, which) {
  const { ranks, raw, padded, cap, costOf } = plan;
  const box = $('fill');
  box.replaceChildren();
  const blocks = which.reduce((a, r) => a + ranks[r].indices.length, 0);
  const aggregate = blocks > MAX_BLOCKS;
  for (const r of which) {
    const mb = ranks[r];
    const row = el('div', 'fill-rank');
    row.dataset.rank = String(r);
    const mbs = el('div', 'mbs');
    mb.batches.forEach((members, m) => {
      const col = el('div', aggregate ? 'mb aggregate' : 'mb');
      col.title = `rank ${r}, micro-batch ${m}: ${members.length} sequences, ${fmt(mb.tokens[m])} of ${fmt(cap)} tokens, cost ${fmt(mb.costs[m])}`;
      if (aggregate) {
        const seq = el('div', 'seq');
        seq.style.height = `${(Number(mb.tokens[m]) / Number(cap)) * 100}%`;
        col.append(seq);
      } else {
        for (const i of members) {
          const seq = el('div', 'seq');
          seq.dataset.sample = String(i);
          const len = padded[i];
          seq.style.height = `${(Number(len) / Number(cap)) * 100}%`;
          const padding = BigInt(raw[i]) === len ? '' : ` (padded to ${fmt(len)})`;
          seq.title = `sample ${i}: length ${fmt(raw[i])}${padding}, cost ${fmt(costOf(len))}; rank ${r}, micro-batch ${m}`;
          col.append(seq);
        }
      }
      mbs.append(col);
    });
    row.append(el('span', '', `rank ${r}`), mbs);
    box.append(row);
  }
}

/** Shows rank `r`'s micro-batches (the rank picker, above MAX_RANKS_DRAWN ranks). */
function pickRank(r) {
  if (!shown?.ranks || shown.ranks.length <= MAX_RANKS_DRAWN) return;
  const rank = Math.max(0, Math.min(shown.ranks.length - 1, r));
  $('fill-rank').value = String(rank);
  const mark = $('heat-mark');
  mark.style.left = `${(rank / shown.ranks.length) * 100}%`;
  mark.style.width = `${100 / shown.ranks.length}%`;
  mark.hidden = false;
  drawFill(shown, [rank]);
}

// ---------------------------------------------------------------------------------------
// Planning

/** Sets the status line: `kind` is 'ok', 'failed', 'stale' or '' (neutral). */
function status(text, kind = '') {
  $('status').textContent = text;
  $('status').className = `note ${kind}`.trim();
}

/** Clears every chart and figure: no plan is drawn. */
function clearCharts() {
  shown = null;
  $('figures').replaceChildren();
  for (const id of ['before', 'after', 'ranks', 'fill']) $(id).replaceChildren();
  for (const id of ['before-after-note', 'ranks-note', 'heat-note', 'heat-info', 'heat-axes']) $(id).textContent = '';
  $('heat-mark').hidden = true;
  const canvas = $('heatmap');
  canvas.width = 1;
  canvas.height = 1;
  delete canvas.dataset.ranks;
  delete canvas.dataset.microBatches;
}

/** A failed plan: nothing drawn, the error in the box, the status and the summary. */
function fail(e) {
  const message = `${e?.name ?? 'Error'}: ${e?.message ?? e}`;
  last = null;
  clearCharts();
  $('export').disabled = true;
  $('results').hidden = false;
  $('results').dataset.state = 'error';
  $('charts').hidden = true;
  $('error').hidden = false;
  $('error').textContent = message;
  $('summary').replaceChildren(el('p', '', 'No plan is drawn: the last attempt failed (the error above). Fix the settings and press Plan.'));
  status(`Plan failed: ${message}`, 'failed');
}

/** The page's settings, checked: what `run` plans. */
function readSettings() {
  const typed = $('lengths').value.trim();
  const lengths = typed ? parseLengths(typed) : lengthsCache;
  if (lengths.length === 0) throw new Error('no lengths: pick a workload, paste lengths or upload a file');
  const dp = intField('dp', 'DP ranks') ?? 1;
  const cap = intField('cap', 'the token cap');
  const cp = intField('cp', 'cp') ?? 1;
  const tp = intField('tp', 'tp') ?? 1;
  const cost = costOption();
  const order = $('order').value;
  if (dp === 1 && cap === null) throw new Error('nothing to plan: give more than one DP rank and/or a token cap');
  const workload = $('workload').value || null;
  return { lengths, dp, cap, cp, tp, cost, order, workload, source: lengthsSource || 'pasted lengths' };
}

/** Plans the page's input and shows it; a failure clears the charts and says what failed. */
function run() {
  const url = writeURL();
  $('error').hidden = true;
  $('results').hidden = false;
  let plan;
  try {
    plan = makePlan(readSettings(), url);
  } catch (e) {
    fail(e);
    return;
  }
  try {
    draw(plan);
  } catch (e) {
    fail(e);
    return;
  }
  last = { text: plan.exportText, name: plan.fileName };
  $('export').disabled = false;
  $('results').dataset.state = 'planned';
  status(`Planned ${fmt(plan.raw.length)} lengths: ${plan.dp === 1 ? 'one rank' : `${fmt(plan.dp)} ranks`}, ` +
    `${plan.cap === null ? 'no token cap' : `cap ${fmt(plan.cap)} tokens`}, ${plan.costText} cost.`, 'ok');
}

/** Plans `s` with the kernel: everything the charts, the summary and the export need. */
function makePlan(s, url) {
  const { lengths, dp, cap, cp, tp, cost, order } = s;
  const factor = sp.padFactor({ cp, tp });
  let padded = BigUint64Array.from(lengths, (l) => BigInt(l));
  let alignment = 0n;
  if (factor > 1n) {
    padded = padded.map((l) => ((l + factor - 1n) / factor) * factor);
    for (let i = 0; i < padded.length; i++) alignment += padded[i] - BigInt(lengths[i]);
  }
  const [A, B] = typeof cost === 'string' ? sp.COSTS[cost] : cost;
  const costOf = (l) => A * l + B * l * l;
  const costText = typeof cost === 'string' ? cost : `${A}·L + ${B}·L²`;
  const plan = { ...s, raw: lengths, padded, factor, alignment, costOf, costText, url };
  plan.total = padded.reduce((a, b) => a + b, 0n);
  let text;
  if (dp === 1) {
    const mb = sp.microBatches(padded, cap, { cost, order });
    plan.ranks = [mb];
    text = mb.toJSONText();
  } else {
    const b = sp.balance(padded, dp, cap === null ? { cost } : { cost, capacity: cap, order });
    plan.balance = b;
    plan.ranks = b.microBatches;
    text = b.toJSONText();
    // The input order: rank r takes samples ⌊r·n/dp⌋ .. ⌊(r+1)·n/dp⌋ − 1, as without balancing.
    const n = padded.length;
    plan.before = Array.from({ length: dp }, (_, r) => {
      let c = 0n;
      for (let i = Math.floor((r * n) / dp); i < Math.floor(((r + 1) * n) / dp); i++) c += costOf(padded[i]);
      return c;
    });
    try {
      plan.verl = b.logSeqlenUnbalance();
    } catch {
      plan.verl = null; // fewer lengths than ranks: verl's metric is undefined
    }
  }
  // The export: the CLI's plan, the CLI's description of the run, then the page's settings.
  const settings = {
    workload: s.workload,
    lengths_in_url: new URL(url).searchParams.has('lengths') || s.workload !== null,
    dp, cap, cost: typeof cost === 'string' ? cost : 'custom',
    cost_ab: typeof cost === 'string' ? null : `${A},${B}`,
    order, cp, tp, pad_factor: factor, url,
  };
  const described = {
    operation: 'balance', source: s.source, n: lengths.length, dp_size: dp, capacity: cap,
    cost: { linear: A, quadratic: B }, settings, kernel_sha256: sp.kernelInfo().sha256,
  };
  plan.exportText = `${text.slice(0, -1)},${sp.toJSONText(described).slice(1)}`;
  plan.fileName = `stowplan-plan-dp${dp}${cap === null ? '' : `-cap${cap}`}${factor > 1n ? `-padded${factor}` : ''}.json`;
  return plan;
}

/** Draws `plan`: summary, figures, charts. */
function draw(plan) {
  clearCharts();
  const { dp, cap, cp, tp, factor, balance: b } = plan;
  $('charts').hidden = false;
  const summary = [];
  summary.push(`${fmt(plan.raw.length)} sequences, ${fmt(plan.total)} tokens${plan.alignment ? ` (${fmt(plan.alignment)} of them padding to the pad factor ${fmt(factor)})` : ''}, ` +
    `over ${dp === 1 ? 'one rank' : `${fmt(dp)} ranks`}, ${cap === null ? 'no token cap' : `micro-batches ≤ ${fmt(cap)} tokens`}, ${plan.costText} cost.`);
  figure('n', 'sequences', fmt(plan.raw.length));
  figure('tokens', 'tokens (after alignment)', fmt(plan.total));
  figure('factor', `pad factor (cp ${cp}, tp ${tp})`, fmt(factor));
  figure('alignment', 'alignment padding tokens', fmt(plan.alignment));
  $('dp-charts').hidden = dp === 1;
  if (b) {
    const cb = b.costBalance;
    const lb = b.costLowerBound;
    const before = sp.figures(BigUint64Array.from(plan.before));
    const over = cb.max - lb;
    figure('ranks', 'DP ranks', fmt(dp));
    figure('max-cost', 'costliest rank', fmt(cb.max));
    figure('cost-lower-bound', 'lower bound', fmt(lb));
    figure('over-bound', 'costliest over the bound', `+${pct(relative(over, lb))}`);
    figure('cost-max-over-mean', 'rank cost max/mean', cb.maxOverMean.toFixed(5));
    figure('token-spread', 'rank token spread', fmt(b.tokenBalance.spread));
    figure('before-over-bound', 'input order: costliest over the bound', `+${pct(relative(before.max - lb, lb))}`);
    summary.push(`Balanced: the costliest rank costs ${signed(over)} over the lower bound ${fmt(lb)} (+${pct(relative(over, lb))}), ` +
      `the ranks' costs spread ${fmt(cb.spread)}. In input order the costliest would be ${signed(before.max - lb)} over it (+${pct(relative(before.max - lb, lb))}), spread ${fmt(before.spread)}.`);
    const costs = Array.from(b.costs);
    // Before and after: one scale, so the balanced ranks' nearness to the bound shows.
    const both = spread([plan.before, costs], lb);
    deviationChart($('before'), plan.before, lb, both, true);
    deviationChart($('after'), costs, lb, both, true);
    const verl = plan.verl
      ? ` verl's log_seqlen_unbalance (tokens, as the CLI's "verl unbalance" line): before ${fmt(plan.verl['global_seqlen/min'])}..${fmt(plan.verl['global_seqlen/max'])}, after ${fmt(plan.verl['global_seqlen/balanced_min'])}..${fmt(plan.verl['global_seqlen/balanced_max'])}.`
      : '';
    $('before-after-note').textContent = `Input order: rank r takes samples ⌊r·n/dp⌋ to ⌊(r+1)·n/dp⌋ − 1, as without balancing. ` +
      `Axis: the cost minus the lower bound ${fmt(lb)}, from −${fmt(both[0])} to +${fmt(both[1])}. ` +
      `Input order: ${signed(before.min - lb)} to ${signed(before.max - lb)}; balanced: ${signed(cb.min - lb)} to ${signed(cb.max - lb)}.${verl}`;
    // The balanced ranks on their own scale: differences of a few units are visible.
    const own = spread([costs], lb);
    deviationChart($('ranks'), costs, lb, own);
    $('ranks-note').textContent = `Zoomed axis: the cost minus the lower bound ${fmt(lb)} (no assignment has a lighter costliest rank), ` +
      `from −${fmt(own[0])} to +${fmt(own[1])} cost units; full costs are ${fmt(cb.min)} to ${fmt(cb.max)}, ` +
      `so bars starting at 0 would differ by ${pct(relative(cb.spread, cb.max))}.`;
  }
  $('mb-charts').hidden = cap === null;
  $('no-mb').hidden = cap !== null;
  if (cap !== null) {
    const ranks = plan.ranks;
    const capN = BigInt(cap);
    const count = ranks[0].count;
    const mbTokens = ranks.flatMap((r) => Array.from(r.tokens));
    const used = mbTokens.reduce((a, t) => a + t, 0n);
    const slots = BigInt(mbTokens.length) * capN;
    const largest = mbTokens.reduce((a, t) => (t > a ? t : a), 0n);
    const lowerBound = ranks.reduce((a, r) => Math.max(a, r.lowerBound), 0);
    const fill = (Number(used) / Number(slots)) * 100;
    figure('count', 'micro-batches per rank', fmt(count));
    figure('mb-lower-bound', 'per-rank lower bound (largest)', fmt(lowerBound));
    figure('largest-mb', `largest micro-batch (cap ${fmt(capN)})`, fmt(largest));
    figure('cap-padding', 'padding to the cap (tokens)', fmt(slots - used));
    figure('fill', 'micro-batch fill', `${fill.toFixed(2)}%`);
    summary.push(`${fmt(count)} micro-batch${count === 1 ? '' : 'es'} per rank (lower bound ${fmt(lowerBound)}), filled ${fill.toFixed(2)}% of the cap; ` +
      `${fmt(slots - used)} tokens of padding to the cap; the largest micro-batch holds ${fmt(largest)} tokens.`);
    shown = plan;
    drawHeat(plan);
    const many = ranks.length > MAX_RANKS_DRAWN;
    $('fill-pick').hidden = !many;
    if (many) {
      const costs = ranks.map((r) => r.costs.reduce((a, c) => a + c, 0n));
      const costliest = costs.reduce((m, c, r) => (c > costs[m] ? r : m), 0);
      $('fill-rank').max = String(ranks.length - 1);
      $('fill-pick-note').textContent = `of ${fmt(ranks.length)} (first shown: rank ${costliest}, the costliest; click a column of the fill map to show another)`;
      pickRank(costliest);
    } else {
      drawFill(plan, ranks.map((_, r) => r));
    }
  }
  shown = plan;
  const list = el('ul');
  for (const line of summary) list.append(el('li', '', line));
  const head = el('strong', '', 'Summary');
  $('summary').replaceChildren(head, list);
}

/** Downloads the last plan's JSON. */
function exportPlan() {
  if (!last) return;
  const url = URL.createObjectURL(new Blob([last.text], { type: 'application/json' }));
  const a = Object.assign(document.createElement('a'), { href: url, download: last.name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** A setting changed after a plan: the charts are greyed until the next Plan. */
function markStale() {
  if ($('results').dataset.state !== 'planned') return;
  $('results').dataset.state = 'stale';
  status('The settings changed since this plan was drawn (greyed): press Plan to plan them.', 'stale');
}

async function main() {
  try {
    sp = await import('../src/index.js');
  } catch (e) {
    status(`The kernel did not load: ${e.message}`, 'failed');
    return;
  }
  const info = sp.kernelInfo();
  $('kernel').textContent = `kernel component sha256 ${info.sha256} (${info.bytes.toLocaleString('en-US')} bytes), checked at load`;
  $('workload').addEventListener('change', () => pickWorkload().catch(fail));
  $('cost').addEventListener('change', () => ($('custom-cost').hidden = $('cost').value !== 'custom'));
  $('upload').addEventListener('change', async () => {
    const file = $('upload').files?.[0];
    if (!file) return;
    try {
      setLengths(parseLengths(await file.text()), file.name);
      $('workload').value = '';
    } catch (e) {
      fail(new Error(`${file.name}: ${e.message}`));
    }
  });
  $('lengths').addEventListener('input', () => {
    $('workload').value = '';
    lengthsSource = 'pasted lengths';
    $('lengths-summary').textContent = 'pasted lengths';
  });
  $('inputs').addEventListener('input', markStale);
  $('inputs').addEventListener('change', markStale);
  $('inputs').addEventListener('keydown', (e) => {
    const t = /** @type {HTMLInputElement} */ (e.target);
    if (e.key === 'Enter' && t.tagName === 'INPUT' && t.type !== 'file') run();
  });
  $('run').addEventListener('click', run);
  $('export').addEventListener('click', exportPlan);
  $('heatmap').addEventListener('mousemove', heatHover);
  $('heatmap').addEventListener('click', (e) => {
    const cell = heatCell(e);
    if (cell) pickRank(cell.r);
  });
  $('fill-rank').addEventListener('change', () => pickRank(Number($('fill-rank').value) || 0));
  // The URL's settings (or the defaults), then a first plan drawn.
  const problems = readURL();
  try {
    await pickWorkload();
    if (problems.length) throw new Error(`the URL's settings: ${problems.join('; ')}`);
    run();
  } catch (e) {
    fail(e);
  }
  document.body.dataset.ready = 'true';
}

main();

// The plan explorer: reads lengths and options from the page, plans them with the kernel
// component in the browser (the stowplan package, src/index.js) and draws the result. No
// server logic: any static file server that serves sdk-js/ will do (`npm run explorer`).
//
// The exported JSON is the plan `stowplan balance --json` prints for the same lengths and
// options (its keys before "operation"), byte for byte: with cp/tp above 1, for the lengths
// padded to the pad factor, which the export names in its file name.

/** The page's elements by id. */
const $ = (id) => /** @type {HTMLElement & HTMLInputElement & HTMLSelectElement & HTMLTextAreaElement} */ (document.getElementById(id));

/** The six lengths of the docs' examples. */
const DOCS = [100, 900, 50, 950, 400, 600];
/** Draw sequence blocks only while the page holds at most this many; above, fill bars alone. */
const MAX_BLOCKS = 20000;

let sp; // the stowplan module, once loaded
let last = null; // { text, name } of the last plan, for the export

/** `n` with thousands separators. */
function fmt(n) {
  return typeof n === 'bigint' || Number.isInteger(n) ? BigInt(n).toLocaleString('en-US') : n.toFixed(5);
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
  $('lengths').dataset.source = source;
  lengthsCache = lengths;
  $('lengths-summary').textContent = `${lengths.length.toLocaleString('en-US')} lengths from ${source}`;
}
let lengthsCache = [];

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

/** The cost option from the page. */
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

/** One figure of the summary grid. */
function figure(id, label, value) {
  const div = document.createElement('div');
  const dt = document.createElement('dt');
  const dd = document.createElement('dd');
  dt.textContent = label;
  dd.id = `fig-${id}`;
  dd.textContent = value;
  div.append(dt, dd);
  $('figures').append(div);
}

/** Per-rank cost bars against the lower bound. */
function drawRanks(costs, lowerBound) {
  const box = $('ranks');
  box.replaceChildren();
  const top = costs.reduce((a, b) => (b > a ? b : a), lowerBound) || 1n;
  const pct = (x) => `${(Number(x) / Number(top)) * 100}%`;
  costs.forEach((c, r) => {
    const row = document.createElement('div');
    row.className = 'rank-row';
    row.dataset.rank = String(r);
    const name = document.createElement('span');
    name.textContent = `rank ${r}`;
    const track = document.createElement('div');
    track.className = 'bar-track';
    const bar = document.createElement('div');
    bar.className = 'bar';
    bar.style.width = pct(c);
    const bound = document.createElement('div');
    bound.className = 'bound';
    bound.style.left = pct(lowerBound);
    bound.title = `lower bound ${fmt(lowerBound)}`;
    track.append(bar, bound);
    const value = document.createElement('span');
    value.className = 'rank-cost';
    value.textContent = fmt(c);
    row.append(name, track, value);
    box.append(row);
  });
}

/** Every rank's micro-batches as columns filled by their sequences. */
function drawFill(ranks, lengths, cap) {
  const box = $('fill');
  box.replaceChildren();
  const blocks = ranks.reduce((a, r) => a + r.indices.length, 0);
  const aggregate = blocks > MAX_BLOCKS;
  ranks.forEach((mb, r) => {
    const row = document.createElement('div');
    row.className = 'fill-rank';
    const name = document.createElement('span');
    name.textContent = `rank ${r}`;
    const mbs = document.createElement('div');
    mbs.className = 'mbs';
    mb.batches.forEach((members, m) => {
      const col = document.createElement('div');
      col.className = aggregate ? 'mb aggregate' : 'mb';
      col.title = `micro-batch ${m}: ${members.length} sequences, ${fmt(mb.tokens[m])} of ${fmt(cap)} tokens`;
      const parts = aggregate ? [mb.tokens[m]] : Array.from(members, (i) => lengths[i]);
      for (const len of parts) {
        const seq = document.createElement('div');
        seq.className = 'seq';
        seq.style.height = `${(Number(len) / Number(cap)) * 100}%`;
        col.append(seq);
      }
      mbs.append(col);
    });
    row.append(name, mbs);
    box.append(row);
  });
}

/** Plans the page's input and shows it. */
function run() {
  $('error').hidden = true;
  $('results').hidden = false;
  $('figures').replaceChildren();
  try {
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
    const factor = sp.padFactor({ cp, tp });
    let padded = BigUint64Array.from(lengths, (l) => BigInt(l));
    let alignment = 0n;
    if (factor > 1n) {
      padded = padded.map((l) => ((l + factor - 1n) / factor) * factor);
      for (let i = 0; i < padded.length; i++) alignment += padded[i] - BigInt(lengths[i]);
    }
    const total = padded.reduce((a, b) => a + b, 0n);
    let ranks;
    let text;
    figure('n', 'sequences', fmt(lengths.length));
    figure('tokens', 'tokens (after alignment)', fmt(total));
    figure('factor', `pad factor (cp ${cp}, tp ${tp})`, fmt(factor));
    figure('alignment', 'alignment padding tokens', fmt(alignment));
    if (dp === 1) {
      const mb = sp.microBatches(padded, cap, { cost, order });
      ranks = [mb];
      text = mb.toJSONText();
      drawRanks([mb.costs.reduce((a, b) => a + b, 0n)], mb.costs.reduce((a, b) => a + b, 0n));
    } else {
      const b = sp.balance(padded, dp, cap === null ? { cost } : { cost, maxTokenLen: cap, order });
      ranks = b.microBatches;
      text = b.toJSONText();
      const cb = b.costBalance;
      const over = b.costLowerBound > 0n ? (Number(cb.max - b.costLowerBound) / Number(b.costLowerBound)) * 100 : 0;
      figure('ranks', 'DP ranks', fmt(dp));
      figure('max-cost', 'costliest rank', fmt(cb.max));
      figure('cost-lower-bound', 'lower bound', fmt(b.costLowerBound));
      figure('over-bound', 'costliest over the bound', `+${over.toFixed(4)}%`);
      figure('cost-max-over-mean', 'rank cost max/mean', cb.maxOverMean.toFixed(5));
      figure('token-spread', 'rank token spread', fmt(b.tokenBalance.spread));
      drawRanks(Array.from(b.costs), b.costLowerBound);
    }
    if (ranks) {
      const capN = BigInt(cap);
      const count = ranks[0].count;
      const mbTokens = ranks.flatMap((r) => Array.from(r.tokens));
      const used = mbTokens.reduce((a, t) => a + t, 0n);
      const slots = BigInt(mbTokens.length) * capN;
      const largest = mbTokens.reduce((a, t) => (t > a ? t : a), 0n);
      const lowerBound = ranks.reduce((a, r) => Math.max(a, r.lowerBound), 0);
      figure('count', 'micro-batches per rank', fmt(count));
      figure('mb-lower-bound', 'per-rank lower bound (largest)', fmt(lowerBound));
      figure('largest-mb', `largest micro-batch (cap ${fmt(capN)})`, fmt(largest));
      figure('cap-padding', 'padding to the cap (tokens)', fmt(slots - used));
      figure('fill', 'micro-batch fill', `${((Number(used) / Number(slots)) * 100).toFixed(2)}%`);
      drawFill(ranks, padded, capN);
    } else {
      $('fill').replaceChildren(Object.assign(document.createElement('p'), { className: 'note', textContent: 'Give a token cap to plan micro-batches.' }));
    }
    const name = `stowplan-plan-dp${dp}${cap === null ? '' : `-cap${cap}`}${factor > 1n ? `-padded${factor}` : ''}.json`;
    last = { text, name };
    $('export').disabled = false;
    $('status').textContent = `Planned ${fmt(lengths.length)} lengths.`;
  } catch (e) {
    last = null;
    $('export').disabled = true;
    $('error').hidden = false;
    $('error').textContent = `${e.name ?? 'Error'}: ${e.message}`;
  }
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

async function main() {
  try {
    sp = await import('../src/index.js');
  } catch (e) {
    $('status').textContent = `The kernel did not load: ${e.message}`;
    return;
  }
  const info = sp.kernelInfo();
  $('kernel').textContent = `kernel component sha256 ${info.sha256} (${info.bytes.toLocaleString('en-US')} bytes), checked at load`;
  $('workload').addEventListener('change', () => pickWorkload().catch((e) => ($('status').textContent = e.message)));
  $('cost').addEventListener('change', () => ($('custom-cost').hidden = $('cost').value !== 'custom'));
  $('upload').addEventListener('change', async () => {
    const file = $('upload').files?.[0];
    if (!file) return;
    try {
      setLengths(parseLengths(await file.text()), file.name);
      $('workload').value = '';
    } catch (e) {
      $('status').textContent = `${file.name}: ${e.message}`;
    }
  });
  $('lengths').addEventListener('input', () => {
    $('workload').value = '';
    $('lengths-summary').textContent = 'pasted lengths';
  });
  $('run').addEventListener('click', run);
  $('export').addEventListener('click', exportPlan);
  await pickWorkload();
  $('status').textContent = 'Ready.';
  document.body.dataset.ready = 'true';
}

main();

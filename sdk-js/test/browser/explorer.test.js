// The plan explorer in a real headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; no browser is downloaded): plans workloads in the page, compares the
// figures, the charts' data and the exported JSON with the CLI's, follows an error-then-recover
// flow (the charts must always be the status line's plan, or none), round-trips the settings
// through the URL and the export, and saves screenshots at dp 8 and dp 64 (and of an error)
// under STOWPLAN_SCREENSHOTS or a fresh temporary directory, which it prints. Run by
// run_tests.sh where chromium exists.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { chromium } from 'playwright-core';

import * as stowplan from '../../src/index.js';
import { serve } from '../../scripts/serve.mjs';
import { PKG, cliPlanText, requireCli } from '../helpers.js';

const CHROMIUM = process.env.STOWPLAN_CHROMIUM ?? '/usr/bin/chromium';
const FLAGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
/** Where the screenshots go (kept after the run, to be looked at). */
const SHOTS = process.env.STOWPLAN_SCREENSHOTS ?? mkdtempSync(join(tmpdir(), 'stowplan-explorer-'));
mkdirSync(SHOTS, { recursive: true });
/** The page at dp 64 stays about this tall at most (it was 6,700 px with a row per rank). */
const MAX_HEIGHT_DP64 = 2500;
/** rl-math-8k's lengths. */
const RAW = readFileSync(join(PKG, 'generated/workloads/rl-math-8k.txt'), 'utf8').trim().split('\n').map(Number);
const ATTENTION = (l) => 24576n * BigInt(l) + BigInt(l) * BigInt(l);

let server;
let context;
let profile;
let base;
const shots = [];

before(async () => {
  server = await serve(0);
  base = `http://127.0.0.1:${server.address().port}`;
  profile = mkdtempSync(join(tmpdir(), 'stowplan-chromium-'));
  // A persistent context is how playwright takes a --user-data-dir: a fresh one per run.
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: FLAGS,
    acceptDownloads: true,
    viewport: { width: 1280, height: 1000 },
  });
});

after(async () => {
  await context?.close();
  await new Promise((ok) => (server ? server.close(ok) : ok()));
  if (profile) rmSync(profile, { recursive: true, force: true });
  if (shots.length) console.log(`explorer screenshots:\n${shots.map((s) => `  ${s}`).join('\n')}`);
});

/** Saves a full-page screenshot named `name` and remembers it for the report. */
async function shoot(page, name) {
  const path = join(SHOTS, name);
  await page.screenshot({ path, fullPage: true });
  shots.push(path);
}

/** The CLI's `balance --json` plan text and value for `lengths`. */
function cliPlan(lengths, args) {
  const text = execFileSync(requireCli(), ['balance', '-', '--json', ...args], {
    input: `${Array.from(lengths).join('\n')}\n`,
    encoding: 'utf8',
    maxBuffer: 1 << 28,
  });
  return [cliPlanText(text), JSON.parse(text)];
}

/** Opens the explorer (with `query`, the settings in the URL) and waits for its first plan. */
async function open(query = '') {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${base}/explorer/${query}`);
  await page.waitForSelector('body[data-ready="true"]');
  return { page, errors };
}

/** Fills the plan form and presses Plan. */
async function plan(page, { dp, cap, cost, cp = 1, tp = 1, order, ab }) {
  await page.fill('#dp', String(dp));
  await page.fill('#cap', cap === null ? '' : String(cap));
  await page.selectOption('#cost', cost);
  if (ab !== undefined) await page.fill('#cost-ab', ab);
  if (order !== undefined) await page.selectOption('#order', order);
  await page.fill('#cp', String(cp));
  await page.fill('#tp', String(tp));
  await page.click('#run');
}

/** The exported JSON text and file name (through the page's download). */
async function exported(page) {
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export')]);
  return [readFileSync(await download.path(), 'utf8'), download.suggestedFilename()];
}

/** A figure's text without thousands separators. */
async function fig(page, id) {
  return (await page.textContent(`#fig-${id}`)).replaceAll(',', '');
}

/** The `data-` attribute `key` of every element matching `selector`. */
async function data(page, selector, key) {
  return page.$$eval(selector, (els, k) => els.map((e) => e.dataset[k]), key);
}

/** What the page shows: its state, status line, and how much of each chart is drawn. */
async function shown(page) {
  return {
    state: await page.getAttribute('#results', 'data-state'),
    status: await page.textContent('#status'),
    chartsHidden: await page.isHidden('#charts'),
    rankColumns: await page.locator('#after .rank-col').count(),
    zoomedColumns: await page.locator('#ranks .rank-col').count(),
    microBatches: await page.locator('#fill .mb').count(),
    figures: await page.locator('#figures dd').count(),
    heatRanks: await page.getAttribute('#heatmap', 'data-ranks'),
    error: (await page.isVisible('#error')) ? await page.textContent('#error') : null,
    exportDisabled: await page.isDisabled('#export'),
  };
}

/** Asserts that no plan is drawn and that the status names `error`. */
async function assertFailed(page, error) {
  const s = await shown(page);
  assert.equal(s.state, 'error');
  assert.match(s.error, error);
  assert.equal(s.status, `Plan failed: ${s.error}`, 'the status line says what failed');
  assert.equal(s.chartsHidden, true, 'no chart is shown after a failed plan');
  assert.deepStrictEqual([s.rankColumns, s.zoomedColumns, s.microBatches, s.figures, s.heatRanks], [0, 0, 0, 0, null], 'every chart is cleared');
  assert.equal(s.exportDisabled, true, 'nothing to export');
  assert.match(await page.textContent('#summary'), /No plan is drawn: the last attempt failed/);
}

/** Asserts that a plan over `ranks` ranks is drawn and that the status says "Planned". */
async function assertPlanned(page, ranks) {
  const s = await shown(page);
  assert.equal(s.state, 'planned');
  assert.match(s.status, /^Planned /);
  assert.equal(s.error, null);
  assert.equal(s.chartsHidden, false);
  assert.equal(s.rankColumns, ranks);
  assert.equal(s.zoomedColumns, ranks);
  assert.ok(s.microBatches > 0 && s.figures > 0);
  assert.equal(s.heatRanks, String(ranks));
  assert.equal(s.exportDisabled, false);
}

test('it loads with a default plan drawn (rl-math-8k, 8 ranks, cap 16384, attention), its settings in the URL', async () => {
  const { page, errors } = await open();
  assert.equal(await page.textContent('#status'), 'Planned 4,096 lengths: 8 ranks, cap 16,384 tokens, attention cost.');
  await assertPlanned(page, 8);
  const q = new URL(page.url()).searchParams;
  assert.deepStrictEqual(Object.fromEntries(q), { workload: 'rl-math-8k', dp: '8', cap: '16384', cost: 'attention', order: 'none', cp: '1', tp: '1' });
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('rl-math-8k over 8 ranks, cap 16384, attention cost, cp 2 × tp 2: figures, charts and export identical to the CLI', async () => {
  const { page, errors } = await open();
  const sha = await page.textContent('#kernel');
  assert.ok(sha.includes(stowplan.kernelInfo().sha256), 'the page loaded the pinned component');
  await plan(page, { dp: 8, cap: 16384, cost: 'attention', cp: 2, tp: 2 });
  await page.waitForSelector('#fig-count');
  await assertPlanned(page, 8);
  // The CLI on the same lengths padded to the pad factor (2·cp·tp = 8).
  const factor = Number(stowplan.padFactor({ cp: 2, tp: 2 }));
  assert.equal(factor, 8);
  const padded = RAW.map((l) => Math.ceil(l / factor) * factor);
  const [wantText, want] = cliPlan(padded, ['--dp', '8', '--capacity', '16384', '--cost', 'attention']);
  const [text, name] = await exported(page);
  assert.equal(cliPlanText(text), wantText, 'the exported plan is byte-identical to the CLI plan');
  assert.equal(name, 'stowplan-plan-dp8-cap16384-padded8.json');
  assert.equal(await fig(page, 'n'), String(RAW.length));
  assert.equal(await fig(page, 'alignment'), String(padded.reduce((a, b) => a + b, 0) - RAW.reduce((a, b) => a + b, 0)));
  assert.equal(await fig(page, 'max-cost'), String(want.dp.cost_balance.max));
  assert.equal(await fig(page, 'cost-lower-bound'), String(want.dp.cost_lower_bound));
  assert.equal(await fig(page, 'cost-max-over-mean'), want.dp.cost_balance.max_over_mean.toFixed(5));
  assert.equal(await fig(page, 'token-spread'), String(want.dp.token_balance.spread));
  assert.equal(await fig(page, 'count'), String(want.count));
  assert.equal(await fig(page, 'largest-mb'), String(want.micro_batch_token_balance.max));
  const capSlots = 8 * want.count * 16384;
  const used = padded.reduce((a, b) => a + b, 0);
  assert.equal(await fig(page, 'cap-padding'), String(capSlots - used));
  // The balanced ranks: their costs, and on the zoomed chart their distance from the bound.
  const lb = BigInt(want.dp.cost_lower_bound);
  assert.deepStrictEqual(await data(page, '#after .rank-col', 'cost'), want.dp.costs.map(String));
  assert.deepStrictEqual(await data(page, '#ranks .rank-col', 'deviation'), want.dp.costs.map((c) => String(BigInt(c) - lb)));
  const labels = await page.locator('#ranks .rank-cost').allTextContents();
  assert.deepStrictEqual(labels.map((b) => b.replaceAll(',', '')), want.dp.costs.map(String));
  const note = await page.textContent('#ranks-note');
  assert.match(note, /^Zoomed axis: the cost minus the lower bound [\d,]+ .* from −[\d,]+ to \+[\d,]+ cost units/);
  // The input order: rank r takes samples ⌊r·n/8⌋ .. in order; the same bound, one scale for both.
  const n = padded.length;
  const beforeCosts = Array.from({ length: 8 }, (_, r) => padded.slice((r * n) / 8, ((r + 1) * n) / 8).reduce((a, l) => a + ATTENTION(l), 0n));
  assert.deepStrictEqual(await data(page, '#before .rank-col', 'cost'), beforeCosts.map(String));
  const u = want.dp.verl_unbalance;
  const fmt = (x) => BigInt(x).toLocaleString('en-US');
  assert.ok((await page.textContent('#before-after-note')).includes(
    `before ${fmt(u['global_seqlen/min'])}..${fmt(u['global_seqlen/max'])}, after ${fmt(u['global_seqlen/balanced_min'])}..${fmt(u['global_seqlen/balanced_max'])}`,
  ), 'the before/after note carries the CLI\'s "verl unbalance" figures');
  // Every rank's micro-batches: `count` columns per rank holding every sequence, each with its details.
  assert.equal(await page.locator('#fill .fill-rank').count(), 8);
  assert.equal(await page.locator('#fill .mb').count(), 8 * want.count);
  assert.equal(await page.locator('#fill .seq').count(), RAW.length);
  const seq = page.locator('#fill .seq').first();
  const i = Number(await seq.getAttribute('data-sample'));
  const title = await seq.getAttribute('title');
  const padding = padded[i] === RAW[i] ? '' : ` (padded to ${fmt(padded[i])})`;
  assert.equal(title, `sample ${i}: length ${fmt(RAW[i])}${padding}, cost ${fmt(ATTENTION(padded[i]))}; rank 0, micro-batch 0`);
  assert.match(await page.locator('#fill .mb').first().getAttribute('title'), /^rank 0, micro-batch 0: \d+ sequences, [\d,]+ of 16,384 tokens, cost [\d,]+$/);
  // The fill map: ranks × micro-batches, with hover details.
  assert.equal(await page.getAttribute('#heatmap', 'data-micro-batches'), String(want.count));
  await page.locator('#heatmap').hover({ position: { x: 2, y: 2 } });
  assert.match(await page.textContent('#heat-info'), /^rank 0, micro-batch 0: [\d,]+ of 16,384 tokens \([\d.]+%\), \d+ sequences, cost [\d,]+$/);
  assert.match(await page.textContent('#summary'), /4,096 sequences.* over 8 ranks, micro-batches ≤ 16,384 tokens, attention cost/);
  await shoot(page, 'explorer-dp8.png');
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('dp 64: a summary and a fill map instead of 64 rows, the page under 2,500 px tall', async () => {
  const { page, errors } = await open();
  await plan(page, { dp: 64, cap: 16384, cost: 'attention' });
  await assertPlanned(page, 64);
  const [, want] = cliPlan(RAW, ['--dp', '64', '--capacity', '16384', '--cost', 'attention']);
  assert.deepStrictEqual(await data(page, '#after .rank-col', 'cost'), want.dp.costs.map(String));
  const summary = await page.textContent('#summary');
  assert.match(summary, /^Summary4,096 sequences, [\d,]+ tokens, over 64 ranks, micro-batches ≤ 16,384 tokens, attention cost\./);
  assert.match(summary, /Balanced: the costliest rank costs \+[\d,]+ over the lower bound [\d,]+ .*In input order the costliest would be \+[\d,]+ over it/);
  assert.match(summary, new RegExp(`${want.count} micro-batches per rank`));
  assert.equal(await page.getAttribute('#heatmap', 'data-ranks'), '64');
  assert.equal(await page.getAttribute('#heatmap', 'data-micro-batches'), String(want.count));
  assert.equal(await page.locator('#ranks .rank-cost').count(), 0, 'no per-column labels at 64 ranks (hover titles instead)');
  // One rank's sequences at a time: the costliest first, another by clicking its row of the fill map.
  const costliest = want.dp.costs.indexOf(Math.max(...want.dp.costs));
  assert.deepStrictEqual(await data(page, '#fill .fill-rank', 'rank'), [String(costliest)]);
  assert.equal(await page.locator('#fill .mb').count(), want.count);
  const box = await page.locator('#heatmap').boundingBox();
  await page.locator('#heatmap').click({ position: { x: box.width * (40.5 / 64), y: 2 } });
  assert.deepStrictEqual(await data(page, '#fill .fill-rank', 'rank'), ['40']);
  assert.equal(await page.inputValue('#fill-rank'), '40');
  const height = await page.evaluate(() => document.documentElement.scrollHeight);
  assert.ok(height < MAX_HEIGHT_DP64, `the page at dp 64 is ${height} px tall (at most ${MAX_HEIGHT_DP64})`);
  await shoot(page, 'explorer-dp64.png');
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('error then recover: after a failure the charts are cleared and the status says why; after a fix, drawn and "Planned"', async () => {
  const { page, errors } = await open();
  await assertPlanned(page, 8);
  // An infeasible cap: the previous plan's charts must not stay.
  await plan(page, { dp: 8, cap: 100, cost: 'attention' });
  await assertFailed(page, /^InfeasibleError: infeasible: sequence \d+ has \d+ tokens, more than capacity = 100/);
  await shoot(page, 'explorer-error.png');
  await plan(page, { dp: 8, cap: 16384, cost: 'attention' });
  await assertPlanned(page, 8);
  // An invalid pasted length.
  await page.fill('#lengths', '100\n2x\n300');
  await page.click('#run');
  await assertFailed(page, /^Error: length 2 is not a non-negative integer: "2x"$/);
  await page.fill('#lengths', '100\n900\n50\n950\n400\n600');
  await plan(page, { dp: 2, cap: 1000, cost: 'tokens' });
  await assertPlanned(page, 2);
  assert.equal(await page.textContent('#status'), 'Planned 6 lengths: 2 ranks, cap 1,000 tokens, tokens cost.');
  // A setting edited after a plan greys the charts and says so until the next Plan.
  await page.fill('#dp', '3');
  assert.equal(await page.getAttribute('#results', 'data-state'), 'stale');
  assert.match(await page.textContent('#status'), /^The settings changed since this plan was drawn \(greyed\): press Plan/);
  await page.click('#run');
  await assertPlanned(page, 3);
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('the settings round-trip through the URL and are in the exported JSON', async () => {
  const { page, errors } = await open();
  const lengths = [100, 900, 50, 950, 400, 600, 10, 20];
  await page.fill('#lengths', lengths.join('\n'));
  await plan(page, { dp: 2, cap: 1000, cost: 'custom', ab: '3,1', order: 'verl', cp: 1, tp: 2 });
  await assertPlanned(page, 2);
  const url = page.url();
  assert.deepStrictEqual(Object.fromEntries(new URL(url).searchParams), {
    lengths: lengths.join(','), dp: '2', cap: '1000', cost: 'custom', ab: '3,1', order: 'verl', cp: '1', tp: '2',
  });
  const [text, name] = await exported(page);
  const padded = lengths.map((l) => Math.ceil(l / 2) * 2);
  assert.equal(cliPlanText(text), cliPlan(padded, ['--dp', '2', '--capacity', '1000', '--cost', '3,1', '--order', 'verl'])[0]);
  assert.equal(name, 'stowplan-plan-dp2-cap1000-padded2.json');
  const json = JSON.parse(text);
  assert.deepStrictEqual(
    { operation: json.operation, source: json.source, n: json.n, dp_size: json.dp_size, capacity: json.capacity, cost: json.cost },
    { operation: 'balance', source: 'pasted lengths', n: 8, dp_size: 2, capacity: 1000, cost: { linear: 3, quadratic: 1 } },
  );
  assert.deepStrictEqual(json.settings, {
    workload: null, lengths_in_url: true, dp: 2, cap: 1000, cost: 'custom', cost_ab: '3,1', order: 'verl', cp: 1, tp: 2, pad_factor: 2, url,
  });
  assert.equal(json.kernel_sha256, stowplan.kernelInfo().sha256);
  // The URL in a fresh page: the same fields, the same plan drawn, the same export.
  const again = await open(new URL(url).search);
  await assertPlanned(again.page, 2);
  const fields = async (p) => Promise.all(['#dp', '#cap', '#cost', '#cost-ab', '#order', '#cp', '#tp', '#workload'].map((s) => p.inputValue(s)));
  assert.deepStrictEqual(await fields(again.page), ['2', '1000', 'custom', '3,1', 'verl', '1', '2', '']);
  assert.equal(await again.page.inputValue('#lengths'), lengths.join('\n'));
  assert.equal(await again.page.isVisible('#custom-cost'), true);
  const [text2] = await exported(again.page);
  assert.equal(text2.replace('"source":"the URL"', '"source":"pasted lengths"'), text, 'the reloaded page exports the same plan and settings');
  assert.deepStrictEqual(again.errors, []);
  await again.page.close();
  // A built-in workload, DP level only (an empty cap is a setting too).
  await page.selectOption('#workload', 'rl-math-8k');
  await page.waitForFunction(() => document.querySelector('#lengths-summary').textContent.includes('rl-math-8k'));
  await plan(page, { dp: 4, cap: null, cost: 'tokens', order: 'none' });
  const dpOnly = new URL(page.url()).search;
  assert.equal(dpOnly, '?workload=rl-math-8k&dp=4&cap=&cost=tokens&order=none&cp=1&tp=1');
  const third = await open(dpOnly);
  assert.equal(await third.page.getAttribute('#results', 'data-state'), 'planned');
  assert.equal(await third.page.inputValue('#cap'), '');
  assert.equal(await third.page.isVisible('#no-mb'), true);
  assert.equal(await third.page.locator('#after .rank-col').count(), 4);
  const [text3] = await exported(third.page);
  assert.deepStrictEqual(JSON.parse(text3).settings, {
    workload: 'rl-math-8k', lengths_in_url: true, dp: 4, cap: null, cost: 'tokens', cost_ab: null, order: 'none', cp: 1, tp: 1, pad_factor: 1, url: `${base}/explorer/${dpOnly}`,
  });
  assert.equal(cliPlanText(text3), cliPlan(RAW, ['--dp', '4'])[0]);
  await third.page.close();
  // A URL the page cannot take: an error naming the parameter, nothing drawn.
  const bad = await open('?workload=rl-math-8k&dp=8&cost=quadratic');
  await assertFailed(bad.page, /^Error: the URL's settings: cost="quadratic" is not one of tokens, attention, custom$/);
  await bad.page.close();
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('pasted lengths: DP level only and micro-batches only, each export identical to the CLI', async () => {
  const { page, errors } = await open();
  const lengths = [100, 900, 50, 950, 400, 600, 10, 20];
  await page.fill('#lengths', lengths.join('\n'));
  await plan(page, { dp: 2, cap: null, cost: 'tokens', cp: 1, tp: 1 });
  await page.waitForSelector('#fig-max-cost');
  assert.equal(cliPlanText((await exported(page))[0]), cliPlan(lengths, ['--dp', '2'])[0]);
  await plan(page, { dp: 1, cap: 1000, cost: 'attention', cp: 1, tp: 1 });
  await page.waitForSelector('#fig-count');
  assert.equal(await page.textContent('#status'), 'Planned 8 lengths: one rank, cap 1,000 tokens, attention cost.');
  assert.equal(await page.isHidden('#dp-charts'), true, 'one rank: no balancing to chart');
  assert.equal(cliPlanText((await exported(page))[0]), cliPlan(lengths, ['--capacity', '1000', '--cost', 'attention'])[0]);
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('bad input is shown, naming the argument, and nothing is exported', async () => {
  const { page } = await open();
  await plan(page, { dp: 2, cap: 100, cost: 'tokens', cp: 1, tp: 1 });
  await assertFailed(page, /^InfeasibleError: infeasible: sequence \d+ has \d+ tokens, more than capacity = 100/);
  await plan(page, { dp: 8, cap: 16384, cost: 'tokens', cp: 70000, tp: 1 });
  assert.equal(await page.textContent('#error'), 'InvalidArgumentError: cp must be in 1..=65536 (got 70000)');
  await assertFailed(page, /^InvalidArgumentError: cp must be in 1\.\.=65536 \(got 70000\)$/);
  await page.close();
});

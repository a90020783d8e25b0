// The plan explorer in a real headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; no browser is downloaded): plans a workload in the page, compares the
// figures shown and the exported JSON with the CLI's, and saves a screenshot
// (sdk-js/test-results/explorer.png). Run by run_tests.sh where chromium exists.
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

let server;
let context;
let profile;
let base;

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
    viewport: { width: 1280, height: 1400 },
  });
});

after(async () => {
  await context?.close();
  await new Promise((ok) => (server ? server.close(ok) : ok()));
  if (profile) rmSync(profile, { recursive: true, force: true });
});

/** The CLI's `balance --json` plan text for `lengths`. */
function cliPlan(lengths, args) {
  const text = execFileSync(requireCli(), ['balance', '-', '--json', ...args], {
    input: `${Array.from(lengths).join('\n')}\n`,
    encoding: 'utf8',
    maxBuffer: 1 << 28,
  });
  return [cliPlanText(text), JSON.parse(text)];
}

/** Opens the explorer and waits for the kernel to load in the page. */
async function open() {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${base}/explorer/`);
  await page.waitForSelector('body[data-ready="true"]');
  return { page, errors };
}

/** Fills the plan form. */
async function plan(page, { dp, cap, cost, cp, tp }) {
  await page.fill('#dp', String(dp));
  await page.fill('#cap', cap === null ? '' : String(cap));
  await page.selectOption('#cost', cost);
  await page.fill('#cp', String(cp));
  await page.fill('#tp', String(tp));
  await page.click('#run');
}

/** The exported JSON text (through the page's download). */
async function exported(page) {
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export')]);
  return [readFileSync(await download.path(), 'utf8'), download.suggestedFilename()];
}

/** A figure's text without thousands separators. */
async function fig(page, id) {
  return (await page.textContent(`#fig-${id}`)).replaceAll(',', '');
}

test('rl-math-8k over 8 ranks, cap 16384, attention cost, cp 2 × tp 2: figures and export identical to the CLI', async () => {
  const { page, errors } = await open();
  const sha = await page.textContent('#kernel');
  assert.ok(sha.includes(stowplan.kernelInfo().sha256), 'the page loaded the pinned component');
  await plan(page, { dp: 8, cap: 16384, cost: 'attention', cp: 2, tp: 2 });
  await page.waitForSelector('#fig-count');
  // The CLI on the same lengths padded to the pad factor (2·cp·tp = 8).
  const raw = readFileSync(join(PKG, 'generated/workloads/rl-math-8k.txt'), 'utf8').trim().split('\n').map(Number);
  const factor = Number(stowplan.padFactor({ cp: 2, tp: 2 }));
  assert.equal(factor, 8);
  const padded = raw.map((l) => Math.ceil(l / factor) * factor);
  const [wantText, want] = cliPlan(padded, ['--dp', '8', '--max-token-len', '16384', '--cost', 'attention']);
  const [text, name] = await exported(page);
  assert.equal(text, wantText, 'the exported plan is byte-identical to the CLI plan');
  assert.equal(name, 'stowplan-plan-dp8-cap16384-padded8.json');
  assert.equal(await fig(page, 'n'), String(raw.length));
  assert.equal(await fig(page, 'alignment'), String(padded.reduce((a, b) => a + b, 0) - raw.reduce((a, b) => a + b, 0)));
  assert.equal(await fig(page, 'max-cost'), String(want.dp.cost_balance.max));
  assert.equal(await fig(page, 'cost-lower-bound'), String(want.dp.cost_lower_bound));
  assert.equal(await fig(page, 'cost-max-over-mean'), want.dp.cost_balance.max_over_mean.toFixed(5));
  assert.equal(await fig(page, 'token-spread'), String(want.dp.token_balance.spread));
  assert.equal(await fig(page, 'count'), String(want.count));
  assert.equal(await fig(page, 'largest-mb'), String(want.micro_batch_token_balance.max));
  const capSlots = 8 * want.count * 16384;
  const used = padded.reduce((a, b) => a + b, 0);
  assert.equal(await fig(page, 'cap-padding'), String(capSlots - used));
  // The charts: one cost bar per rank; per rank `count` micro-batch columns holding every sequence.
  assert.equal(await page.locator('#ranks .rank-row').count(), 8);
  const bars = await page.locator('#ranks .rank-cost').allTextContents();
  assert.deepStrictEqual(bars.map((b) => b.replaceAll(',', '')), want.dp.costs.map(String));
  assert.equal(await page.locator('#fill .fill-rank').count(), 8);
  assert.equal(await page.locator('#fill .mb').count(), 8 * want.count);
  assert.equal(await page.locator('#fill .seq').count(), raw.length);
  mkdirSync(join(PKG, 'test-results'), { recursive: true });
  await page.screenshot({ path: join(PKG, 'test-results/explorer.png'), fullPage: true });
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('pasted lengths: DP level only and micro-batches only, each export identical to the CLI', async () => {
  const { page, errors } = await open();
  const lengths = [100, 900, 50, 950, 400, 600, 10, 20];
  await page.fill('#lengths', lengths.join('\n'));
  await plan(page, { dp: 2, cap: null, cost: 'tokens', cp: 1, tp: 1 });
  await page.waitForSelector('#fig-max-cost');
  assert.equal((await exported(page))[0], cliPlan(lengths, ['--dp', '2'])[0]);
  await plan(page, { dp: 1, cap: 1000, cost: 'attention', cp: 1, tp: 1 });
  await page.waitForSelector('#fig-count');
  assert.equal((await exported(page))[0], cliPlan(lengths, ['--max-token-len', '1000', '--cost', 'attention'])[0]);
  assert.deepStrictEqual(errors, []);
  await page.close();
});

test('bad input is shown, naming the argument, and nothing is exported', async () => {
  const { page } = await open();
  await plan(page, { dp: 2, cap: 100, cost: 'tokens', cp: 1, tp: 1 });
  assert.match(await page.textContent('#error'), /^InfeasibleError: infeasible: sequence \d+ has \d+ tokens, more than max_token_len = 100/);
  assert.equal(await page.isDisabled('#export'), true);
  await plan(page, { dp: 8, cap: 16384, cost: 'tokens', cp: 70000, tp: 1 });
  assert.equal(await page.textContent('#error'), 'InvalidArgumentError: cp must be in 1..=65536 (got 70000)');
  await page.close();
});

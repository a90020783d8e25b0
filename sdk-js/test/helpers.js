// Shared by the tests: where the repository's files are, an exact JSON reader, and value
// normalization for comparisons.
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** sdk-js/ */
export const PKG = resolve(dirname(fileURLToPath(import.meta.url)), '..');
/** The repository root. */
export const ROOT = resolve(PKG, '..');
/** tests/vectors */
export const VECTORS = join(ROOT, 'tests/vectors');
/** The shared workloads (../shared/workloads beside the checkout), or STOWPLAN_WORKLOADS. */
export const WORKLOADS = process.env.STOWPLAN_WORKLOADS ?? resolve(ROOT, '../shared/workloads');
/** The CLI the JavaScript results are compared with. */
export const CLI = process.env.STOWPLAN_BIN ?? join(ROOT, 'target/release/stowplan');

/**
 * JSON text parsed exactly: integers beyond 2**53-1 become bigints (JSON.parse would round
 * them), everything else as JSON.parse gives it.
 * @param {string} text
 */
export function parseExact(text) {
  let out = '';
  let i = 0;
  const n = text.length;
  while (i < n) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (j < n && text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j + 1;
    } else if (c === '-' || (c >= '0' && c <= '9')) {
      let j = i + 1;
      while (j < n && /[0-9eE.+-]/.test(text[j])) j++;
      const token = text.slice(i, j);
      const isInt = /^-?\d+$/.test(token);
      out += isInt && !Number.isSafeInteger(Number(token)) ? `"\\u0000big:${token}"` : token;
      i = j;
    } else {
      out += c;
      i++;
    }
  }
  return JSON.parse(out, (_, v) => (typeof v === 'string' && v.startsWith('\u0000big:') ? BigInt(v.slice(5)) : v));
}

/** Every `*.json` directly in `dir`, sorted by name, parsed exactly: [[file, value]]. */
export function loadDir(dir) {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json') && f !== 'index.json')
    .sort()
    .map((f) => [f, parseExact(readFileSync(join(dir, f), 'utf8'))]);
}

/**
 * A value with typed arrays as arrays and every integer as a bigint where it is one (numbers
 * that are integers become bigints too), so results and JSON compare with deepStrictEqual.
 */
export function norm(v) {
  if (typeof v === 'bigint') return v;
  if (typeof v === 'number') return Number.isInteger(v) ? BigInt(v) : v;
  if (ArrayBuffer.isView(v)) return Array.from(/** @type {any} */ (v), norm);
  if (Array.isArray(v)) return v.map(norm);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, norm(x)]));
  return v;
}

/** Lengths of a workload file (one integer per line). */
export function workload(name) {
  const path = join(WORKLOADS, name);
  if (!existsSync(path)) throw new Error(`workload ${path} is missing: put shared/ beside the checkout or set STOWPLAN_WORKLOADS`);
  const text = readFileSync(path, 'utf8');
  const out = [];
  for (const line of text.split('\n')) {
    const t = line.trim();
    if (t) out.push(Number(t));
  }
  return Uint32Array.from(out);
}

/**
 * vlm-mix-100k.tsv as columns: `tokens`, and `resources` (`image_tokens`, `images`), one
 * entry per sample (the header names the columns).
 */
export function vlmTable() {
  const text = readFileSync(join(WORKLOADS, 'vlm-mix-100k.tsv'), 'utf8');
  const rows = text.trim().split('\n').slice(1).map((l) => l.split('\t').map(Number));
  return {
    tokens: rows.map((r) => r[0]),
    resources: { image_tokens: rows.map((r) => r[1]), images: rows.map((r) => r[2]) },
  };
}

/** Whether the CLI is there (the tests comparing with it fail, naming how to build it, when not). */
export function requireCli() {
  if (!existsSync(CLI)) {
    throw new Error(`${CLI} is missing: build it with cargo build --release --locked -p stowplan-cli --bin stowplan, or set STOWPLAN_BIN`);
  }
  return CLI;
}

/** The keys of a plan in the CLI's balance JSON (the run's keys follow, from "operation"). */
const PLAN_KEYS = ['dp', 'micro_batches', 'count', 'micro_batch_token_balance', 'micro_batch_cost_balance'];

/** The plan part of `stowplan balance --json`'s text: its keys before "operation". */
export function cliPlanText(text) {
  const at = text.indexOf(',"operation":');
  if (at <= 0) throw new Error('the CLI JSON does not start with the plan followed by "operation"');
  const keys = Object.keys(JSON.parse(text));
  const plan = keys.slice(0, keys.indexOf('operation'));
  if (!plan.length || plan.some((k) => !PLAN_KEYS.includes(k))) throw new Error(`unexpected plan keys in the CLI JSON: ${plan}`);
  return `${text.slice(0, at)}}`;
}

/** A seeded generator of integers in `lo..=hi` (mulberry32). */
export function rng(seed) {
  let a = seed >>> 0;
  return (lo, hi) => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return lo + (((t ^ (t >>> 14)) >>> 0) % (hi - lo + 1));
  };
}

// Checking the options of every entry point and turning them into the kernel's: the kernel's
// names, cost presets, limits and defaults (from the build manifest, generated from the
// kernel's source), and the checks of the options made of several values (a cost, a table of
// resources, the alignment rule, group labels).
import { InvalidArgumentError } from './errors.js';
import { bool, checkEntries, given, oneOf, u32, u64, u64Array } from './convert.js';
import { LIMITS, SEGMENTS, STREAM } from '../generated/manifest.js';

export { SEGMENTS, STREAM };

/** The kernel's named cost models: a sequence of L tokens costs `linear·L + quadratic·L²`. */
export const COSTS = Object.freeze({
  tokens: Object.freeze([1n, 0n]),
  attention: Object.freeze([24576n, 1n]),
});

/** The most groups, ranks or micro-batches a kernel call sizes a result by (the kernel's, 2**20). */
export const MAX_COUNT = LIMITS.MAX_COUNT;
/** The largest cp or tp (the kernel's, 2**16). */
export const MAX_PARALLEL = LIMITS.MAX_PARALLEL;
/** The oversize policies, the kernel's names. */
export const OVERSIZE = ['error', 'single', 'drop'];
/** The packing algorithms, the kernel's names. */
export const PACK_METHODS = ['bfd', 'ffd', 'next-fit'];
/** The most resources (limits besides the segment count) of `packMulti` (the kernel's, 8). */
export const MAX_RESOURCES = LIMITS.MAX_RESOURCES;

/** A cost option: a preset name or a `[linear, quadratic]` pair of integers. */
export function costOption(cost, name = 'cost') {
  if (!given(cost)) return { linear: 1n, quadratic: 0n };
  if (typeof cost === 'string') {
    if (!(cost in COSTS)) {
      throw new InvalidArgumentError(`${name} must be 'tokens' or 'attention' or a [linear, quadratic] pair of integers (got ${JSON.stringify(cost)})`);
    }
    const [linear, quadratic] = COSTS[/** @type {keyof COSTS} */ (cost)];
    return { linear, quadratic };
  }
  if (Array.isArray(cost) && cost.length === 2) {
    return { linear: u64(cost[0], `${name} linear coefficient`), quadratic: u64(cost[1], `${name} quadratic coefficient`) };
  }
  throw new InvalidArgumentError(`${name} must be 'tokens' or 'attention' or a [linear, quadratic] pair of integers (got ${typeof cost})`);
}

/** The options `pack` and `packMulti` share (align, method, oversize), with the host's defaults. */
export function packOptions(o) {
  return {
    align: given(o.align) ? u64(o.align, 'align', 1n) : 1n,
    method: given(o.method) ? oneOf(o.method, 'method', PACK_METHODS) : 'bfd',
    oversize: given(o.oversize) ? oneOf(o.oversize, 'oversize', OVERSIZE) : 'error',
  };
}

/** The [key, value] pairs of an object or Map argument of `packMulti`, keys checked to be names. */
function namedEntries(v, name, what) {
  let entries;
  if (v instanceof Map) entries = [...v];
  else if (v && typeof v === 'object' && !Array.isArray(v) && !ArrayBuffer.isView(v)) entries = Object.entries(v);
  else {
    const got = Array.isArray(v) ? `an array of ${v.length}` : v === null ? 'null' : typeof v;
    throw new InvalidArgumentError(`${name} must be an object or a Map of resource name → ${what} (got ${got})`);
  }
  for (const [key] of entries) {
    if (typeof key !== 'string') {
      throw new InvalidArgumentError(`${name}' keys must be resource names (strings), got ${typeof key === 'bigint' ? `${key}n` : String(key)}`);
    }
  }
  return entries;
}

/**
 * The table of `packMulti`: the names, each column's sizes, each capacity, checked and
 * matched by name (errors name `columns['…']` and `capacities['…']`).
 */
export function resourceTable(columns, capacities) {
  const cols = namedEntries(columns, 'columns', 'sizes');
  const caps = new Map(namedEntries(capacities, 'capacities', 'capacity'));
  if (cols.length === 0 || cols.length > MAX_RESOURCES) {
    throw new InvalidArgumentError(`columns must name 1 to ${MAX_RESOURCES} resources (got ${cols.length})`);
  }
  const names = cols.map(([name]) => name);
  const capacity = [];
  const sizes = [];
  for (const [name, values] of cols) {
    if (!caps.has(name)) throw new InvalidArgumentError(`capacities has no entry for column '${name}'`);
    capacity.push(u64(caps.get(name), `capacities['${name}']`, 1n));
    sizes.push(u64Array(values, `columns['${name}']`));
  }
  for (const key of caps.keys()) {
    if (!names.includes(key)) {
      throw new InvalidArgumentError(`capacities['${key}'] has no column of sizes in columns (columns: ${names.join(', ')})`);
    }
  }
  const n = sizes[0].length;
  const q = sizes.findIndex((c) => c.length !== n);
  if (q >= 0) {
    throw new InvalidArgumentError(`columns['${names[q]}'] has ${sizes[q].length} sizes, columns['${names[0]}'] ${n}: one per item in each`);
  }
  return { names, capacity, sizes, n };
}

/** The kernel's sizes list of a table: item by item, a row of its sizes in every resource. */
export function rows(sizes, n) {
  const r = sizes.length;
  if (r === 1) return sizes[0];
  checkEntries(n * r, 'columns (all their sizes together)', 8);
  const out = new BigUint64Array(n * r);
  for (let q = 0; q < r; q++) {
    const c = sizes[q];
    for (let i = 0; i < n; i++) out[i * r + q] = c[i];
  }
  return out;
}

/** Micro-batch options shared by `microBatches` and `balance`. */
export function microOptions(maxTokenLen, cost, o) {
  const divisibleBy = given(o.divisibleBy) ? u32(o.divisibleBy, 'divisibleBy', 1, MAX_COUNT) : 1;
  return {
    maxTokenLen: u64(maxTokenLen, 'maxTokenLen', 1n),
    cost,
    minCount: given(o.minCount) ? u32(o.minCount, 'minCount', 0, MAX_COUNT) : 0,
    divisibleBy,
    count: given(o.count) ? u32(o.count, 'count', 1, MAX_COUNT) : undefined,
    order: given(o.order) ? oneOf(o.order, 'order', ['none', 'cost-desc', 'verl', 'roll']) : 'none',
  };
}

/** Alignment options of `padFactor` and `cpLayout`. */
export function alignOptions(o, cpDefault) {
  const cp = given(o.cp) ? u32(o.cp, 'cp', 1, MAX_PARALLEL) : cpDefault;
  const tp = given(o.tp) ? u32(o.tp, 'tp', 1, MAX_PARALLEL) : 1;
  let factor = { tag: 'cp-tp' };
  if (given(o.align)) {
    if (o.align === 'cp_tp' || o.align === 'cp-tp') factor = { tag: 'cp-tp' };
    else if (o.align === 'roll') factor = { tag: 'roll' };
    else if (typeof o.align === 'string') {
      throw new InvalidArgumentError(`align must be 'cp_tp', 'roll' or a positive integer (got ${JSON.stringify(o.align)})`);
    } else factor = { tag: 'multiple', val: u64(o.align, 'align', 1n) };
  }
  return { cp, tp, factor, powerOfTwo: given(o.powerOfTwo) ? bool(o.powerOfTwo, 'powerOfTwo') : false };
}

/** Labels (any values) → dense u32 ids, one per sample. */
export function labelIds(groups, n) {
  if (!groups || typeof groups === 'string' || typeof groups[Symbol.iterator] !== 'function') {
    throw new InvalidArgumentError('groups must be a sequence of labels, one per sample');
  }
  const mismatch = (got) => new InvalidArgumentError(`groups must hold one label per sample (${n}; got ${got})`);
  // An array's length is compared before anything is read or allocated; another iterable is
  // read up to one label too many.
  let values;
  if (Array.isArray(groups) || ArrayBuffer.isView(groups)) {
    if (groups.length !== n) throw mismatch(groups.length);
    values = groups;
  } else {
    values = [];
    for (const v of groups) {
      if (values.length === n) throw mismatch(`more than ${n}`);
      values.push(v);
    }
    if (values.length !== n) throw mismatch(values.length);
  }
  const ids = new Map();
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const v = values[i];
    if (!ids.has(v)) ids.set(v, ids.size);
    out[i] = ids.get(v);
  }
  return out;
}

// Checking the options of every entry point and turning them into the kernel's: the kernel's
// names, cost presets, limits and defaults (from the build manifest, generated from the
// kernel's source), and the checks of the options made of several values (a cost, a table of
// resources, the alignment rule, group labels).
import { InvalidArgumentError } from './errors.js';
import { bool, checkEntries, given, oneOf, show, u32, u64, u64Array } from './convert.js';
import { COST_PRESETS, DEFAULTS, LIMITS, NAMES, OPTION_TYPES, SEGMENTS, STREAM } from '../generated/manifest.js';

export { DEFAULTS, SEGMENTS };

/**
 * The kernel's named cost models: a sequence of L tokens costs `linear·L + quadratic·L²`
 * (kernel/src/names.rs COST_PRESETS).
 */
export const COSTS = COST_PRESETS;

/** The most groups, ranks or micro-batches a kernel call sizes a result by (kernel/src/lib.rs). */
export const MAX_COUNT = LIMITS.MAX_COUNT;
/** The largest cp or tp (kernel/src/layout.rs). */
const MAX_PARALLEL = LIMITS.MAX_PARALLEL;
/** The most resources (limits besides the segment count) of `packMulti` (kernel/src/multi/mod.rs). */
const MAX_RESOURCES = LIMITS.MAX_RESOURCES;

/** `'a' or 'b' or …` of the cost presets' names, for messages. */
const PRESET_NAMES = Object.keys(COSTS).map((name) => `'${name}'`).join(' or ');

/** A cost option: a preset name or a `[linear, quadratic]` pair of integers (omitted: `preset`). */
export function costOption(cost, preset, name = 'cost') {
  if (!given(cost)) cost = preset;
  if (typeof cost === 'string') {
    if (!(cost in COSTS)) {
      throw new InvalidArgumentError(`${name} must be ${PRESET_NAMES} or a [linear, quadratic] pair of integers (got ${JSON.stringify(cost)})`);
    }
    const [linear, quadratic] = COSTS[/** @type {keyof COSTS} */ (cost)];
    return { linear, quadratic };
  }
  if (Array.isArray(cost) && cost.length === 2) {
    return { linear: u64(cost[0], `${name} linear coefficient`), quadratic: u64(cost[1], `${name} quadratic coefficient`) };
  }
  throw new InvalidArgumentError(`${name} must be ${PRESET_NAMES} or a [linear, quadratic] pair of integers (got ${typeof cost})`);
}

/** `o[key]` if given (checked by `check`), else the kernel's `fallback`. */
function or(o, key, check, fallback) {
  return given(o[key]) ? check(o[key], key) : fallback;
}

/** An `align` option (≥ 1), else the kernel's default `fallback`. */
function alignOption(o, fallback) {
  return or(o, 'align', (v, key) => u64(v, key, 1n), fallback);
}

/** The options of `partition`: the kernel's (`kernelOptions`), but verl never refines unless asked. */
export function partitionOptions(o) {
  const out = kernelOptions(o, 'PartitionOptions');
  // verl's output is reproduced as is: not refined unless asked (which the kernel refuses).
  if (out.method === 'verl' && !given(o.refine)) out.refine = false;
  return out;
}

/** `snake_case` → `camelCase`. */
const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

/**
 * An unsigned integer option through `check` (at most `max`): the kernel checks its lower
 * bound and says it, so this says only what it must be to reach the kernel.
 */
function unsigned(check, max) {
  return (v, key) => {
    try {
      return check(v, key);
    } catch (e) {
      if (!(e instanceof InvalidArgumentError)) throw e;
      const whole = typeof v === 'bigint' || Number.isInteger(v);
      throw new InvalidArgumentError(whole ? `${key} must not be negative or above ${max} (got ${show(v)})` : `${key} must be an integer (got ${show(v)})`);
    }
  };
}

/** The check of an option of Rust type `rust` (build manifest): an integer, a bool or a named enum. */
function fieldCheck(rust, type, field) {
  if (rust === 'u64') return unsigned((v, key) => u64(v, key), '2**64-1');
  if (rust === 'u32') return unsigned((v, key) => u32(v, key), '2**32-1');
  if (rust === 'bool') return bool;
  if (Object.hasOwn(NAMES, rust)) return (v, key) => oneOf(v, key, NAMES[rust]);
  throw new Error(`the build manifest's ${type}.${field} has Rust type ${rust}, which options.js cannot check yet: teach it`);
}

/**
 * The option keys of the kernel options struct `type` whose every field is an option (the
 * build manifest's `OPTION_TYPES`, read from the kernel's source), camelCase.
 */
export function optionKeys(type) {
  return Object.keys(OPTION_TYPES[type]).map(camel);
}

/**
 * The options `o` of the kernel options struct `type`, field by field from the build
 * manifest (the kernel's fields, Rust types and defaults): each camelCase key of `o` checked
 * by its type, an omitted one the kernel's default; the kernel checks the ranges (and names
 * the option). A field the kernel adds is an option here without an edit.
 */
export function kernelOptions(o, type) {
  /** @type {Record<string, any>} */
  const out = {};
  for (const [field, rust] of Object.entries(OPTION_TYPES[type])) {
    out[camel(field)] = or(o, camel(field), fieldCheck(rust, type, field), DEFAULTS[type][field]);
  }
  return out;
}

/**
 * The options `packMulti` shares with `pack` (align, method, oversize), with the kernel's
 * defaults; its methods are `NAMES.MultiMethod`, whose first, `balanced`, is its default.
 */
export function packMultiOptions(o) {
  const d = DEFAULTS.PackOptions;
  const methods = NAMES.MultiMethod;
  return {
    align: alignOption(o, d.align),
    method: or(o, 'method', (v, key) => oneOf(v, key, methods), methods[0]),
    oversize: or(o, 'oversize', (v, key) => oneOf(v, key, NAMES.OversizePolicy), d.oversize),
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

/**
 * The limits of `microBatches` and `balance` (`resources` with `limits`), or undefined
 * without them; one given without the other is refused.
 * @param {any} o the call's options @param {number} n the number of sequences
 */
export function microLimits(o, n) {
  if (!given(o.resources) && !given(o.limits)) return undefined;
  if (!given(o.limits)) throw new InvalidArgumentError('resources needs limits (the cap of each resource)');
  if (!given(o.resources)) throw new InvalidArgumentError("limits needs resources (the sequences' sizes in each)");
  return limitRows(o.resources, o.limits, n);
}

/**
 * The further limits of `microBatches` (`resources`: name → one size per sequence, `limits`:
 * the same names → cap) as the kernel's `balance.limits`: sizes sequence by sequence, caps
 * and names in `resources`' order. Errors name the key, as Python's `micro_batches` does.
 */
export function limitRows(resources, limits, n) {
  const most = MAX_RESOURCES - 1;
  const cols = namedEntries(resources, 'resources', 'sizes');
  const caps = new Map(namedEntries(limits, 'limits', 'cap'));
  if (cols.length === 0 || cols.length > most) {
    throw new InvalidArgumentError(`resources must name 1 to ${most} resources (got ${cols.length})`);
  }
  for (const [what, keys] of [['resources', cols.map(([k]) => k)], ['limits', [...caps.keys()]]]) {
    if (keys.includes('tokens')) {
      throw new InvalidArgumentError(`${what}['tokens']: the tokens are lengths and their cap (capacity), not a further limit`);
    }
  }
  const names = cols.map(([name]) => name);
  const capList = [];
  const sizes = [];
  for (const [name, values] of cols) {
    if (!caps.has(name)) throw new InvalidArgumentError(`limits has no cap for resources['${name}']`);
    capList.push(u64(caps.get(name), `limits['${name}']`, 1n));
    sizes.push(resourceColumn(name, values, n, 'sequence'));
  }
  for (const key of caps.keys()) {
    if (!names.includes(key)) {
      throw new InvalidArgumentError(`limits['${key}'] has no sizes in resources (resources: ${names.join(', ')})`);
    }
  }
  return { sizes: rows(sizes, n), caps: BigUint64Array.from(capList), names };
}

/** `resources[name]`'s sizes, one per each of `n` items (`what`: an item's word in messages). */
function resourceColumn(name, values, n, what) {
  const col = u64Array(values, `resources['${name}']`);
  if (col.length !== n) {
    throw new InvalidArgumentError(`resources['${name}'] has ${col.length} sizes, lengths ${n}: one per ${what}`);
  }
  return col;
}

/**
 * The rows of a limited `StreamPacker#add`: each item's length, then its size in each of the
 * packer's limits (`names`, in the packer's order). `resources` must name exactly those limits
 * (none for a packer with a segment limit alone).
 */
export function streamRows(lengths, resources, names) {
  const n = lengths.length;
  if (names.length === 0) {
    if (given(resources)) throw new InvalidArgumentError('resources given to a packer without limits (streamPacker({limits}))');
    return lengths;
  }
  if (!given(resources)) {
    throw new InvalidArgumentError(`resources needs every limit's sizes (${names.join(', ')}), one per length`);
  }
  const cols = new Map(namedEntries(resources, 'resources', 'sizes'));
  for (const key of cols.keys()) {
    if (!names.includes(key)) {
      throw new InvalidArgumentError(`resources['${key}'] is not one of the packer's limits (${names.join(', ')})`);
    }
  }
  const sizes = names.map((name) => {
    if (!cols.has(name)) throw new InvalidArgumentError(`resources has no sizes for limits['${name}']`);
    return resourceColumn(name, cols.get(name), n, 'length');
  });
  return rows([lengths, ...sizes], n);
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

/** Micro-batch options shared by `microBatches` and `balance`, with the kernel's defaults. */
export function microOptions(capacity, cost, o) {
  const d = DEFAULTS.MicroOptions;
  const count = (low) => (v, key) => u32(v, key, low, MAX_COUNT);
  const divisibleBy = or(o, 'divisibleBy', count(1), d.divisible_by);
  return {
    capacity: u64(capacity, 'capacity', 1n),
    cost,
    minCount: or(o, 'minCount', count(0), d.min_count),
    divisibleBy,
    count: or(o, 'count', count(1), undefined),
    order: or(o, 'order', (v, key) => oneOf(v, key, NAMES.Order), d.order),
  };
}

/** The DP options of `balance` (n samples), with the kernel's defaults. */
export function dpOptions(cost, o, n) {
  return {
    cost,
    groups: given(o.groups) ? labelIds(o.groups, n) : undefined,
    minibatchSize: or(o, 'minibatchSize', (v, key) => u32(v, key, 1), undefined),
    equalCount: or(o, 'equalCount', bool, DEFAULTS.DpOptions.equal_count),
    extraCosts: given(o.extraCosts) ? u64Array(o.extraCosts, 'extraCosts') : undefined,
  };
}

/**
 * Alignment options of `padFactor` and `cpLayout`, with the kernel's defaults (cp and tp 1: no
 * parallelism; the factor rule `cp_tp`).
 */
export function alignOptions(o) {
  const parallel = (v, key) => u32(v, key, 1, MAX_PARALLEL);
  const d = DEFAULTS.AlignOptions;
  const cp = or(o, 'cp', parallel, d.cp);
  const tp = or(o, 'tp', parallel, d.tp);
  let factor = { tag: 'cp-tp' };
  if (given(o.align)) {
    if (o.align === 'cp_tp' || o.align === 'cp-tp') factor = { tag: 'cp-tp' };
    else if (o.align === 'roll') factor = { tag: 'roll' };
    else if (typeof o.align === 'string') {
      throw new InvalidArgumentError(`align must be 'cp_tp', 'roll' or a positive integer (got ${JSON.stringify(o.align)})`);
    } else factor = { tag: 'multiple', val: u64(o.align, 'align', 1n) };
  }
  return { cp, tp, factor, powerOfTwo: or(o, 'powerOfTwo', bool, d.power_of_two) };
}

/** `cpLayout`'s message for a missing cp. */
export const CP_NEEDED = `cpLayout needs cp (in 1..=${MAX_PARALLEL})`;

/** The options of `rawPlan`: its cap and the kernel's plan options (`kernelOptions`). */
export function planOptions(o) {
  return { ...kernelOptions(o, 'PlanOptions'), capacity: u64(o.capacity, 'capacity', 1n) };
}

/** `maxSegments`: at most this many items per bin; omitted, the kernel's default (0: no limit). */
export function maxSegmentsOption(o) {
  return or(o, 'maxSegments', (v, key) => u64(v, key), DEFAULTS.StreamLimits.max_segments);
}

/**
 * The further limits of `streamPacker` (`limits`: name → cap per bin, `maxSegments`) as the
 * kernel's `streaming.limits`, or null for a packer of tokens alone (no limit, no
 * segment limit: the plain packer, as Python's).
 */
export function streamLimits(o) {
  const maxSegments = maxSegmentsOption(o);
  const entries = given(o.limits) ? namedEntries(o.limits, 'limits', 'cap') : [];
  if (entries.length === 0 && maxSegments === 0n) return null;
  if (entries.length > MAX_RESOURCES - 1) {
    throw new InvalidArgumentError(`limits must name at most ${MAX_RESOURCES - 1} resources (got ${entries.length})`);
  }
  if (entries.some(([name]) => name === 'tokens')) {
    throw new InvalidArgumentError("limits['tokens']: the tokens are the lengths and their cap (capacity), not a further limit");
  }
  // The kernel checks the names again (none empty), naming the limit.
  return {
    caps: BigUint64Array.from(entries, ([name, cap]) => u64(cap, `limits['${name}']`, 1n)),
    names: entries.map(([name]) => name),
    maxSegments,
  };
}

/** The options of `streamPacker` (capacity `capacity`), with the kernel's defaults and limits. */
export function streamOptions(capacity, o) {
  const d = DEFAULTS.StreamOptions;
  return {
    capacity: u64(capacity, 'capacity', 1n),
    align: alignOption(o, d.align),
    maxOpenBins: or(o, 'maxOpenBins', (v, key) => u32(v, key, 1, STREAM.MAX_OPEN_BINS), STREAM.DEFAULT_MAX_OPEN_BINS),
    maxBuffered: or(o, 'maxBuffered', (v, key) => u32(v, key, 0, STREAM.MAX_BUFFERED), STREAM.DEFAULT_MAX_BUFFERED),
    oversize: or(o, 'oversize', (v, key) => oneOf(v, key, NAMES.OversizePolicy), d.oversize),
  };
}

/** Labels (any values) → dense u32 ids, one per sample. */
function labelIds(groups, n) {
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

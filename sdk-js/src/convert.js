// Input conversion and checking, the same rules for every entry point (the JavaScript form of
// the Python SDK's `stowplan._convert`):
//
// - integers are exact: a number must be a safe integer (|x| ≤ 2**53-1; above that, pass a
//   bigint), a bigint is taken as is; booleans, strings, non-integer numbers, NaN are refused;
// - sequences are arrays (or other iterables) of such integers, or integer typed arrays
//   (Uint8/16/32, Int8/16/32, BigUint64, BigInt64); float typed arrays are refused even when
//   every value is whole, like float numpy arrays in Python;
// - a sequence holds at most `maxEntries` entries, checked on its length before anything is
//   allocated (a `new Array(2**32-1)` or a Proxy reporting such a length is refused at once);
// - every refusal is an InvalidArgumentError naming the argument (and the index) and the
//   allowed range.
import { InvalidArgumentError } from './errors.js';

/** 2**64-1 */
export const U64_MAX = (1n << 64n) - 1n;
/** 2**32-1 */
export const U32_MAX = 0xffffffff;
const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;
const TWO32 = 4294967296;
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** A bound as the messages spell it (`2**64-1` …). */
function bound(v) {
  const b = BigInt(v);
  if (b === U64_MAX) return '2**64-1';
  if (b === BigInt(U32_MAX)) return '2**32-1';
  if (b === I64_MAX) return '2**63-1';
  if (b === I64_MIN) return '-2**63';
  return b.toString();
}

/** A value for a message. */
export function show(v) {
  if (typeof v === 'bigint') return `${v}n`;
  if (typeof v === 'string') return JSON.stringify(v);
  if (v === null || v === undefined || typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `an array of ${v.length}`;
  return v?.constructor?.name ?? typeof v;
}

/**
 * `v` as a bigint if it is an exact integer (a safe-integer number or a bigint), else null.
 * @param {unknown} v
 * @returns {bigint | null}
 */
function exact(v) {
  if (typeof v === 'bigint') return v;
  if (typeof v === 'number' && Number.isSafeInteger(v)) return BigInt(v);
  return null;
}

function rangeError(name, v, low, high) {
  const unsafe = typeof v === 'number' && Number.isInteger(v) && !Number.isSafeInteger(v);
  const hint = unsafe ? '; numbers above 2**53-1 are not exact: pass a bigint' : '';
  const what = exact(v) === null && !unsafe ? 'an integer ' : '';
  return new InvalidArgumentError(`${name} must be ${what}in ${bound(low)}..=${bound(high)} (got ${show(v)})${hint}`);
}

/**
 * An integer argument in `low..=high`, as a bigint.
 * @param {unknown} v @param {string} name @param {bigint} low @param {bigint} high
 * @returns {bigint}
 */
export function int(v, name, low, high) {
  const b = exact(v);
  if (b === null || b < low || b > high) throw rangeError(name, v, low, high);
  return b;
}

/** A u32 argument ≥ `low` (≤ `high`, default 2**32-1), as a number. */
export function u32(v, name, low = 0, high = U32_MAX) {
  return Number(int(v, name, BigInt(low), BigInt(high)));
}

/** A u64 argument ≥ `low`, as a bigint. */
export function u64(v, name, low = 0n) {
  return int(v, name, BigInt(low), U64_MAX);
}

/** An i64 argument, as a bigint. */
export function i64(v, name) {
  return int(v, name, I64_MIN, I64_MAX);
}

/** A boolean option. */
export function bool(v, name) {
  if (typeof v !== 'boolean') throw new InvalidArgumentError(`${name} must be true or false (got ${show(v)})`);
  return v;
}

/**
 * One of `allowed` (the kernel's spelling; `_` may stand for `-`).
 * @template {string} T
 * @param {unknown} v @param {string} name @param {readonly T[]} allowed
 * @returns {T}
 */
export function oneOf(v, name, allowed) {
  const s = typeof v === 'string' ? v.replaceAll('_', '-') : v;
  if (!allowed.includes(/** @type {T} */ (s))) {
    throw new InvalidArgumentError(`${name} must be one of ${allowed.map((a) => `'${a}'`).join(', ')} (got ${show(v)})`);
  }
  return /** @type {T} */ (s);
}

/**
 * Options renamed, former name → name (ARCHITECTURE.md's names table): a former name keeps
 * working for one release with a warning naming the new one (`options` applies it).
 */
const RENAMED = Object.freeze({ maxTokenLen: 'capacity', packingLength: 'capacity' });

/**
 * `options` (an object or undefined) checked for unknown keys; returns it (or `{}`). A
 * former option name (`RENAMED`) of a known option is taken under its new name, with a
 * `DeprecationWarning` (`process.emitWarning`, or `console.warn` outside Node); both names at
 * once are refused.
 * @param {unknown} options @param {string} fn @param {readonly string[]} known
 * @returns {Record<string, any>}
 */
export function options(options, fn, known) {
  if (options === undefined || options === null) return {};
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw new InvalidArgumentError(`the options of ${fn} must be an object (got ${show(options)})`);
  }
  /** @type {Record<string, any>} */
  let out = options;
  for (const key of Object.keys(options)) {
    const renamed = Object.hasOwn(RENAMED, key) ? RENAMED[/** @type {keyof RENAMED} */ (key)] : undefined;
    if (renamed !== undefined && known.includes(renamed)) {
      if (given(/** @type {Record<string, any>} */ (options)[renamed])) {
        throw new InvalidArgumentError(`${fn}: give ${renamed} only (${key} is its former name, deprecated)`);
      }
      const message = `${fn}: ${key} is deprecated and will be removed in the next release; use ${renamed}`;
      if (typeof process !== 'undefined' && typeof process.emitWarning === 'function') {
        process.emitWarning(message, 'DeprecationWarning');
      } else {
        console.warn(`DeprecationWarning: ${message}`);
      }
      const { [key]: value, ...rest } = /** @type {Record<string, any>} */ (out);
      out = { ...rest, [renamed]: value };
    } else if (!known.includes(key)) {
      throw new InvalidArgumentError(`unknown option '${key}' of ${fn}; known: ${known.join(', ')}`);
    }
  }
  return out;
}

/** Whether `v` is an option that was given (not undefined or null). */
export function given(v) {
  return v !== undefined && v !== null;
}

const UNSIGNED = [Uint8Array, Uint8ClampedArray, Uint16Array, Uint32Array];
const SIGNED = [Int8Array, Int16Array, Int32Array];

/**
 * The bytes of an instance's linear memory jco's bindings (1.34) can pass a list through: they
 * read the address the kernel allocates as a signed 32-bit number, so a list must lie in the
 * first 2 GiB (the README's "Limits of jco's bindings").
 */
const JCO_LIST_BYTES = 2 ** 31;

/**
 * The most entries a list argument of `bytes`-byte entries may hold: the kernel takes at most
 * 2**32-1 items (its results index them with u32, wit/kernel.wit), and the list's bytes must
 * fit where jco passes it; so 2**28 for u64/s64 lists, 2**29 for u32 lists.
 * @param {number} bytes
 */
export function maxEntries(bytes) {
  return Math.min(U32_MAX, JCO_LIST_BYTES / bytes);
}

/**
 * Refuses a sequence of `length` entries above `maxEntries(bytes)`, before anything is
 * allocated for it (the one check of every list argument's size).
 * @param {number} length @param {string} name @param {number} bytes @param {string} [got]
 */
export function checkEntries(length, name, bytes, got = show(length)) {
  const max = maxEntries(bytes);
  if (!(Number.isSafeInteger(length) && length >= 0 && length <= max)) {
    throw new InvalidArgumentError(
      `${name} must hold at most ${max} entries (2**${Math.log2(max)}; got ${got}): the kernel takes ` +
        `at most 2**32-1 items, and jco's bindings pass a list of ${bytes}-byte entries only within the first ` +
        '2 GiB of a kernel instance\'s memory; cut the work into several calls',
    );
  }
}

/**
 * The values of a sequence argument of `bytes`-byte entries: an array/typed array as is, an
 * iterable as an array; refused above `maxEntries(bytes)` entries before any allocation (an
 * iterable as soon as it yields one too many).
 */
function sequence(values, name, bytes) {
  if (typeof values === 'string' || values === null || values === undefined || typeof values !== 'object') {
    throw new InvalidArgumentError(`${name} must be an array or an integer typed array (got ${show(values)})`);
  }
  if (values instanceof Float32Array || values instanceof Float64Array) {
    throw new InvalidArgumentError(
      `${name} must hold integers, not floats (${values.constructor.name}); floats are refused even when whole: ` +
        'convert once the values are known to be whole (e.g. Uint32Array.from(values))',
    );
  }
  if (ArrayBuffer.isView(values) && !('length' in values)) {
    throw new InvalidArgumentError(`${name} must be an array or an integer typed array (got a DataView)`);
  }
  if (Array.isArray(values) || ArrayBuffer.isView(values)) {
    checkEntries(values.length, name, bytes);
    return values;
  }
  if (typeof values[Symbol.iterator] === 'function') {
    const max = maxEntries(bytes);
    const out = [];
    for (const v of values) {
      if (out.length === max) checkEntries(max + 1, name, bytes, `more than ${max}`);
      out.push(v);
    }
    return out;
  }
  throw new InvalidArgumentError(`${name} must be an array or an integer typed array (got ${show(values)})`);
}

/**
 * Integers in `0..=high` as a BigUint64Array (a BigUint64Array argument is returned as is,
 * without a copy; a BigInt64Array is checked and viewed in place).
 * @param {unknown} values @param {string} name @param {bigint} [high]
 * @returns {BigUint64Array}
 */
export function u64Array(values, name, high = U64_MAX) {
  const v = sequence(values, name, 8);
  if (v instanceof BigUint64Array) {
    if (high !== U64_MAX) checkBig(v, name, 0n, high);
    return v;
  }
  if (v instanceof BigInt64Array) {
    checkBig(v, name, 0n, high);
    return new BigUint64Array(v.buffer, v.byteOffset, v.length);
  }
  const n = v.length;
  const out = new BigUint64Array(n);
  if (UNSIGNED.some((T) => v instanceof T) && LITTLE_ENDIAN) {
    const words = new Uint32Array(out.buffer);
    for (let i = 0; i < n; i++) words[2 * i] = v[i];
    return out;
  }
  if (SIGNED.some((T) => v instanceof T)) {
    for (let i = 0; i < n; i++) {
      if (v[i] < 0) throw rangeError(`${name}[${i}]`, v[i], 0n, high);
      out[i] = BigInt(v[i]);
    }
    return out;
  }
  const limit = high >= BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(high);
  const words = LITTLE_ENDIAN ? new Uint32Array(out.buffer) : null;
  for (let i = 0; i < n; i++) {
    const x = v[i];
    if (typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= limit) {
      if (words) {
        const lo = x % TWO32;
        words[2 * i] = lo;
        words[2 * i + 1] = (x - lo) / TWO32;
      } else {
        out[i] = BigInt(x);
      }
    } else if (typeof x === 'bigint' && x >= 0n && x <= high) {
      out[i] = x;
    } else {
      throw rangeError(`${name}[${i}]`, x, 0n, high);
    }
  }
  return out;
}

/** Checks every bigint of `v` is in `low..=high`. */
function checkBig(v, name, low, high) {
  for (let i = 0; i < v.length; i++) {
    if (v[i] < low || v[i] > high) throw rangeError(`${name}[${i}]`, v[i], low, high);
  }
}

/**
 * Integers in `-2**63..=2**63-1` as a BigInt64Array (a BigInt64Array is returned as is).
 * @param {unknown} values @param {string} name
 * @returns {BigInt64Array}
 */
export function i64Array(values, name) {
  const v = sequence(values, name, 8);
  if (v instanceof BigInt64Array) return v;
  const out = new BigInt64Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const b = exact(v[i]);
    if (b === null || b < I64_MIN || b > I64_MAX) throw rangeError(`${name}[${i}]`, v[i], I64_MIN, I64_MAX);
    out[i] = b;
  }
  return out;
}

/**
 * Integers in `0..=2**32-1` as a Uint32Array (a Uint32Array is returned as is).
 * @param {unknown} values @param {string} name
 * @returns {Uint32Array}
 */
export function u32Array(values, name) {
  const v = sequence(values, name, 4);
  if (v instanceof Uint32Array) return v;
  const out = new Uint32Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const x = v[i];
    const ok = (typeof x === 'number' && Number.isInteger(x)) || typeof x === 'bigint';
    if (!ok || x < 0 || x > U32_MAX) throw rangeError(`${name}[${i}]`, x, 0n, BigInt(U32_MAX));
    out[i] = Number(x);
  }
  return out;
}

// Builds a buffer-filter plugin written in JavaScript into a WebAssembly component of the
// world stowplan:filter/buffer-filter (wit/filter), with componentize-js (a pinned
// devDependency). The plugin keeps the WASI the host denies anyway (stdio is captured,
// clocks read 0, randomness is seeded with a constant) and drops outbound HTTP and the
// fetch-event handler, which the host does not offer.
//
// The component exports the plugin's `select` wrapped in a check of what it returns: the
// glue componentize-js generates lowers any value with a `length` as a list<u32> (a string
// "0" became one u32 read from memory the glue allocated and never wrote: 0, a valid
// position, on a fresh instance's first call, a leftover later), and a number, null or a
// non-integer entry trapped. Checked, anything but an array or integer typed array of integers
// in 0..=2**32-1 is the plugin's error (`err(text)`), on every call. The host still checks
// the selection's rules (at most `wanted`, in range, none twice).
//
// Usage: node scripts/build-plugin.mjs SOURCE.js OUT.wasm
import { componentize } from '@bytecodealliance/componentize-js';
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** The interface the plugin exports, as componentize-js's glue looks it up. */
const INTERFACE = 'stowplan:filter/filter@0.1.0';

/**
 * What `select` returned, as the list<u32> to return, or a thrown string (the plugin's
 * `err(text)`) saying what is wrong. Self-contained: its source is copied into the wrapper
 * module the component is built from.
 * @param {unknown} value
 * @returns {Uint32Array}
 */
export function checkedSelection(value) {
  const MAX = 4294967295;
  const show = (v) => {
    if (typeof v === 'string') return `a string (${JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v)})`;
    if (typeof v === 'bigint') return `${v}n`;
    if (v === null || v === undefined || typeof v === 'number' || typeof v === 'boolean') return String(v);
    if (typeof v === 'function') return 'a function';
    const name = v?.constructor?.name ?? 'Object';
    return `${/^[AEIOU]/.test(name) ? 'an' : 'a'} ${name}`;
  };
  let v = value;
  // The result form the glue also takes: {tag: 'ok', val} or {tag: 'err', val: text}.
  if (v !== null && typeof v === 'object' && (v.tag === 'ok' || v.tag === 'err')) {
    if (v.tag === 'err') {
      if (typeof v.val === 'string') throw v.val;
      throw `select returned err with ${show(v.val)}, not an error text`;
    }
    v = v.val;
  }
  const typed = ArrayBuffer.isView(v) && !(v instanceof DataView);
  if (!Array.isArray(v) && !typed) {
    throw `select returned ${show(v)}, not a list of buffer positions: return an array of integers in 0..=${MAX}`;
  }
  if (v instanceof Uint32Array) return v;
  const out = new Uint32Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const x = v[i];
    const ok =
      (typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= MAX) ||
      (typeof x === 'bigint' && x >= 0n && x <= BigInt(MAX));
    if (!ok) throw `select returned a list whose entry ${i} is ${show(x)}, not a buffer position (an integer in 0..=${MAX})`;
    out[i] = Number(x);
  }
  return out;
}

/**
 * The wrapper module: the plugin's module imported, its `select` exported through
 * `checkedSelection` (a returned promise is checked once settled).
 * @param {string} source the plugin module's file name, beside the wrapper
 */
function wrapper(source) {
  const id = JSON.stringify(INTERFACE);
  return `// Written by stowplan's scripts/build-plugin.mjs for the build of ${source}, then deleted.
import * as plugin from ${JSON.stringify(`./${source}`)};
${checkedSelection.toString()}
const iface = typeof plugin[${id}] === 'object' && plugin[${id}] !== null ? plugin[${id}] : plugin.filter;
if (iface === null || typeof iface !== 'object' || typeof iface.select !== 'function') {
  throw new Error(${JSON.stringify(`${source} must export the interface ${INTERFACE}: export const filter = { select(ctx, buffer) { … } }`)});
}
export const filter = {
  select(ctx, buffer) {
    const value = iface.select(ctx, buffer);
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') return value.then(checkedSelection);
    return checkedSelection(value);
  },
};
`;
}

/**
 * Builds `source` into the component bytes.
 * @param {string} source path of the plugin's JavaScript module
 * @returns {Promise<Uint8Array>}
 */
export async function buildPlugin(source) {
  // The wrapper sits beside the plugin's module, so that the module's own relative imports
  // resolve as they would without it (componentize-js maps only the source's folder).
  const path = resolve(source);
  const shim = join(dirname(path), `.${basename(path)}.checked-${process.pid}-${randomBytes(4).toString('hex')}.js`);
  writeFileSync(shim, wrapper(basename(path)));
  try {
    const { component } = await componentize({
      sourcePath: shim,
      witPath: join(ROOT, 'wit/filter'),
      worldName: 'buffer-filter',
      disableFeatures: ['http', 'fetch-event'],
    });
    return component;
  } finally {
    rmSync(shim, { force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [source, out] = process.argv.slice(2);
  if (!source || !out) {
    console.error('usage: node scripts/build-plugin.mjs SOURCE.js OUT.wasm');
    process.exit(2);
  }
  const component = await buildPlugin(source);
  mkdirSync(dirname(resolve(out)), { recursive: true });
  writeFileSync(out, component);
  console.log(`build-plugin: ${source} → ${out} (${component.length} bytes)`);
}

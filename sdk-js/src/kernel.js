// Loads the kernel component: reads its bytes (the file system in Node, fetch in a browser),
// checks their sha256 against the pin the build copied from
// host/assets/stowplan_kernel.wasm.sha256, compiles the core module(s) jco's bindings ask for
// from byte ranges of those same checked bytes, and instantiates the bindings.
import { instantiate } from '../generated/kernel/stowplan_kernel.js';
import { COMPONENT_BYTES, COMPONENT_SHA256, CORE_MODULES } from '../generated/manifest.js';
import { KernelRuntimeError } from './errors.js';

/** Where the packaged component is. */
export const COMPONENT_URL = new URL('../generated/stowplan_kernel.wasm', import.meta.url);

/** Lowercase hex of `bytes`. */
function hex(bytes) {
  return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * The sha256 (hex) of `bytes`, with Web Crypto (Node ≥ 19 and browsers have it as
 * `globalThis.crypto`; Node's own `node:crypto` where it lacks it).
 * @param {Uint8Array} bytes
 * @returns {Promise<string>}
 */
export async function sha256(bytes) {
  const subtle = globalThis.crypto?.subtle;
  if (subtle) return hex(await subtle.digest('SHA-256', bytes));
  const { createHash } = await import('node:crypto');
  return createHash('sha256').update(bytes).digest('hex');
}

/** The bytes at `url` (file: URLs from the file system, others with fetch). */
async function read(url) {
  if (url.protocol === 'file:') {
    const { readFile } = await import('node:fs/promises');
    return new Uint8Array(await readFile(url));
  }
  const response = await fetch(url);
  if (!response.ok) throw new Error(`GET ${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

/**
 * Loads and instantiates the component.
 * @param {{component?: Uint8Array | ArrayBuffer | URL | string}} [options] another copy of
 *   the component (bytes or a URL); it must still have the pinned sha256.
 * @returns {Promise<{exports: any, spawn: () => Promise<any>, sha256: string, bytes: number, source: string}>}
 *   `exports` is an instance's bindings; `spawn` makes another instance of the same code.
 */
export async function loadKernel(options = {}) {
  const given = options.component;
  let bytes;
  let source;
  try {
    if (given instanceof Uint8Array || given instanceof ArrayBuffer) {
      bytes = new Uint8Array(given);
      source = 'bytes';
    } else {
      const url = given === undefined ? COMPONENT_URL : new URL(String(given), COMPONENT_URL);
      bytes = await read(url);
      source = url.href;
    }
  } catch (e) {
    throw new KernelRuntimeError(`kernel runtime failure: cannot read the kernel component: ${e.message}`);
  }
  const actual = await sha256(bytes);
  if (actual !== COMPONENT_SHA256) {
    throw new KernelRuntimeError(
      `kernel runtime failure: the kernel component (${source}, ${bytes.length} bytes) has sha256 ${actual}, ` +
        `not the pinned ${COMPONENT_SHA256} (${COMPONENT_BYTES} bytes): a damaged or foreign file`,
    );
  }
  let modules;
  try {
    modules = {};
    for (const [name, { offset, length }] of Object.entries(CORE_MODULES)) {
      modules[name] = await WebAssembly.compile(bytes.subarray(offset, offset + length));
    }
  } catch (e) {
    throw new KernelRuntimeError(`kernel runtime failure: the kernel did not compile: ${e.message}`);
  }
  // A fresh instance of the checked, compiled code (its own linear memory).
  const spawn = async () => {
    try {
      return await instantiate((name) => {
        if (!(name in modules)) throw new Error(`the bindings ask for an unknown core module ${name}`);
        return modules[name];
      }, {});
    } catch (e) {
      throw new KernelRuntimeError(`kernel runtime failure: the kernel did not instantiate: ${e.message}`);
    }
  };
  return { exports: await spawn(), spawn, sha256: actual, bytes: bytes.length, source };
}

// Builds a buffer-filter plugin written in JavaScript into a WebAssembly component of the
// world stowplan:filter/buffer-filter (wit/filter), with componentize-js (a pinned
// devDependency). The plugin keeps the WASI the host denies anyway (stdio is captured,
// clocks read 0, randomness is seeded with a constant) and drops outbound HTTP and the
// fetch-event handler, which the host does not offer.
//
// Usage: node scripts/build-plugin.mjs SOURCE.js OUT.wasm
import { componentize } from '@bytecodealliance/componentize-js';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/**
 * Builds `source` into the component bytes.
 * @param {string} source path of the plugin's JavaScript module
 * @returns {Promise<Uint8Array>}
 */
export async function buildPlugin(source) {
  const { component } = await componentize({
    sourcePath: resolve(source),
    witPath: join(ROOT, 'wit/filter'),
    worldName: 'buffer-filter',
    disableFeatures: ['http', 'fetch-event'],
  });
  return component;
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

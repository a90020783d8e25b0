// Writes test/multi_vectors.json: small tables packed under several limits by the CLI
// (`stowplan pack --limit NAME=CAP --max-segments N --json`, the Rust host), which
// test/multi.test.js compares packMulti with, bin for bin. Run again when the kernel's rules
// change (the tables are seeded: the same inputs every time).
//
// Usage: STOWPLAN_BIN=path/to/stowplan node scripts/multi-vectors.mjs
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { CLI, PKG, requireCli, rng } from '../test/helpers.js';


/** `n` rows of a table: each column's sizes drawn in `ranges[name]`. */
function table(seed, n, ranges) {
  const draw = rng(seed);
  const columns = Object.fromEntries(Object.keys(ranges).map((name) => [name, []]));
  for (let i = 0; i < n; i++) for (const [name, [lo, hi]] of Object.entries(ranges)) columns[name].push(draw(lo, hi));
  return columns;
}

const README = { tokens: [900, 300, 700, 500, 200], image_tokens: [800, 0, 600, 300, 0], images: [2, 0, 1, 1, 0] };
const README_CAPS = { tokens: 1200, image_tokens: 1000, images: 2 };
const VLM = table(31, 40, { tokens: [1, 4000], image_tokens: [0, 2000], images: [0, 8] });
const VLM_CAPS = { tokens: 8192, image_tokens: 4096, images: 16 };
// Some rows over a capacity (oversize policies).
const OVER = table(7, 36, { tokens: [1, 1400], vision: [0, 700], images: [0, 5] });
const OVER_CAPS = { tokens: 1200, vision: 600, images: 4 };
const EIGHT = table(8, 30, Object.fromEntries(['tokens', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7'].map((k, q) => [k, [0, 20 + 10 * q]])));
const EIGHT_CAPS = Object.fromEntries(Object.keys(EIGHT).map((k, q) => [k, 60 + 15 * q]));
const ONE = table(1, 25, { tokens: [1, 90] });

const CASES = [
  ['the README example, balanced (the default)', README, README_CAPS, { maxSegments: 3 }],
  ['the README example, bfd', README, README_CAPS, { maxSegments: 3, method: 'bfd' }],
  ['the README example, ffd', README, README_CAPS, { maxSegments: 3, method: 'ffd' }],
  ['the README example, next-fit, no segment limit', README, README_CAPS, { method: 'next-fit' }],
  ['40 VLM rows, balanced, align 64, 6 segments', VLM, VLM_CAPS, { maxSegments: 6, align: 64 }],
  ['40 VLM rows, bfd, align 64, 6 segments', VLM, VLM_CAPS, { maxSegments: 6, align: 64, method: 'bfd' }],
  ['40 VLM rows, ffd', VLM, VLM_CAPS, { method: 'ffd' }],
  ['40 VLM rows, next-fit, 4 segments', VLM, VLM_CAPS, { method: 'next-fit', maxSegments: 4 }],
  ['oversized rows, balanced, single', OVER, OVER_CAPS, { oversize: 'single', maxSegments: 5 }],
  ['oversized rows, bfd, single', OVER, OVER_CAPS, { oversize: 'single', maxSegments: 5, method: 'bfd' }],
  ['oversized rows, balanced, drop', OVER, OVER_CAPS, { oversize: 'drop' }],
  ['oversized rows, ffd, drop', OVER, OVER_CAPS, { method: 'ffd', oversize: 'drop' }],
  ['oversized rows, next-fit, single, align 16', OVER, OVER_CAPS, { method: 'next-fit', oversize: 'single', align: 16 }],
  ['8 resources, ffd, 7 segments', EIGHT, EIGHT_CAPS, { method: 'ffd', maxSegments: 7 }],
  ['8 resources, balanced', EIGHT, EIGHT_CAPS, {}],
  ['8 resources, bfd', EIGHT, EIGHT_CAPS, { method: 'bfd' }],
  ['tokens only, 3 segments', ONE, { tokens: 100 }, { maxSegments: 3 }],
];

requireCli();
const cases = CASES.map(([name, columns, capacities, options]) => {
  const names = Object.keys(columns);
  const n = columns[names[0]].length;
  // A table with a header under --limit; plain lengths (tokens only, --max-segments) without.
  const header = names.length > 1 ? [names.join('\t')] : [];
  const text = [...header, ...Array.from({ length: n }, (_, i) => names.map((k) => columns[k][i]).join('\t'))].join('\n');
  const args = ['pack', '--json', '-c', String(capacities[names[0]])];
  for (const k of names.slice(1)) args.push('--limit', `${k}=${capacities[k]}`);
  if (options.maxSegments) args.push('--max-segments', String(options.maxSegments));
  if (options.align) args.push('--align', String(options.align));
  if (options.method) args.push('--method', options.method);
  if (options.oversize) args.push('--oversize', options.oversize);
  const out = JSON.parse(execFileSync(CLI, args, { input: `${text}\n`, encoding: 'utf8' }));
  const expected = {};
  for (const key of ['bins', 'loads', 'dropped', 'single', 'real_tokens', 'aligned_tokens', 'lower_bound', 'resources', 'max_segments', 'segments_lower_bound', 'resource_loads']) {
    if (key in out) expected[key] = out[key];
  }
  return { name, columns, capacities, options, args: args.join(' '), expected };
});
const path = join(PKG, 'test/multi_vectors.json');
// One case a line: small, and a changed case is a changed line.
const lines = cases.map((c) => JSON.stringify(c)).join(',\n');
writeFileSync(path, `{"generator": "scripts/multi-vectors.mjs", "cases": [\n${lines}\n]}\n`);
console.log(`multi-vectors: ${cases.length} cases → ${path}`);

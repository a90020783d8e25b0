// Node against the Rust WASM host, in one run: the same kernel component called from Node
// (jco's bindings on V8) and from the Rust host (wasmtime), through the Python SDK's native
// module in a worker process (warm, in-process calls like Node's) and through the CLI (one
// cold call per process, its own `elapsed_ms`). Calls alternate Node / Rust one by one after
// a checked warm-up; every result is checked identical (sha256 of the flat groups).
//
// Workloads: the first 1,024 lengths of rl-math-8k into 8 groups (partition, kk refined),
// and best-fit decreasing of the 1,000,000 lengths of pretrain-docs-1m into bins of 32,768
// (oversize single), as in BENCHMARKS.md.
//
// Usage: node bench/bench.mjs [--rounds-small N] [--rounds-large N] [--cli-rounds N]
// Environment: STOWPLAN_PYTHON (default target/sdk-venv/bin/python), STOWPLAN_BIN,
// STOWPLAN_WORKLOADS (default ../shared/workloads).
import { execFileSync, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import * as sp from '../src/index.js';

const PKG = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const ROOT = resolve(PKG, '..');
const PYTHON = process.env.STOWPLAN_PYTHON ?? join(ROOT, 'target/sdk-venv/bin/python');
const CLI = process.env.STOWPLAN_BIN ?? join(ROOT, 'target/release/stowplan');
const WORKLOADS = process.env.STOWPLAN_WORKLOADS ?? resolve(ROOT, '../shared/workloads');

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
}

/** The lengths of a workload file. */
function read(name) {
  return readFileSync(join(WORKLOADS, name), 'utf8').trim().split('\n').map(Number);
}

/** sha256 of flat groups (offsets then indices, little-endian u32). */
function digest(offsets, indices) {
  return createHash('sha256').update(new Uint8Array(offsets.buffer, offsets.byteOffset, offsets.byteLength))
    .update(new Uint8Array(indices.buffer, indices.byteOffset, indices.byteLength)).digest('hex');
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/** The Python worker: runs a named workload once per request, answers `ms digest`. */
const WORKER = String.raw`
import hashlib, sys, time
import numpy as np
import stowplan
small = np.ascontiguousarray(np.array([int(x) for x in open(sys.argv[1]).read().split()][:1024], dtype=np.uint64))
large = np.ascontiguousarray(np.loadtxt(sys.argv[2], dtype=np.uint64))
def run(name):
    if name == "small":
        t = time.perf_counter_ns(); r = stowplan.partition(small, 8); t = time.perf_counter_ns() - t
    else:
        t = time.perf_counter_ns(); r = stowplan.pack(large, 32768, method="bfd", oversize="single"); t = time.perf_counter_ns() - t
    d = hashlib.sha256(np.asarray(r.offsets, dtype="<u4").tobytes() + np.asarray(r.indices, dtype="<u4").tobytes()).hexdigest()
    return t / 1e6, d
print("ready", stowplan.kernel_info()["sha256"], flush=True)
for line in sys.stdin:
    ms, d = run(line.strip())
    print(ms, d, flush=True)
`;

/** Starts the worker; resolves to {call(name) → [ms, digest], sha256, close()}. */
async function startWorker(smallPath, largePath) {
  const child = spawn(PYTHON, ['-c', WORKER, smallPath, largePath], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const first = (await lines.next()).value ?? '';
  const [word, sha256] = first.split(' ');
  if (word !== 'ready') throw new Error(`the Python worker did not start: ${first}`);
  return {
    sha256,
    async call(name) {
      child.stdin.write(`${name}\n`);
      const [ms, d] = ((await lines.next()).value ?? '').split(' ');
      return [Number(ms), d];
    },
    close: () => child.stdin.end(),
  };
}

/** One cold CLI call (a process): the kernel time it reports. */
function cliCall(args) {
  const out = JSON.parse(execFileSync(CLI, [...args, '--json'], { encoding: 'utf8', maxBuffer: 1 << 28, stdio: ['ignore', 'pipe', 'ignore'] }));
  return out.elapsed_ms;
}

async function main() {
  const smallAll = read('rl-math-8k.txt');
  const small = smallAll.slice(0, 1024);
  const large = read('pretrain-docs-1m.txt');
  const smallU64 = BigUint64Array.from(small, BigInt);
  const largeU64 = BigUint64Array.from(large, BigInt);
  const scratch = mkdtempSync(join(tmpdir(), 'stowplan-bench-'));
  const smallFile = join(scratch, 'small.txt');
  writeFileSync(smallFile, `${small.join('\n')}\n`);
  const largeFile = join(WORKLOADS, 'pretrain-docs-1m.txt');

  const cases = [
    {
      name: 'small',
      workload: '1,024 lengths of rl-math-8k into 8 groups (partition, kk refined)',
      node: () => sp.partition(smallU64, 8),
      nodeArray: () => sp.partition(small, 8),
      command: 'partition(lengths, 8)',
      cli: ['partition', smallFile, '-k', '8'],
      rounds: arg('--rounds-small', 301),
    },
    {
      name: 'large',
      workload: 'pretrain-docs-1m (1,000,000 lengths), BFD into bins of 32,768, oversize single',
      node: () => sp.pack(largeU64, 32768, { method: 'bfd', oversize: 'single' }),
      nodeArray: () => sp.pack(large, 32768, { method: 'bfd', oversize: 'single' }),
      command: "pack(lengths, 32768, {method: 'bfd', oversize: 'single'})",
      cli: ['pack', largeFile, '--capacity', '32768', '--method', 'bfd', '--oversize', 'single'],
      rounds: arg('--rounds-large', 15),
    },
  ];

  const haveWorker = existsSync(PYTHON);
  const worker = haveWorker ? await startWorker(smallFile, largeFile) : null;
  if (!worker) console.error(`bench: no Python SDK at ${PYTHON}: the in-process Rust host column is left out`);
  if (worker && worker.sha256 !== sp.kernelInfo().sha256) {
    console.error(`bench: WARNING: the Python SDK runs kernel ${worker.sha256.slice(0, 12)}, Node ${sp.kernelInfo().sha256.slice(0, 12)}`);
  }
  const cliRounds = arg('--cli-rounds', 7);
  const rows = [];
  for (const c of cases) {
    const time = (f) => {
      const t = process.hrtime.bigint();
      const r = f();
      return [Number(process.hrtime.bigint() - t) / 1e6, r];
    };
    // Warm-up, checked: both hosts give the same groups.
    const [, warm] = time(c.node);
    const want = digest(warm.offsets, warm.indices);
    for (let i = 0; i < 3; i++) time(c.node);
    if (worker) {
      for (let i = 0; i < 3; i++) {
        const [, d] = await worker.call(c.name);
        if (d !== want) throw new Error(`${c.name}: the Rust host's result differs from Node's`);
      }
    }
    const node = [];
    const nodeArray = [];
    const rust = [];
    for (let i = 0; i < c.rounds; i++) {
      const [ms, r] = time(c.node);
      if (digest(r.offsets, r.indices) !== want) throw new Error(`${c.name}: Node's result changed`);
      node.push(ms);
      if (worker) {
        const [rms, d] = await worker.call(c.name);
        if (d !== want) throw new Error(`${c.name}: the Rust host's result differs from Node's`);
        rust.push(rms);
      }
      const [ams, ar] = time(c.nodeArray);
      if (digest(ar.offsets, ar.indices) !== want) throw new Error(`${c.name}: Node's result from an Array differs`);
      nodeArray.push(ams);
    }
    const cold = [];
    if (existsSync(CLI)) for (let i = 0; i < cliRounds; i++) cold.push(cliCall(c.cli));
    rows.push({ c, node: median(node), nodeArray: median(nodeArray), rust: rust.length ? median(rust) : null, cold: cold.length ? median(cold) : null });
  }
  worker?.close();
  rmSync(scratch, { recursive: true, force: true });

  const ms = (x) => (x === null ? '–' : x < 1 ? `${(x * 1000).toFixed(0)} µs` : `${x.toFixed(1)} ms`);
  console.log(`kernel ${sp.kernelInfo().sha256.slice(0, 12)}, node ${process.version}; medians; ratio = Node / Rust host (in-process)`);
  console.log('');
  console.log('| workload | command | Node (BigUint64Array) | Node (Array) | Rust WASM host, in-process (Python SDK) | ratio | Rust WASM host, CLI, cold (own elapsed) |');
  console.log('|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const ratio = r.rust ? `${(r.node / r.rust).toFixed(2)}×` : '–';
    console.log(`| ${r.c.workload} | \`${r.c.command}\` (${r.c.rounds} rounds) | ${ms(r.node)} | ${ms(r.nodeArray)} | ${ms(r.rust)} | ${ratio} | ${ms(r.cold)} |`);
  }
}

await main();

// Builds the package's generated/ folder from the committed kernel component, with jco:
//
//   generated/stowplan_kernel.wasm   the component, byte for byte (loaded and hashed at load)
//   generated/kernel/                jco's JavaScript bindings of the component (no core wasm:
//                                    the loader cuts the core modules out of the component)
//   generated/manifest.js            the component's expected sha256 (read here from
//                                    host/assets/stowplan_kernel.wasm.sha256, the one place that
//                                    knows it), where each core module sits in the component,
//                                    the streaming packer's defaults (kernel/src/stream.rs) and
//                                    the kernel's count limits (kernel/src/lib.rs, layout.rs,
//                                    multi.rs)
//   generated/workloads/             the CLI's built-in workload, for the explorer
//
// No Rust or wasm toolchain is needed: jco (a pinned devDependency) does the transpiling.
// Usage: node scripts/build.mjs [--component PATH] [--sha256-file PATH] [--out DIR]
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const pkg = resolve(here, '..');
const root = resolve(pkg, '..');

function option(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 && process.argv[i + 1] ? resolve(process.argv[i + 1]) : fallback;
}

const componentPath = option('--component', join(root, 'host/assets/stowplan_kernel.wasm'));
const shaPath = option('--sha256-file', `${componentPath}.sha256`);
const out = option('--out', join(pkg, 'generated'));
const workload = join(root, 'host/assets/rl-math-8k.txt');

function fail(message) {
  console.error(`build: ${message}`);
  process.exit(1);
}

const component = readFileSync(componentPath);
const expected = readFileSync(shaPath, 'utf8').trim().split(/\s+/)[0].toLowerCase();
if (!/^[0-9a-f]{64}$/.test(expected)) fail(`${shaPath} does not start with a sha256 (64 hex digits)`);
const actual = createHash('sha256').update(component).digest('hex');
if (actual !== expected) {
  fail(`${componentPath} has sha256 ${actual}, but ${shaPath} says ${expected}: the component and its pin disagree`);
}

rmSync(out, { recursive: true, force: true });
const kernelDir = join(out, 'kernel');
mkdirSync(kernelDir, { recursive: true });
const jco = join(pkg, 'node_modules/@bytecodealliance/jco/dist/jco.js');
execFileSync(
  process.execPath,
  [jco, 'transpile', componentPath, '-o', kernelDir, '--name', 'stowplan_kernel', '--instantiation', 'async', '--quiet'],
  { stdio: 'inherit' },
);

// Every core module jco wrote is a byte range of the component (jco copies them out
// unchanged when not optimizing): record where, then delete the copies, so that the only wasm
// the package runs is the one whose sha256 the loader checks.
const modules = {};
for (const name of readdirSync(kernelDir).filter((f) => f.endsWith('.wasm')).sort()) {
  const core = readFileSync(join(kernelDir, name));
  const offset = component.indexOf(core);
  if (offset < 0) fail(`jco's ${name} is not a byte range of the component: cannot load it from the component`);
  modules[name] = { offset, length: core.length };
  rmSync(join(kernelDir, name));
}
if (Object.keys(modules).length === 0) fail('jco wrote no core module');

// The streaming packer's defaults and the kernel's limits, from the one place that knows them
// (the kernel's source), so that the SDK's cannot drift from the Rust and Python ones.
/** `pub const NAME: u32 = N;` (or `N << M`; or `usize`) of each name, from the kernel source `file`. */
function kernelConsts(file, names) {
  const path = join(root, 'kernel/src', file);
  const text = readFileSync(path, 'utf8');
  const out = {};
  for (const name of names) {
    const m = text.match(new RegExp(`pub const ${name}: (?:u32|usize) = (\\d+)(?: << (\\d+))?;`));
    if (!m) fail(`${path} has no \`pub const ${name}: u32 = N;\` (or N << M, or usize)`);
    out[name] = m[2] === undefined ? Number(m[1]) : Number(m[1]) * 2 ** Number(m[2]);
  }
  return out;
}
/** `pub const NAME: &str = "…";` of `name`, from the kernel source `file`. */
function kernelString(file, name) {
  const path = join(root, 'kernel/src', file);
  const m = readFileSync(path, 'utf8').match(new RegExp(`pub const ${name}: &str = "([^"]*)";`));
  if (!m) fail(`${path} has no \`pub const ${name}: &str = "…";\``);
  return m[1];
}
const stream = kernelConsts('stream.rs', ['DEFAULT_MAX_OPEN_BINS', 'DEFAULT_MAX_BUFFERED', 'MAX_OPEN_BINS', 'MAX_BUFFERED']);
// The kernel's limits on counts: a count that sizes a result (dp, k, a micro-batch count …),
// cp/tp, and the resources of a packing under several limits.
const limits = {
  ...kernelConsts('lib.rs', ['MAX_COUNT']),
  ...kernelConsts('layout.rs', ['MAX_PARALLEL']),
  ...kernelConsts('multi.rs', ['MAX_RESOURCES']),
};

copyFileSync(componentPath, join(out, 'stowplan_kernel.wasm'));
const manifest = `// Generated by scripts/build.mjs from ${componentPath.slice(root.length + 1)}: do not edit.
/** The sha256 (hex) the kernel component must have, from ${shaPath.slice(root.length + 1)}. */
export const COMPONENT_SHA256 = ${JSON.stringify(expected)};
/** The component's size in bytes. */
export const COMPONENT_BYTES = ${component.length};
/** Each core module jco's bindings ask for: its byte range in the component. */
export const CORE_MODULES = ${JSON.stringify(modules, null, 2)};
/** The streaming packer's defaults and limits, from kernel/src/stream.rs. */
export const STREAM = Object.freeze(${JSON.stringify(stream)});
/** The kernel's limits on counts: MAX_COUNT (kernel/src/lib.rs), MAX_PARALLEL (kernel/src/layout.rs), MAX_RESOURCES (kernel/src/multi.rs). */
export const LIMITS = Object.freeze(${JSON.stringify(limits)});
/** The segment limit's name beside the named resources of a packing under several limits (kernel/src/multi.rs). */
export const SEGMENTS = ${JSON.stringify(kernelString('multi.rs', 'SEGMENTS'))};
`;
writeFileSync(join(out, 'manifest.js'), manifest);

mkdirSync(join(out, 'workloads'), { recursive: true });
copyFileSync(workload, join(out, 'workloads/rl-math-8k.txt'));
console.log(`build: kernel ${expected.slice(0, 12)}… (${component.length} bytes), ${Object.keys(modules).length} core module(s) → ${out}`);

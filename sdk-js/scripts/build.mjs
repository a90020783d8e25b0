// Builds the package's generated/ folder from the committed kernel component, with jco:
//
//   generated/stowplan_kernel.wasm   the component, byte for byte (loaded and hashed at load)
//   generated/kernel/                jco's JavaScript bindings of the component (no core wasm:
//                                    the loader cuts the core modules out of the component)
//   generated/manifest.js            the component's expected sha256 (read here from
//                                    host/assets/stowplan_kernel.wasm.sha256, the one place that
//                                    knows it), where each core module sits in the component,
//                                    the streaming packer's defaults (kernel/src/stream/mod.rs),
//                                    the kernel's count limits (kernel/src/lib.rs, layout.rs,
//                                    multi/mod.rs), its option names and cost presets
//                                    (kernel/src/names.rs), its options' defaults (what its
//                                    options constructors set) and verl's names (the WIT's
//                                    verl interface, kernel/src/peers/verl.rs)
//   generated/workloads/             the CLI's built-in workload, for the explorer
//   generated/types/                 jco's TypeScript types of the WIT (wit/, with its docs):
//                                    src/index.d.ts declares each result's kernel fields as
//                                    these records, so a field the WIT adds needs no edit here
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

// The records' types with their docs, from the WIT itself (the component's embedded WIT
// carries no docs): the one home of a result field's name, type and meaning.
execFileSync(process.execPath, [jco, 'types', join(root, 'wit'), '-o', join(out, 'types'), '--name', 'kernel', '--quiet'], {
  stdio: 'inherit',
});

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
const stream = kernelConsts('stream/mod.rs', ['DEFAULT_MAX_OPEN_BINS', 'DEFAULT_MAX_BUFFERED', 'MAX_OPEN_BINS', 'MAX_BUFFERED']);
// The kernel's limits on counts: a count that sizes a result (dp, k, a micro-batch count …),
// cp/tp, and the resources of a packing under several limits.
const limits = {
  ...kernelConsts('lib.rs', ['MAX_COUNT']),
  ...kernelConsts('layout.rs', ['MAX_PARALLEL']),
  ...kernelConsts('multi/mod.rs', ['MAX_RESOURCES']),
};

// The kernel's option names, cost presets and option defaults, from the kernel's source too:
// the SDK checks options against the kernel's own lists and fills in what the kernel's
// constructors set, instead of restating them.
/** The kernel's WIT package (wit/kernel.wit and wit/peers.wit) without its comments. */
const WIT = ['kernel.wit', 'peers.wit'].map((f) => readFileSync(join(root, 'wit', f), 'utf8')).join('\n').replace(/\/\/.*$/gm, '');
/** The kernel source `file` (under kernel/src) and its path. */
function kernelSource(file) {
  const path = join(root, 'kernel/src', file);
  return { path, text: readFileSync(path, 'utf8') };
}
/**
 * Every option name of the kernel's named enums, from kernel/src/names.rs (`named!(Type,
 * "what", [Variant => "name", …]);`), the default first: Type → [[Variant, name], …].
 */
function kernelNames() {
  const { path, text } = kernelSource('names.rs');
  const out = {};
  for (const m of text.matchAll(/^named!\((\w+), "[^"]+", \[([^\]]*)\]\);$/gm)) {
    out[m[1]] = [...m[2].matchAll(/(\w+) => "([^"]+)"/g)].map((v) => [v[1], v[2]]);
  }
  for (const type of ['PartitionMethod', 'PackMethod', 'OversizePolicy', 'Order']) {
    if (!out[type]?.length) fail(`${path} has no \`named!(${type}, "…", [Variant => "name", …]);\``);
  }
  // The names go to the component as the cases of its WIT enums: a name that is not one would
  // be refused by the bindings, so say so here.
  const enums = [...WIT.matchAll(/\benum [\w-]+ \{([^}]*)\}/g)].map((m) => m[1].split(',').map((c) => c.trim()).filter(Boolean).sort().join());
  for (const [type, variants] of Object.entries(out)) {
    if (!enums.includes(variants.map(([, name]) => name).sort().join())) {
      fail(`the names of ${type} in ${path} are not the cases of an enum of the kernel's WIT`);
    }
  }
  return out;
}
/**
 * The kernel's cost presets: `presets` name → [linear, quadratic], `constants` Cost's constant
 * → name (COST_PRESETS in names.rs, of Cost's constants in balance/mod.rs).
 */
function kernelCosts() {
  const { path, text } = kernelSource('names.rs');
  const presets = text.match(/pub const COST_PRESETS: \[\(&str, Cost\); \d+\] = \[(.*)\];/);
  if (!presets) fail(`${path} has no \`pub const COST_PRESETS: [(&str, Cost); N] = [("name", Cost::NAME), …];\``);
  const balance = kernelSource('balance/mod.rs');
  const out = { presets: {}, constants: {} };
  for (const [, name, constant] of presets[1].matchAll(/\("([^"]+)", Cost::(\w+)\)/g)) {
    const c = balance.text.match(new RegExp(`pub const ${constant}: Cost = Cost \\{ linear: ([\\d_]+), quadratic: ([\\d_]+) \\};`));
    if (!c) fail(`${balance.path} has no \`pub const ${constant}: Cost = Cost { linear: N, quadratic: M };\``);
    out.presets[name] = [BigInt(c[1].replaceAll('_', '')), BigInt(c[2].replaceAll('_', ''))];
    out.constants[constant] = name;
  }
  if (Object.keys(out.presets).length === 0) fail(`${path}'s COST_PRESETS names no preset`);
  return out;
}
const names = kernelNames();
const costs = kernelCosts();
/** Struct → field → Rust type of the options whose every field the SDK takes (`kernelDefaults` without `fields`). */
const optionTypes = {};
/**
 * The defaults of `fields` of the kernel's options struct `type` (in `file`): the values its
 * constructor (`impl Default for Type` or `impl Type { pub fn new(…) }`) writes in its
 * `Self { field: value, … }`. Integers of u64/i64 fields become bigints, of u32 fields
 * numbers; an enum value becomes its name (names.rs), a cost its preset's name. Without
 * `fields`: every field the constructor gives a value (not those it takes as parameters),
 * and their Rust types go to `optionTypes`, so that a field the kernel adds is an option of
 * the SDK without an edit here.
 */
function kernelDefaults(file, type, fields) {
  const { path, text } = kernelSource(file);
  const struct = text.match(new RegExp(`pub struct ${type}(?:<[^>]*>)? \\{([\\s\\S]*?)\\n\\}`));
  if (!struct) fail(`${path} has no \`pub struct ${type} { … }\``);
  const types = Object.fromEntries([...struct[1].matchAll(/^\s*pub (\w+): ([^\n]+),$/gm)].map((m) => [m[1], m[2]]));
  const at = text.search(new RegExp(`\\nimpl(?:<[^>]*>)? (?:Default for )?${type}(?:<[^>]*>)? \\{`));
  const literal = at < 0 ? null : text.slice(at).match(/(?<!-> )\bSelf \{([^}]*)\}/);
  if (!literal) fail(`${path} has no constructor of ${type} (\`impl Default for ${type}\` or \`impl ${type}\` with \`Self { … }\`)`);
  const values = {};
  for (const part of literal[1].split(',')) {
    const m = part.trim().match(/^(\w+): ([\s\S]+)$/);
    if (m) values[m[1]] = m[2].trim();
  }
  const out = {};
  if (!fields) {
    fields = Object.keys(types).filter((f) => f in values);
    optionTypes[type] = Object.fromEntries(fields.map((f) => [f, types[f]]));
  }
  for (const field of fields) {
    const [v, t] = [values[field], types[field]];
    const what = `${type}'s ${field} (${v} of ${t}, ${path})`;
    let value;
    if (v === undefined || t === undefined) fail(`${path}: the constructor of ${type} sets no default of ${field}`);
    else if (/^\d[\d_]*$/.test(v) && /^[ui]64$/.test(t)) value = BigInt(v.replaceAll('_', ''));
    else if (/^\d[\d_]*$/.test(v) && /^u(8|16|32)$/.test(t)) value = Number(v.replaceAll('_', ''));
    else if (v === 'true' || v === 'false') value = v === 'true';
    else if (t === 'Cost' && v.startsWith('Cost::') && v.slice(6) in costs.constants) value = costs.constants[v.slice(6)];
    else if (v.startsWith(`${t}::`) && names[t]?.some(([variant]) => variant === v.slice(t.length + 2))) {
      value = names[t].find(([variant]) => variant === v.slice(t.length + 2))[1];
    } else fail(`cannot read ${what}: not an integer, a bool, a named enum value or a cost preset`);
    out[field] = value;
  }
  return out;
}
const defaults = {
  PartitionOptions: kernelDefaults('partition.rs', 'PartitionOptions'),
  PackOptions: kernelDefaults('pack.rs', 'PackOptions'),
  MicroOptions: kernelDefaults('balance/micro.rs', 'MicroOptions', ['cost', 'min_count', 'divisible_by', 'order']),
  DpOptions: kernelDefaults('balance/dp.rs', 'DpOptions', ['cost', 'equal_count']),
  AlignOptions: kernelDefaults('layout.rs', 'AlignOptions', ['cp', 'tp', 'power_of_two']),
  PlanOptions: kernelDefaults('plan.rs', 'PlanOptions'),
  StreamOptions: kernelDefaults('stream/mod.rs', 'StreamOptions', ['align', 'oversize']),
  StreamLimits: kernelDefaults('stream/limited.rs', 'StreamLimits', ['max_segments']),
  VerlMicroOptions: kernelDefaults('peers/micro.rs', 'VerlMicroOptions', ['use_dynamic_bsz_balance', 'force_group_size']),
  RollLoadBalanceOptions: kernelDefaults('peers/micro.rs', 'RollLoadBalanceOptions', ['min_num_micro_batches', 'tp', 'cp', 'vp']),
};
/** The cases of `kind` (`enum`, `variant`) `name` of interface `iface` of the kernel's WIT. */
function witCases(iface, kind, name) {
  const body = WIT.match(new RegExp(`\\binterface ${iface} \\{([\\s\\S]*?)\\n\\}`));
  const m = body?.[1].match(new RegExp(`\\b${kind} ${name} \\{([^}]*)\\}`));
  if (!m) fail(`the kernel's WIT (wit/) has no ${kind} ${name} in interface ${iface}`);
  return m[1].split(',').map((c) => c.trim().replace(/\(.*\)$/, '')).filter(Boolean);
}
/**
 * The Python exception of each case of verl's py-error (its WIT tag → class name), from
 * PyError::type_name (kernel/src/peers/verl.rs); the tag is the variant's name in kebab-case.
 */
function pyErrors() {
  const { path, text } = kernelSource('peers/verl.rs');
  const kebab = (ident) => ident.replace(/(?<!^)([A-Z])/g, '-$1').toLowerCase();
  const names = Object.fromEntries([...text.matchAll(/PyError::(\w+)\(_\) => "(\w+)",/g)].map((m) => [kebab(m[1]), m[2]]));
  const out = {};
  for (const tag of witCases('verl', 'variant', 'py-error')) {
    if (!(tag in names)) fail(`${path}'s PyError::type_name names no Python exception for verl's py-error ${tag}`);
    out[tag] = names[tag];
  }
  return out;
}
/** `value` as a JavaScript literal: bigints as `Nn`, arrays and objects frozen. */
function literal(value) {
  if (typeof value === 'bigint') return `${value}n`;
  if (Array.isArray(value)) return `Object.freeze([${value.map(literal).join(', ')}])`;
  if (value && typeof value === 'object') {
    return `Object.freeze({ ${Object.entries(value).map(([k, v]) => `${/^\w+$/.test(k) ? k : JSON.stringify(k)}: ${literal(v)}`).join(', ')} })`;
  }
  return JSON.stringify(value);
}

copyFileSync(componentPath, join(out, 'stowplan_kernel.wasm'));
const manifest = `// Generated by scripts/build.mjs from ${componentPath.slice(root.length + 1)}: do not edit.
/** The sha256 (hex) the kernel component must have, from ${shaPath.slice(root.length + 1)}. */
export const COMPONENT_SHA256 = ${JSON.stringify(expected)};
/** The component's size in bytes. */
export const COMPONENT_BYTES = ${component.length};
/** Each core module jco's bindings ask for: its byte range in the component. */
export const CORE_MODULES = ${JSON.stringify(modules, null, 2)};
/** The streaming packer's defaults and limits, from kernel/src/stream/mod.rs. */
export const STREAM = Object.freeze(${JSON.stringify(stream)});
/** The kernel's limits on counts: MAX_COUNT (kernel/src/lib.rs), MAX_PARALLEL (kernel/src/layout.rs), MAX_RESOURCES (kernel/src/multi/mod.rs). */
export const LIMITS = Object.freeze(${JSON.stringify(limits)});
/** The segment limit's name beside the named resources of a packing under several limits (kernel/src/multi/mod.rs). */
export const SEGMENTS = ${JSON.stringify(kernelString('multi/mod.rs', 'SEGMENTS'))};
/** Every option name of the kernel's named enums, type → names, the default first (kernel/src/names.rs). */
export const NAMES = ${literal(Object.fromEntries(Object.entries(names).map(([type, v]) => [type, v.map(([, name]) => name)])))};
/** The kernel's cost presets, name → [linear, quadratic] (kernel/src/names.rs COST_PRESETS, balance/mod.rs). */
export const COST_PRESETS = ${literal(costs.presets)};
/** The Python exception of each case of verl's py-error, WIT tag → name (kernel/src/peers/verl.rs PyError::type_name). */
export const PY_ERRORS = ${literal(pyErrors())};
/** The verl functions the kernel reproduces: the cases of the verl interface's function enum (wit/peers.wit). */
export const VERL_FUNCTIONS = ${literal(witCases('verl', 'enum', 'function'))};
/** The defaults the kernel's options constructors set, struct → field → value (enums and costs by name). */
export const DEFAULTS = ${literal(defaults)};
/** The Rust types of the options structs whose every field is an option, struct → field → type. */
export const OPTION_TYPES = ${literal(optionTypes)};
`;
writeFileSync(join(out, 'manifest.js'), manifest);

mkdirSync(join(out, 'workloads'), { recursive: true });
copyFileSync(workload, join(out, 'workloads/rl-math-8k.txt'));
console.log(`build: kernel ${expected.slice(0, 12)}… (${component.length} bytes), ${Object.keys(modules).length} core module(s) → ${out}`);

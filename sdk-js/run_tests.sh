#!/usr/bin/env bash
# The JavaScript SDK's tests, as `cargo xtask test` runs them: installs the pinned tools
# (jco, componentize-js, playwright-core, TypeScript), builds the package from the
# committed kernel component, runs the Node tests (conformance vectors, plans against the CLI,
# types, the JavaScript plugins in the Rust sandbox), installs the packed package into a fresh
# project as a user would, then runs the plan explorer's test in Debian's headless Chromium.
#
# Environment: STOWPLAN_BIN (the CLI; default target/release/stowplan, built when missing),
# STOWPLAN_CHROMIUM (default /usr/bin/chromium), STOWPLAN_REQUIRE_BROWSER=1 (fail instead of
# skipping the browser test when there is no chromium), STOWPLAN_SCREENSHOTS (where the explorer's
# screenshots go; default a fresh temporary directory, printed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$here"

echo "sdk-js: node $(node --version), npm $(npm --version 2>/dev/null)"
# The locked versions, exactly: `npm ci` installs package-lock.json as it is (and fails if it
# does not match package.json). `--build-only` stops after the build: `cargo xtask test` builds
# first, then runs the tests with STOWPLAN_SDK_JS_BUILT=1 beside the Rust test binaries and
# then the Python SDK's tests, whose README test uses this build (so nothing may rebuild it
# while they run).
if [ "${STOWPLAN_SDK_JS_BUILT:-0}" != "1" ]; then
    # npm ci can fail on its own, e.g. ENOTEMPTY removing a directory it is extracting (seen
    # once in CI on a fresh clone): one clean retry before giving up.
    npm ci --no-audit --no-fund --loglevel=error || {
        echo "sdk-js: npm ci failed; removing node_modules and retrying once" >&2
        rm -rf node_modules
        npm ci --no-audit --no-fund --loglevel=error
    }
    node scripts/build.mjs
fi
if [ "${1:-}" = "--build-only" ]; then
    exit 0
fi

if [ -z "${STOWPLAN_BIN:-}" ] && [ ! -x "$root/target/release/stowplan" ]; then
    (cd "$root" && cargo build --release --locked -p stowplan-cli --bin stowplan)
fi
export STOWPLAN_BIN="${STOWPLAN_BIN:-$root/target/release/stowplan}"

node --test test/*.test.js

# The packed package, installed from its tarball into an empty CommonJS project (`npm init -y`;
# no registry needed: it has no runtime dependencies), used by name as a user would: imported
# from an .mjs file, required from a .cjs file (the "require" entry's promise), and both
# kinds type-checked by a strict TypeScript consumer against the installed package's types.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# --ignore-scripts: packed as built above (`prepack` would delete and rebuild generated/).
tarball="$(npm pack --ignore-scripts --silent --pack-destination "$scratch" | tail -1)"
(
    cd "$scratch"
    npm init -y > /dev/null
    npm install --no-audit --no-fund --offline --loglevel=error "./$tarball"
    cat > esm.mjs <<'JS'
import { partition, kernelInfo } from 'stowplan';
import { verl } from 'stowplan/compat';
const p = partition([100, 900, 50, 950, 400, 600], 2);
if (JSON.stringify(p.groups.map((g) => Array.from(g))) !== '[[0,2,3,4],[1,5]]') throw new Error('unexpected groups');
if (verl('karmarkar_karp', [1, 2, 3], 2, false).length !== 2) throw new Error('unexpected verl');
console.log('sdk-js: the packed package imports (ESM) and plans, kernel', kernelInfo().sha256.slice(0, 12));
JS
    cat > cjs.cjs <<'JS'
const { load } = require('stowplan');
(async () => {
  const stowplan = await load();
  const { verl } = await require('stowplan/compat').load();
  const p = stowplan.partition([100, 900, 50, 950, 400, 600], 2);
  if (JSON.stringify(p.groups.map((g) => Array.from(g))) !== '[[0,2,3,4],[1,5]]') throw new Error('unexpected groups');
  if (verl('karmarkar_karp', [1, 2, 3], 2, false).length !== 2) throw new Error('unexpected verl');
  if ((await load()) !== (await import('stowplan'))) throw new Error('require and import load different instances');
  console.log('sdk-js: the packed package requires (CommonJS) and plans, kernel', stowplan.kernelInfo().sha256.slice(0, 12));
})().catch((e) => { console.error(e); process.exit(1); });
JS
    node esm.mjs
    node cjs.cjs
    cat > esm.mts <<'TS'
import { partition, type Partition } from 'stowplan';
import { verl } from 'stowplan/compat';
const p: Partition = partition([1, 2, 3], 2);
export const lists: number[][] = verl('karmarkar_karp', [1, 2, 3], 2, false);
export const groups: Uint32Array[] = p.groups;
TS
    cat > cjs.cts <<'TS'
import stowplan = require('stowplan');
import compat = require('stowplan/compat');
import type { Partition } from 'stowplan';
export async function groups(): Promise<Uint32Array[]> {
  const p: Partition = (await stowplan.load()).partition([1, 2, 3], 2);
  const { verl } = await compat.load();
  return p.groups.concat(verl('karmarkar_karp', [1, 2, 3], 2, false).map((l: number[]) => Uint32Array.from(l)));
}
TS
    printf '{"compilerOptions":{"strict":true,"noEmit":true,"target":"es2022","module":"nodenext","moduleResolution":"nodenext","skipLibCheck":false,"types":[]},"files":["esm.mts","cjs.cts"]}\n' > tsconfig.json
    node "$here/node_modules/typescript/bin/tsc" -p tsconfig.json
    echo "sdk-js: the packed package type-checks from ESM (.mts) and CommonJS (.cts) TypeScript"
)

chromium="${STOWPLAN_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$chromium" ]; then
    # The screenshots (dp 8, dp 64, an error) are kept, to be looked at.
    export STOWPLAN_SCREENSHOTS="${STOWPLAN_SCREENSHOTS:-$(mktemp -d "${TMPDIR:-/tmp}/stowplan-explorer-XXXXXX")}"
    node --test test/browser/*.test.js
    echo "sdk-js: explorer screenshots: $STOWPLAN_SCREENSHOTS (explorer-dp8.png, explorer-dp64.png, explorer-error.png)"
elif [ "${STOWPLAN_REQUIRE_BROWSER:-0}" = "1" ]; then
    echo "sdk-js: ERROR: $chromium is missing and STOWPLAN_REQUIRE_BROWSER=1 (apt-get install chromium)" >&2
    exit 1
else
    echo "sdk-js: WARNING: no chromium at $chromium: the plan explorer's browser test DID NOT RUN (apt-get install chromium)" >&2
fi

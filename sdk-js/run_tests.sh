#!/usr/bin/env bash
# The JavaScript SDK's tests, as `cargo xtask test` runs them: installs the pinned tools
# (jco, componentize-js, playwright-core, TypeScript), builds the package from the
# committed kernel component, runs the Node tests (conformance vectors, plans against the CLI,
# types, the JavaScript plugins in the Rust sandbox), installs the packed package into a fresh
# project as a user would, then runs the plan explorer's test in Debian's headless Chromium.
#
# Environment: STOWPLAN_BIN (the CLI; default target/release/stowplan, built when missing),
# STOWPLAN_CHROMIUM (default /usr/bin/chromium), STOWPLAN_REQUIRE_BROWSER=1 (fail instead of
# skipping the browser test when there is no chromium).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$here"

echo "sdk-js: node $(node --version), npm $(npm --version 2>/dev/null)"
# The locked versions, exactly: `npm ci` installs package-lock.json as it is (and fails if it
# does not match package.json).
npm ci --no-audit --no-fund --loglevel=error
node scripts/build.mjs

if [ -z "${STOWPLAN_BIN:-}" ] && [ ! -x "$root/target/release/stowplan" ]; then
    (cd "$root" && cargo build --release --locked -p stowplan-cli --bin stowplan)
fi
export STOWPLAN_BIN="${STOWPLAN_BIN:-$root/target/release/stowplan}"

node --test test/*.test.js

# The packed package, installed from its tarball into an empty project (no registry needed:
# it has no runtime dependencies), imported by name.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
tarball="$(npm pack --silent --pack-destination "$scratch" | tail -1)"
(
    cd "$scratch"
    npm init -y > /dev/null
    npm install --no-audit --no-fund --offline --loglevel=error "./$tarball"
    node --input-type=module -e "
import { partition, kernelInfo } from 'stowplan';
import { verl } from 'stowplan/compat';
const p = partition([100, 900, 50, 950, 400, 600], 2);
if (JSON.stringify(p.groups.map((g) => Array.from(g))) !== '[[0,2,3,4],[1,5]]') throw new Error('unexpected groups');
if (verl('karmarkar_karp', [1, 2, 3], 2, false).length !== 2) throw new Error('unexpected verl');
console.log('sdk-js: the packed package imports and plans, kernel', kernelInfo().sha256.slice(0, 12));
"
)

chromium="${STOWPLAN_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$chromium" ]; then
    node --test test/browser/*.test.js
    echo "sdk-js: explorer screenshot: $here/test-results/explorer.png"
elif [ "${STOWPLAN_REQUIRE_BROWSER:-0}" = "1" ]; then
    echo "sdk-js: ERROR: $chromium is missing and STOWPLAN_REQUIRE_BROWSER=1 (apt-get install chromium)" >&2
    exit 1
else
    echo "sdk-js: WARNING: no chromium at $chromium: the plan explorer's browser test DID NOT RUN (apt-get install chromium)" >&2
fi

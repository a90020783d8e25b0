// A static file server for the plan explorer: serves sdk-js/ (the explorer, the package's
// src/ and generated/) on 127.0.0.1 and nothing else; no server logic. The explorer is at
// /explorer/. Usage: node scripts/serve.mjs [--port N] (0: any free port).
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { dirname, extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.wasm': 'application/wasm',
  '.json': 'application/json',
  '.txt': 'text/plain; charset=utf-8',
};

/**
 * Starts the server on `port` (0: any free one) and resolves to it.
 * @param {number} [port]
 * @returns {Promise<import('node:http').Server>}
 */
export function serve(port = 0) {
  const server = createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url ?? '/', 'http://localhost').pathname);
    const file = normalize(join(ROOT, path.endsWith('/') ? `${path}index.html` : path));
    const allowed = (file.startsWith(`${ROOT}${sep}`) && !file.includes(`${sep}node_modules${sep}`));
    try {
      if (!allowed || req.method !== 'GET') throw new Error('not served');
      const body = await readFile(file);
      res.writeHead(200, { 'content-type': TYPES[extname(file)] ?? 'application/octet-stream', 'cache-control': 'no-store' });
      res.end(body);
    } catch {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('not found\n');
    }
  });
  return new Promise((ok) => server.listen(port, '127.0.0.1', () => ok(server)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const i = process.argv.indexOf('--port');
  const server = await serve(i > 0 ? Number(process.argv[i + 1]) : 8080);
  const { port } = /** @type {import('node:net').AddressInfo} */ (server.address());
  console.log(`stowplan explorer: http://127.0.0.1:${port}/explorer/ (Ctrl-C stops)`);
}

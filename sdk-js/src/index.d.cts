// Types of the CommonJS entry (src/index.cjs): `require('stowplan').load()` resolves to the ES
// module's namespace, typed by index.d.ts. The types are re-exported, so that a CommonJS
// TypeScript file can name them (`import type { Partition } from 'stowplan'`).
export type * from './index.js';

/** The package's API (the ES module's namespace), once the kernel component is loaded and checked. */
export function load(): Promise<typeof import('./index.js')>;

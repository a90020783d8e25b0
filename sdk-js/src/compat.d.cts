// Types of the CommonJS entry of `stowplan/compat` (src/compat.cjs).
export type * from './compat.js';

/** `stowplan/compat`'s API (the ES module's namespace), once the kernel component is loaded. */
export function load(): Promise<typeof import('./compat.js')>;

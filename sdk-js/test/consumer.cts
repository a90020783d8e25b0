// A CommonJS TypeScript consumer of the package (the "require" entry, src/index.d.cts):
// compiled (no emit) by types.test.js with consumer.ts.
import stowplan = require('stowplan');
import compat = require('stowplan/compat');
import type { Balance, MultiPacking, Partition, StreamPacker } from 'stowplan';

async function main(): Promise<string> {
  const sp = await stowplan.load();
  const p: Partition = sp.partition([100, 900, 50n], 2, { method: 'kk' });
  const groups: Uint32Array[] = p.groups;
  const b: Balance = sp.balance(Uint32Array.from([1, 2, 3, 4]), 2, { capacity: 4 });
  const multi: MultiPacking = sp.packMulti({ tokens: [900, 300] }, { tokens: 1200 }, { maxSegments: 2 });
  const packer: StreamPacker = await sp.streamPacker(16384);
  packer.dispose();
  const { verl } = await compat.load();
  const lists: number[][] = verl('karmarkar_karp', [1, 2, 3], 2, false);
  const again: typeof sp = await sp.load();
  return `${groups.length} ${multi.resourceLoads.length} ${b.toJSONText().length} ${lists.length} ${again.kernelInfo().sha256}`;
}
export = main;

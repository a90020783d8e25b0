// A TypeScript consumer of the package: compiled (no emit) by types.test.js, so the .d.ts
// files are checked against real use.
import { COSTS, InvalidArgumentError, Stowplan, balance, microBatches, partition, rawPlan, alignedPlan, permutation, cpLayout, padFactor, streamPacker, streamPackerFromState } from 'stowplan';
import type { ClosedBins, StreamPacker, StreamStatus } from 'stowplan';
import type { Figures, Partition } from 'stowplan';
import { verl, rollLoadBalance, PeerError } from 'stowplan/compat';

const p: Partition = partition([100, 900, 50n], 2, { method: 'kk' });
const sums: BigUint64Array = p.sums;
const groups: Uint32Array[] = p.groups;
const b = balance(Uint32Array.from([1, 2, 3, 4]), 2, { maxTokenLen: 4, cost: 'attention', order: 'verl' });
const f: Figures = b.tokenBalance;
const count: number | null = b.count;
const text: string = b.toJSONText();
const mb = microBatches([1, 2], 10n, { cost: [1, 0] });
const restore: Uint32Array = mb.restore;
const raw = rawPlan([1, 2, 3], { packingLength: 4 });
const checksum: string = alignedPlan(raw, 2, { dropLast: false }).checksum;
const perm: Uint32Array = permutation(10, 42);
const factor: bigint = padFactor({ cp: 2, align: 'roll' });
const lay = cpLayout([2, 4], { cp: 2 });
const parts: Float32Array[] = lay.split(new Float32Array(8));
const lists: number[][] = verl('karmarkar_karp', [1, 2, 3], 2, false);
const roll = rollLoadBalance([1, 2], 4, 8, { cp: 1 });
const e: Error = new InvalidArgumentError('x');
const pe: PeerError = new PeerError('IndexError', 'y');
const later: Promise<Stowplan> = Stowplan.load();
const attention: readonly [bigint, bigint] = COSTS.attention;
const sp: StreamPacker = await streamPacker(16384, { maxOpenBins: 8, oversize: 'drop' });
const closed: ClosedBins = sp.add(Uint32Array.from([5, 9]));
const streamBins: BigUint64Array[] = closed.bins;
const st: StreamStatus = sp.status();
const resumed: BigUint64Array = (await streamPackerFromState(sp.state())).finish().loads;
sp.dispose();
const mm = microBatches([1, 2], 10, { extraCosts: [0, 5] }).costs;
export { sums, groups, f, count, text, restore, checksum, perm, factor, parts, lists, roll, e, pe, later, attention, streamBins, st, resumed, mm };

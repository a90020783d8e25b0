// Types of the `stowplan` package (src/index.js).
//
// Integers are exact: u64 values are bigints (scalars) and BigUint64Arrays (lists); u32 values
// are numbers and Uint32Arrays. Inputs take numbers (safe integers) or bigints.

// A result's fields that the kernel computes are declared as the kernel's records, jco's types of
// the WIT (generated/types, made by scripts/build.mjs from wit/ with its docs): a field the WIT
// adds reaches these types with no edit here. The result classes add what they compute.
import type { Groups } from '../generated/types/interfaces/stowplan-kernel-types.js';
import type { Partitioning, Options as PartitionRecord } from '../generated/types/interfaces/stowplan-kernel-partition.js';
import type { Packing as PackingRecord, Options as PackRecord } from '../generated/types/interfaces/stowplan-kernel-pack.js';
import type { MicroPlan, DpPlan } from '../generated/types/interfaces/stowplan-kernel-balance.js';
import type { CpSplit } from '../generated/types/interfaces/stowplan-kernel-layout.js';
import type { RawPackPlan, AlignedPackPlan, PlanOptions as PlanRecord } from '../generated/types/interfaces/stowplan-kernel-plan.js';

/** The fields of kernel record `R` as a result holds them: read-only, its groups field `G` flattened into `offsets` and `indices`. */
type Flat<R, G extends keyof R> = Readonly<Omit<R, G> & Groups>;

/**
 * Lengths or weights: an array of integers (numbers or bigints), an integer typed array, or
 * another iterable of integers; at most 2**28 entries (268,435,456: the list must fit in the
 * 2 GiB jco's bindings pass it through), more is refused with an InvalidArgumentError before
 * anything is read or allocated.
 */
export type Integers =
  | ArrayLike<number | bigint>
  | Iterable<number | bigint>
  | Uint8Array
  | Uint8ClampedArray
  | Uint16Array
  | Uint32Array
  | Int8Array
  | Int16Array
  | Int32Array
  | BigUint64Array
  | BigInt64Array;

/** An integer argument: a safe-integer number or a bigint. */
export type Int = number | bigint;

/** A cost model: a preset name or `[linear, quadratic]` (a sequence of L tokens costs `linear·L + quadratic·L²`). */
export type Cost = 'tokens' | 'attention' | readonly [Int, Int];

/** Balance figures of per-group totals (the kernel's `balance.figures-of`). */
export interface Figures {
  /** The largest total. */
  max: bigint;
  /** The smallest total. */
  min: bigint;
  /** The mean total. */
  mean: number;
  /** `max / mean`: 1 for a perfect balance. */
  maxOverMean: number;
  /** `max - min`. */
  spread: bigint;
}

/** Base class of every stowplan error. */
export class StowplanError extends Error {
  constructor(message: string, kind?: string);
  /** The host's name of the error kind (`invalid-argument`, `infeasible`, `runtime`, `peer`). */
  readonly kind: string;
}
/** An argument is outside its documented range; the message names it and the range. */
export class InvalidArgumentError extends StowplanError {
  constructor(message: string);
}
/** Valid arguments that no result satisfies, e.g. a length above the bin capacity. */
export class InfeasibleError extends StowplanError {
  constructor(message: string);
}
/** The WebAssembly kernel failed to load (e.g. its sha256 is not the pinned one) or trapped. */
export class KernelRuntimeError extends StowplanError {
  constructor(message: string);
}
/** A peer reproduction (verl, ROLL, prime-rl) failed as the peer does. */
export class PeerError extends StowplanError {
  constructor(type: string, message: string);
  /** The Python exception class the peer raises (`AssertionError`, `IndexError`, …). */
  readonly type: string;
}

/** The kernel's named cost models, name → `[linear, quadratic]`. */
export const COSTS: Readonly<{ tokens: readonly [bigint, bigint]; attention: readonly [bigint, bigint] }>;

/**
 * The options of a kernel options record as a call takes them: every field optional
 * (omitted or `null`: the kernel's default), integers as numbers or bigints, enum names also
 * with `_` for `-`; the fields and their docs are the WIT's (generated/types).
 */
export type KernelOptions<R> = {
  [K in keyof R]?: (R[K] extends bigint ? Int : R[K] extends string ? R[K] | Underscored<R[K]> : R[K]) | null;
};
/** An option name with `_` for `-` (`'next_fit'` for `'next-fit'`). */
type Underscored<S extends string> = S extends `${infer A}-${infer B}` ? `${A}_${Underscored<B>}` : S;

/** Options of `partition`: the kernel's partition options record (`refine` by default except for `'verl'`). */
export type PartitionOptions = KernelOptions<PartitionRecord>;

/** Options of `pack`: the kernel's pack options record but `capacity` (an argument of its own). */
export type PackOptions = KernelOptions<Omit<PackRecord, 'capacity'>>;

/** Options of `packMulti`: `pack`'s (`align` rounds the tokens only; an item over any capacity is oversized) and a segment limit. */
export interface MultiPackOptions extends Omit<PackOptions, 'method'> {
  /**
   * `'balanced'` (the default: packs filled so that their limits run out together;
   * capacities up to 2^32 − 1), `'bfd'`, `'ffd'` or `'next-fit'`.
   */
  method?: MultiMethod;
  /** At most this many items (segments) per bin (default 0: no limit). */
  maxSegments?: Int;
}

/**
 * Named values of `packMulti`: an object or a Map, resource name → value, in insertion order
 * (an object's integer-like keys come first, as JavaScript orders them; a Map keeps any order).
 */
export type Named<T> = Readonly<Record<string, T>> | ReadonlyMap<string, T>;

/** How items are packed under several limits (`'balanced'` by default). */
export type MultiMethod = 'balanced' | 'bfd' | 'ffd' | 'next-fit';

/** Options of `microBatches` (and the micro-batch level of `balance`). */
export interface MicroBatchOptions {
  /** The cost balanced across micro-batches (default `'tokens'`). */
  cost?: Cost;
  /** At least this many micro-batches (default 0: no minimum). */
  minCount?: Int;
  /** The count is rounded up to a multiple of this (default 1). */
  divisibleBy?: Int;
  /** Exactly this many micro-batches. */
  count?: Int;
  /** `'none'` (input order, default), `'cost-desc'`, `'verl'` or `'roll'`. */
  order?: 'none' | 'cost-desc' | 'cost_desc' | 'verl' | 'roll';
  /**
   * One extra cost per sample in the cost model's units (image patches, vision tokens of a
   * multimodal sample): balanced over micro-batches (and ranks); caps count tokens only.
   */
  extraCosts?: Integers;
}

/** Options of `microBatches`: the shared ones and further caps per micro-batch. */
export interface LimitedMicroBatchOptions extends MicroBatchOptions {
  /**
   * Each further resource's size per sequence (image tokens, images …), name → sizes; not
   * `tokens` (those are the lengths and `capacity`). 1 to 7 resources; needs `limits`.
   */
  resources?: Named<Integers>;
  /** Each resource's cap per micro-batch (≥ 1), the same names as `resources`. */
  limits?: Named<Int>;
}

/** Options of `balance` (`resources` and `limits` cap every rank's micro-batches; they need `capacity`). */
export interface BalanceOptions extends LimitedMicroBatchOptions {
  /** The micro-batch cap; without it only the DP level is planned. */
  capacity?: Int;
  /** @deprecated The former name of `capacity` (warns; removed in the next release). */
  maxTokenLen?: Int;
  /** One label per sample (any values): samples with the same label stay on one rank. */
  groups?: Iterable<unknown>;
  /** Balance each run of this many consecutive samples separately (verl's keep_minibatch). */
  minibatchSize?: Int;
  /** Every rank gets the same number of samples (default true). */
  equalCount?: boolean;
}

/** Options of `streamPacker`. */
export interface StreamPackerOptions {
  /** Open bins at most, 1..=65536 (default 64). */
  maxOpenBins?: Int;
  /** Lengths waiting unplaced at most, 0..=1048576 (default 4096; 0 places each on arrival). */
  maxBuffered?: Int;
  /** Round each length up to a multiple of this first (default 1). */
  align?: Int;
  /** A length above the capacity: `'error'` (default; nothing applied), `'single'` or `'drop'`. */
  oversize?: 'error' | 'single' | 'drop';
  /**
   * Further limits per bin: each resource's name (not `tokens`) → its cap (≥ 1; up to 7). With
   * limits, `add` takes every item's sizes in them (`resources`).
   */
  limits?: Named<Int>;
  /** Items per bin at most (default 0: no segment limit). */
  maxSegments?: Int;
}

/** Options of `StreamPacker#add`. */
export interface StreamAddOptions {
  /** With limits: each limit's name → these items' sizes in it, one per length. */
  resources?: Named<Integers>;
}

/** Options of `padFactor` and `cpLayout`. */
export interface AlignOptions {
  /** Context-parallel size, 1..=65536 (default 1; required by `cpLayout`). */
  cp?: Int;
  /** Tensor-parallel size, 1..=65536 (default 1). */
  tp?: Int;
  /** `'cp_tp'` (default: `2·cp·tp`, `tp` when cp = 1), `'roll'` (`lcm(16, 2·cp·tp)`) or a multiple. */
  align?: 'cp_tp' | 'roll' | Int;
  /** Refuse cp/tp that are not powers of two (default false). */
  powerOfTwo?: boolean;
}

/** Options of `rawPlan`: `capacity` (or, deprecated, `packingLength`) and the rest. */
export type RawPlanOptions = RawPlanOptionsBase & (
  | {
      /** The hard cap of a multi-sample pack, tokens (≥ 1). */
      capacity: Int;
    }
  | {
      /** @deprecated The former name of `capacity` (warns; removed in the next release). */
      packingLength: Int;
    }
);

/** The options of `rawPlan` beside its cap: the kernel's plan options record's, and further limits. */
export interface RawPlanOptionsBase extends KernelOptions<Omit<PlanRecord, 'capacity'>> {
  /** Each further resource's sizes per sample (image tokens, images …); with `limits`. */
  resources?: Named<Integers>;
  /** Each resource's cap per pack (≥ 1); a sample over one is long. */
  limits?: Named<Int>;
  /** At most this many samples per multi-sample pack (default 0: no limit). */
  maxSegments?: Int;
  /** How the samples are packed under limits (default `'balanced'`); with limits only. */
  method?: MultiMethod;
}

/** The kernel's fields of a `Partition` (see its class). */
export interface Partition extends Flat<Partitioning, 'groups'> {}

/** A partition of the input indices into `k` groups. */
export class Partition {
  private constructor();
  /** Number of groups. */
  readonly k: number;
  /** The largest group sum. */
  readonly max: bigint;
  /** The groups, as views into `indices`. */
  readonly groups: Uint32Array[];
  /** Number of groups. */
  readonly length: number;
}

/** The kernel's fields of a `Packing` (see its class). */
export interface Packing extends Flat<PackingRecord, 'bins'> {}

/** Bins of a packing. */
export class Packing {
  /** Made by `pack` (and, as the base of `MultiPacking`, `packMulti`). */
  protected constructor();
  /** Alignment padding. */
  readonly paddingTokens: bigint;
  /** Real tokens of the regular bins over their capacity. */
  readonly efficiency: number;
  /** The bin capacity. */
  readonly capacity: bigint;
  /** Number of bins. */
  readonly numBins: number;
  /** The bins, as views into `indices`. */
  readonly bins: Uint32Array[];
  /** Number of bins. */
  readonly length: number;
}

/**
 * Bins under several limits: a `Packing` (`loads`, `realTokens`, `efficiency` … count tokens;
 * `lowerBound` is the largest of `lowerBounds`) plus every bin's load in every resource.
 */
export class MultiPacking extends Packing {
  private constructor();
  /** The resources' names, tokens first, in the order of `columns`. */
  readonly names: string[];
  /** Each resource's capacity per bin, name → capacity. */
  readonly capacities: Record<string, bigint>;
  /** Items per bin at most (0n: no limit). */
  readonly maxSegments: bigint;
  /** Every bin's load in every resource: one array per bin, in the order of `names`. */
  readonly resourceLoads: BigUint64Array[];
  /**
   * name → ceil(sum of the sizes of the items that fit / capacity), and `segments` →
   * ceil(items that fit / maxSegments) with a segment limit.
   */
  readonly lowerBounds: Record<string, bigint>;
}

/** The kernel's fields of a `MicroBatches` (see its class). */
export interface MicroBatches extends Flat<MicroPlan, 'batches'> {}

/** Micro-batches of one batch. */
export class MicroBatches {
  private constructor();
  /** Number of micro-batches. */
  readonly count: number;
  /** The micro-batches, as views into `indices`. */
  readonly batches: Uint32Array[];
  /** Balance of the micro-batches' tokens. */
  readonly tokenBalance: Figures;
  /** Balance of the micro-batches' costs. */
  readonly costBalance: Figures;
  /** Number of micro-batches. */
  readonly length: number;
  /**
   * JSON text byte-identical to `stowplan balance --max-token-len T --json`'s plan (the kernel writes it).
   * @throws {InvalidArgumentError} when an array was edited to name a sample beyond the batch.
   */
  toJSONText(): string;
}

/** The kernel's fields of a `Balance` (see its class). */
export interface Balance extends Readonly<Omit<DpPlan, 'ranks'>> {}

/** A global batch over `dp` ranks, with every rank's micro-batches when a cap was given. */
export class Balance {
  private constructor();
  /** Rank boundaries into `order`: rank `r` gets `order[offsets[r] .. offsets[r + 1]]`. */
  readonly offsets: Uint32Array;
  /** The permutation to reorder the batch by, rank after rank. */
  readonly order: Uint32Array;
  /** Every rank's micro-batches, or null without `capacity`. */
  readonly microBatches: readonly MicroBatches[] | null;
  /** The micro-batch count of every rank, or null without `capacity`. */
  readonly count: number | null;
  /** Number of ranks. */
  readonly dp: number;
  /** The global lengths planned. */
  readonly lengths: BigUint64Array;
  /** Every rank's samples, as views into `order`. */
  readonly ranks: Uint32Array[];
  /** Balance of the ranks' tokens. */
  readonly tokenBalance: Figures;
  /** Balance of the ranks' costs. */
  readonly costBalance: Figures;
  /** Number of ranks. */
  readonly length: number;
  /** verl's `log_seqlen_unbalance` metrics for these ranks. */
  logSeqlenUnbalance(prefix?: string): Record<string, bigint | number>;
  /**
   * JSON text byte-identical to the plan `stowplan balance --dp N [--max-token-len T] --json` prints (the kernel writes it).
   * @throws {InvalidArgumentError} when an array was edited to name a sample beyond the batch.
   */
  toJSONText(): string;
}

/** The kernel's fields of a `CpLayout` (see its class). */
export interface CpLayout extends Readonly<CpSplit> {}

/** One packed row split over context-parallel ranks. */
export class CpLayout {
  private constructor();
  /** The CP size. */
  readonly cp: number;
  /** Tokens of the padded row. */
  readonly paddedTokens: bigint;
  /** Per CP rank, the positions of the padded row it receives. */
  readonly gather: Uint32Array[];
  /** Every CP rank's part of `row` (the padded row), of the row's own type. */
  split<T extends ArrayLike<unknown>>(row: T): T[];
  /** The inverse of `split`. */
  unpack<T extends ArrayLike<unknown>>(rows: T[]): T;
}

/** The kernel's fields of a `RawPlan` (see its class). */
export interface RawPlan extends Flat<RawPackPlan, 'packs'> {}

/** A raw static pack plan. */
export class RawPlan {
  private constructor();
  /** The options the plan was made with. */
  readonly options: { capacity: bigint; align: bigint; allowSingleLong: boolean };
  /** Number of packs. */
  readonly numPacks: number;
  /**
   * With limits: their names and caps, the segment limit, the method, every pack's load in
   * each limit (pack by pack) and the lower bound per resource (tokens, each limit, then
   * segments); otherwise null.
   */
  readonly limits: {
    names: string[];
    caps: BigUint64Array;
    maxSegments: bigint;
    method: MultiMethod;
    loads: BigUint64Array;
    lowerBounds: BigUint64Array;
  } | null;
  /** The packs, as views into `indices`. */
  readonly packs: Uint32Array[];
  /** Number of packs. */
  readonly length: number;
}

/** The kernel's fields of a `AlignedPlan` (see its class). */
export interface AlignedPlan extends Readonly<AlignedPackPlan> {}

/** The plan `worldSize` ranks consume. */
export class AlignedPlan {
  private constructor();
  /** The raw plan aligned. */
  readonly raw: RawPlan;
  /** Ranks the plan is aligned for. */
  readonly worldSize: number;
  /** Whether the remainder was dropped. */
  readonly dropLast: boolean;
  /** Sample indices of slot `i` (negative counts from the end). */
  pack(i: number): Uint32Array;
  /** Number of slots. */
  readonly length: number;
}

/** The loaded component: its sha256 (checked against the pin), size and source. */
export interface KernelInfo {
  /** sha256 (hex) of the component. */
  readonly sha256: string;
  /** Size in bytes. */
  readonly bytes: number;
  /** Where it was read from. */
  readonly source: string;
}

/** The bins one call of a `StreamPacker` closed. */
export class ClosedBins {
  private constructor();
  /** Bin boundaries into `indices`. */
  readonly offsets: Uint32Array;
  /** Stream indices, bin after bin (ascending in each bin). */
  readonly indices: BigUint64Array;
  /** Aligned load of each bin (above the capacity only for a `single` bin). */
  readonly loads: BigUint64Array;
  /** Stream indices of the lengths above the capacity left out under oversize `drop`, ascending. */
  readonly dropped: BigUint64Array;
  /** Number of bins. */
  readonly numBins: number;
  /** Under limits: each limit's name → every bin's load in it (empty without limits). */
  readonly resourceLoads: Readonly<Record<string, BigUint64Array>>;
  /** The bins, as views into `indices`. */
  readonly bins: BigUint64Array[];
  /** Number of bins. */
  readonly length: number;
}

/** Where a stream stands. */
export interface StreamStatus {
  /** The index the next length gets (lengths added so far). */
  readonly nextIndex: bigint;
  /** Lengths buffered, not yet in a bin. */
  readonly buffered: number;
  /** Bins open. */
  readonly openBins: number;
  /** Lengths in open bins. */
  readonly inOpenBins: bigint;
  /** The smallest index not yet in a closed bin (or dropped), or null. */
  readonly oldestHeld: bigint | null;
}

/**
 * A streaming bin packer: each bin comes out when it closes; memory stays bounded. It runs in
 * a kernel instance of its own; a trap there ends this packer only.
 */
export class StreamPacker {
  private constructor();
  /** The options it was made with. */
  readonly options: Readonly<{ capacity: bigint; align: bigint; maxOpenBins: number; maxBuffered: number; oversize: 'error' | 'single' | 'drop' }>;
  /** Each limit's name → its cap per bin (empty without limits). */
  readonly limits: Readonly<Record<string, bigint>>;
  /** Items per bin at most (0n: no segment limit). */
  readonly maxSegments: bigint;
  /** Stream indices dropped (oversize `drop`) by the last `add` that returned (`finish` drops none). */
  readonly lastDropped: BigUint64Array;
  /**
   * Adds the next lengths; returns the bins that closed. All or nothing: when the kernel refuses
   * (InfeasibleError, InvalidArgumentError) the packer is exactly as before the call, also for
   * an add of more than 4,194,304 lengths, which is cut into several kernel calls.
   */
  add(lengths: Integers, options?: StreamAddOptions): ClosedBins;
  /** Places every buffered length and closes every open bin; the packer stays usable. */
  finish(): ClosedBins;
  /** The whole state as bytes (framed, versioned, checksummed; the same from every host). */
  state(): Uint8Array;
  /** Where the stream stands. */
  status(): StreamStatus;
  /** Frees the packer and its kernel instance now; later calls throw KernelRuntimeError. */
  dispose(): void;
}

/** A loaded kernel component with the whole API. */
export class Stowplan {
  private constructor();
  /** Loads the kernel component (another copy: bytes or a URL), checking its sha256 against the pin. */
  static load(options?: { component?: Uint8Array | ArrayBuffer | URL | string }): Promise<Stowplan>;
  /** The loaded component. */
  kernelInfo(): KernelInfo;
  /** Balance figures of per-group totals (the kernel's). */
  figures(values: Integers): Figures;
  /** verl's `log_seqlen_unbalance` figures of `ranks` of `lengths` (the kernel's reproduction). */
  logSeqlenUnbalance(
    lengths: BigUint64Array | BigInt64Array,
    ranks: ArrayLike<number>[],
    prefix?: string,
  ): Record<string, bigint | number>;
  /** Splits `weights` into `k` groups with balanced sums. */
  partition(weights: Integers, k: Int, options?: PartitionOptions): Partition;
  /** Packs `lengths` into bins of `capacity` tokens. */
  pack(lengths: Integers, capacity: Int, options?: PackOptions): Packing;
  /** Packs items under several limits: `columns` name → sizes (tokens first), `capacities` name → capacity. */
  packMulti(columns: Named<Integers>, capacities: Named<Int>, options?: MultiPackOptions): MultiPacking;
  /** Splits one batch into micro-batches of at most `capacity` tokens. */
  microBatches(lengths: Integers, capacity: Int, options?: LimitedMicroBatchOptions): MicroBatches;
  /** Balances a global batch over `dp` ranks (and every rank's micro-batches with `capacity`). */
  balance(lengths: Integers, dp: Int, options?: BalanceOptions): Balance;
  /** The multiple every sequence length is padded to. */
  padFactor(options?: AlignOptions): bigint;
  /** Pads, packs and splits one row over `cp` ranks (zigzag). */
  cpLayout(lengths: Integers, options: AlignOptions & { cp: Int }): CpLayout;
  /** The raw static pack plan of a dataset's sample lengths. */
  rawPlan(lengths: Integers, options: RawPlanOptions): RawPlan;
  /** The plan `worldSize` ranks consume from `raw`. */
  alignedPlan(raw: RawPlan, worldSize: Int, options?: { dropLast?: boolean }): AlignedPlan;
  /** The seeded permutation of `0..n` for (seed, epoch). */
  permutation(n: Int, seed: Int, epoch?: Int): Uint32Array;
  /** A streaming packer (best fit, bounded open bins and buffer), in a kernel instance of its own. */
  streamPacker(capacity: Int, options?: StreamPackerOptions): Promise<StreamPacker>;
  /** The packer a `StreamPacker#state` saved (any host's): it continues exactly. */
  streamPackerFromState(state: Uint8Array | ArrayBuffer): Promise<StreamPacker>;
  /** The jco bindings of the component (low level; see `stowplan/compat`). */
  readonly kernel: unknown;
}

/** The kernel loaded at import. */
export const stowplan: Stowplan;
/** The loaded component's sha256, size and source. */
export function kernelInfo(): KernelInfo;
/** Splits `weights` into `k` groups with balanced sums. */
export function partition(weights: Integers, k: Int, options?: PartitionOptions): Partition;
/** Packs `lengths` into bins of `capacity` tokens. */
export function pack(lengths: Integers, capacity: Int, options?: PackOptions): Packing;
/** Packs items under several limits: `columns` name → sizes (tokens first), `capacities` name → capacity. */
export function packMulti(columns: Named<Integers>, capacities: Named<Int>, options?: MultiPackOptions): MultiPacking;
/** Splits one batch into micro-batches of at most `capacity` tokens. */
export function microBatches(lengths: Integers, capacity: Int, options?: LimitedMicroBatchOptions): MicroBatches;
/** Balances a global batch over `dp` ranks (and every rank's micro-batches with `capacity`). */
export function balance(lengths: Integers, dp: Int, options?: BalanceOptions): Balance;
/** The multiple every sequence length is padded to. */
export function padFactor(options?: AlignOptions): bigint;
/** Pads, packs and splits one row over `cp` ranks (zigzag). */
export function cpLayout(lengths: Integers, options: AlignOptions & { cp: Int }): CpLayout;
/** The raw static pack plan of a dataset's sample lengths. */
export function rawPlan(lengths: Integers, options: RawPlanOptions): RawPlan;
/** The plan `worldSize` ranks consume from `raw`. */
export function alignedPlan(raw: RawPlan, worldSize: Int, options?: { dropLast?: boolean }): AlignedPlan;
/** The seeded permutation of `0..n` for (seed, epoch). */
export function permutation(n: Int, seed: Int, epoch?: Int): Uint32Array;
/** A streaming packer (best fit, bounded open bins and buffer), in a kernel instance of its own. */
export function streamPacker(capacity: Int, options?: StreamPackerOptions): Promise<StreamPacker>;
/** The packer a `StreamPacker#state` saved (any host's): it continues exactly. */
export function streamPackerFromState(state: Uint8Array | ArrayBuffer): Promise<StreamPacker>;
/** Balance figures of per-group totals. */
export function figures(values: Integers): Figures;
/** verl's `log_seqlen_unbalance` figures of `ranks` of `lengths`. */
export function logSeqlenUnbalance(
  lengths: BigUint64Array | BigInt64Array,
  ranks: ArrayLike<number>[],
  prefix?: string,
): Record<string, bigint | number>;
/** Compact JSON text as the Rust host prints it (exact integers, Rust-style floats). */
export function toJSONText(value: unknown): string;
/** Checked conversions shared with `stowplan/compat` (not a stable API). */
export const internal: Record<string, Function>;
/** This module's namespace, as a promise: what `require('stowplan').load()` resolves to. */
export function load(): Promise<typeof import('./index.js')>;

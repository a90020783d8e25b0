// The errors stowplan throws: the JavaScript mirror of the Python SDK's exception tree
// (sdk-python/python/stowplan/errors.py), for the part of it this package can raise.
//
//   StowplanError                 every error of this package
//   ├── InvalidArgumentError      an argument outside its range (the message names it)
//   ├── InfeasibleError           valid arguments no result satisfies
//   ├── KernelRuntimeError        the kernel failed to load or trapped (never bad input)
//   └── PeerError                 a peer reproduction (verl, ROLL) failing as the peer does

/** Base class of every stowplan error. `kind` is the host's error kind (`invalid-argument`, …). */
export class StowplanError extends Error {
  /**
   * @param {string} message
   * @param {string} kind
   */
  constructor(message, kind = 'stowplan') {
    super(message);
    this.name = new.target.name;
    /** The host's name of the error kind, as the Rust host and the CLI spell it. */
    this.kind = kind;
  }
}

/** An argument is outside its documented range; the message names it and the range. */
export class InvalidArgumentError extends StowplanError {
  /** @param {string} message */
  constructor(message) {
    super(message, 'invalid-argument');
  }
}

/** Valid arguments that no result satisfies, e.g. a length above the bin capacity. */
export class InfeasibleError extends StowplanError {
  /** @param {string} message */
  constructor(message) {
    super(message, 'infeasible');
  }
}

/** The WebAssembly kernel failed to load (e.g. its sha256 is not the pinned one) or trapped. */
export class KernelRuntimeError extends StowplanError {
  /** @param {string} message */
  constructor(message) {
    super(message, 'runtime');
  }
}

/**
 * A peer reproduction (verl, ROLL, prime-rl) failed the way the peer fails: `type` is the
 * Python exception the peer raises (`AssertionError`, `IndexError`, …), `message` its text.
 */
export class PeerError extends StowplanError {
  /**
   * @param {string} type
   * @param {string} message
   */
  constructor(type, message) {
    super(message, 'peer');
    /** The Python exception class the peer raises. */
    this.type = type;
  }
}

/**
 * A kernel message with its snake_case argument names spelt as this package's options are
 * (`min_count` → `minCount`): the kernel names arguments as the Rust and Python APIs
 * spell them. Quoted words are values, not names (`'cp_tp'`), and stay as they are, and so
 * do the caller's own `names` (resource names such as `image_tokens`, which messages name).
 * @param {string} message @param {readonly string[]} [names]
 * @returns {string}
 */
export function camelCased(message, names = []) {
  return message.replace(/(?<!['"\w])([a-z][a-z0-9]*)((?:_[a-z0-9]+)+)(?!['"\w])/g, (word, head, rest) =>
    names.includes(word) ? word : head + rest.split('_').slice(1).map((w) => w[0].toUpperCase() + w.slice(1)).join(''),
  );
}

/**
 * The error a kernel result error becomes: `invalid-argument` → InvalidArgumentError,
 * `infeasible` → InfeasibleError, with the host's message prefix (`names`: the caller's
 * resource names, kept as spelt).
 * @param {{tag: string, val: string}} e @param {readonly string[]} [names]
 * @returns {StowplanError}
 */
export function fromKernel(e, names) {
  if (e.tag === 'invalid-argument') return new InvalidArgumentError(`invalid argument: ${camelCased(e.val, names)}`);
  if (e.tag === 'infeasible') return new InfeasibleError(`infeasible: ${camelCased(e.val, names)}`);
  return new KernelRuntimeError(`kernel runtime failure: unknown error ${JSON.stringify(e)}`);
}

/**
 * Runs `f`, turning the kernel's result errors and traps into stowplan errors (`names`: the
 * resource names the call was given, which its messages keep as spelt).
 * @template T @param {() => T} f @param {readonly string[]} [names] @returns {T}
 */
export function call(f, names) {
  try {
    return f();
  } catch (e) {
    if (e && typeof e === 'object' && 'payload' in e) {
      const p = /** @type {any} */ (e).payload;
      if (p && typeof p.tag === 'string' && typeof p.val === 'string') throw fromKernel(p, names);
      if (p && typeof p.exception === 'string') throw new PeerError(p.exception, p.message);
    }
    if (e instanceof StowplanError) throw e;
    throw new KernelRuntimeError(`kernel runtime failure: ${e instanceof Error ? e.message : String(e)}`);
  }
}

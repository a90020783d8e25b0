// A test fixture in JavaScript that misbehaves on purpose, to show the sandbox holds for
// componentize-js plugins as for the Rust ones (plugins/hostile). The config's `mode`:
//
// - `loop`: spins forever (the host's deadline or fuel must stop it);
// - `memory`: allocates without end (the host's memory limit must stop it);
// - `throw`: throws an Error (the host reports the plugin's failure; the buffer is untouched);
// - `out-of-range`: returns a position past the buffer (the host refuses the selection);
// - `return`: returns the config's `value` as is (a string such as "0", a number, an object,
//   an array holding a non-integer …): not a list of u32 positions, which the checking shim
//   the build wraps `select` in refuses as the plugin's error (`err(text)`) on every call;
// - `probe`: reports, as its error text, what the WASI the host gives let it see: the wall
//   clock, the monotonic clock, the randomness;
// - anything else: FIFO.

/** The exported interface `stowplan:filter/filter`. */
export const filter = {
  /**
   * @param {{wanted: number, config: string}} ctx
   * @param {{groupStart: Uint32Array}} buffer
   */
  select(ctx, buffer) {
    const config = JSON.parse(ctx.config);
    const mode = config.mode ?? '';
    const groups = buffer.groupStart.length - 1;
    if (mode === 'loop') {
      let x = 0;
      for (;;) x = (x * 31 + 7) | 0;
    }
    if (mode === 'memory') {
      const hoard = [];
      for (;;) hoard.push(new Float64Array(1 << 20).fill(hoard.length));
    }
    if (mode === 'throw') throw new Error('hostile: thrown on purpose');
    if (mode === 'out-of-range') return [groups];
    if (mode === 'return') return config.value;
    if (mode === 'probe') {
      throw `probe: wall_ms=${Date.now()}; monotonic_ms=${performance.now()}; random=${Math.random()}`;
    }
    return Array.from({ length: Math.min(groups, ctx.wanted) }, (_, g) => g);
  },
};

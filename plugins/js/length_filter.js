// A stowplan buffer filter written in JavaScript (built into a component with
// componentize-js; see README.md beside this file).
//
// Serves groups by the mean response length of their samples: shortest first by default (a
// curriculum from short answers to long ones), or longest first; ties go to the older group.
// Groups holding a sample that is still pending (status 0) or was aborted (status 3) are
// left in the buffer unless `include_unfinished` is true.
//
// Config (JSON object, every key optional): `order` ("shortest" or "longest", default
// "shortest"), `include_unfinished` (bool, default false), `max_mean_length` (number ≥ 0:
// groups whose mean response length is above it are left in the buffer; default none).

const KEYS = ['order', 'include_unfinished', 'max_mean_length'];

/** The checked config, or a thrown error text. */
function readConfig(text) {
  let config;
  try {
    config = JSON.parse(text);
  } catch (e) {
    throw `config is not JSON: ${e.message}`;
  }
  if (config === null || typeof config !== 'object' || Array.isArray(config)) throw 'config must be a JSON object';
  const unknown = Object.keys(config).filter((k) => !KEYS.includes(k)).sort();
  if (unknown.length) throw `unknown config keys ${JSON.stringify(unknown)}; known: ${KEYS.join(', ')}`;
  const order = config.order ?? 'shortest';
  if (order !== 'shortest' && order !== 'longest') throw `order must be "shortest" or "longest" (got ${JSON.stringify(order)})`;
  const includeUnfinished = config.include_unfinished ?? false;
  if (typeof includeUnfinished !== 'boolean') throw `include_unfinished must be true or false (got ${JSON.stringify(includeUnfinished)})`;
  const max = config.max_mean_length ?? Infinity;
  if (typeof max !== 'number' || !(max >= 0)) throw `max_mean_length must be a number >= 0 (got ${JSON.stringify(config.max_mean_length)})`;
  return { order, includeUnfinished, max };
}

/** The exported interface `stowplan:filter/filter`. */
export const filter = {
  /**
   * Buffer positions of the groups to serve, in order: at most `ctx.wanted`.
   * @param {{wanted: number, config: string}} ctx
   * @param {{groupStart: Uint32Array, responseLength: Uint32Array, status: Uint8Array}} buffer
   */
  select(ctx, buffer) {
    const { order, includeUnfinished, max } = readConfig(ctx.config);
    const starts = buffer.groupStart;
    const candidates = [];
    for (let g = 0; g + 1 < starts.length; g++) {
      let total = 0;
      let unfinished = false;
      for (let i = starts[g]; i < starts[g + 1]; i++) {
        total += buffer.responseLength[i];
        unfinished ||= buffer.status[i] === 0 || buffer.status[i] === 3;
      }
      const size = starts[g + 1] - starts[g];
      const mean = size ? total / size : 0;
      if ((unfinished && !includeUnfinished) || mean > max) continue;
      candidates.push([mean, g]);
    }
    const sign = order === 'shortest' ? 1 : -1;
    candidates.sort((a, b) => sign * (a[0] - b[0]) || a[1] - b[1]);
    return candidates.slice(0, ctx.wanted).map((c) => c[1]);
  },
};

// JSON text in the Rust host's style (serde_json, compact) for values of the SDK's own
// (`toJSONText(value)`, the explorer's export): exact integers (bigints and integer typed
// arrays written digit for digit) and other floats in Rust's shortest round-trip form
// (`1.0333333333333334`, `1e16`). The plans' JSON texts come from the kernel itself
// (`MicroBatches.toJSONText`, `Balance.toJSONText`).

/**
 * `x` as serde_json (ryu) writes an f64.
 * @param {number} x
 * @returns {string}
 */
export function formatF64(x) {
  if (!Number.isFinite(x)) return 'null';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const sign = x < 0 ? '-' : '';
  // Shortest round-trip digits and the exponent of the first digit.
  const [mantissa, exp] = Math.abs(x).toExponential().split('e');
  const digits = mantissa.replace('.', '');
  const e = Number(exp);
  const length = digits.length;
  const point = e + 1; // digits before the decimal point (ryu's `kk`)
  let body;
  if (point >= length && point <= 16) {
    body = `${digits}${'0'.repeat(point - length)}.0`;
  } else if (point > 0 && point <= 16) {
    body = `${digits.slice(0, point)}.${digits.slice(point)}`;
  } else if (point > -5 && point <= 0) {
    body = `0.${'0'.repeat(-point)}${digits}`;
  } else if (length === 1) {
    body = `${digits}e${e}`;
  } else {
    body = `${digits[0]}.${digits.slice(1)}e${e}`;
  }
  return sign + body;
}

/**
 * The compact JSON text of `value`: objects keep their key order; bigints, integer numbers
 * and typed arrays print exactly, other numbers as Rust prints an f64; `undefined` members
 * are left out and `null` stays `null`.
 * @param {unknown} value
 * @returns {string}
 */
export function stringify(value) {
  if (value === null || value === undefined) return 'null';
  switch (typeof value) {
    case 'bigint':
      return value.toString();
    case 'number':
      return Number.isInteger(value) ? value.toString() : formatF64(value);
    case 'boolean':
      return value ? 'true' : 'false';
    case 'string':
      return JSON.stringify(value);
    default:
      break;
  }
  if (ArrayBuffer.isView(value)) return `[${Array.prototype.join.call(value, ',')}]`;
  if (Array.isArray(value)) return `[${value.map(stringify).join(',')}]`;
  const parts = [];
  for (const [k, v] of Object.entries(/** @type {object} */ (value))) {
    if (v !== undefined) parts.push(`${JSON.stringify(k)}:${stringify(v)}`);
  }
  return `{${parts.join(',')}}`;
}

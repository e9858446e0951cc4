"""`np.unique` for integer arrays, by sorting: the same outputs, without numpy 2.4's costs.

numpy 2.4's `np.unique` hashes when asked for the values alone (slow once the values are
many and distinct: 300k distinct int64 take ~60 ms against ~2 ms for a sort), argsorts
with a stable merge sort for `return_index`, and sorts rows as structured scalars for
`axis=0` (~170 ms for 300k two-column rows). Here every case is one `np.sort` of an int64
key: the value, with the element's index packed in its low bits when the positions are
asked for (a stable order at the price of a plain sort), and a row's columns packed into
one key when their ranges fit in 63 bits. Anything else falls back to a stable argsort
or `np.lexsort`, never to a different answer.
"""

import numpy as np

_KEY_BITS = 63  # Packed keys stay non-negative int64.
# Sizes below which np.unique itself is faster (its fixed cost is smaller): measured with
# numpy 2.4.6, ~2-5 us a call either way there.
SMALL_VALUES = 64  # Values (or rows) alone.
SMALL_POSITIONS = 1500  # With return_index or return_inverse.


def sorted_unique(values: np.ndarray, *, return_index: bool = False,
                  return_inverse: bool = False, return_counts: bool = False):
  """`np.unique(values, return_index=..., return_inverse=..., return_counts=...)` for an
  integer or bool array: the same arrays, dtypes and shapes (the inverse has `values`'
  shape), by sorting instead of hashing. Other dtypes, and inputs small enough for
  `np.unique` to be faster, go to `np.unique` itself."""
  values = np.asarray(values)
  small = SMALL_POSITIONS if return_index or return_inverse else SMALL_VALUES
  if values.size < max(small, 1) or values.dtype.kind not in "biu":
    return np.unique(values, return_index=return_index, return_inverse=return_inverse,
                     return_counts=return_counts)
  flat = values.reshape(-1)
  if (flat[1:] >= flat[:-1]).all():  # Already sorted (often: keys built in order).
    order, ordered = np.arange(len(flat)), flat
  elif return_index or return_inverse:
    order, ordered = _stable_order(flat)
  else:
    order, ordered = None, np.sort(flat)
  first = np.empty(len(flat), bool)  # Where each run of equal values starts.
  first[0] = True
  np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
  return _from_runs(ordered, order, first, values.shape, return_index, return_inverse,
                    return_counts)


def unique_rows(rows: np.ndarray, *, return_index: bool = False,
                return_inverse: bool = False, return_counts: bool = False):
  """`np.unique(rows, axis=0, return_index=..., return_inverse=..., return_counts=...)`
  for a 2-D integer or bool array: distinct rows in lexicographic order, with the same
  arrays and dtypes. Rows whose columns' ranges fit in one int64 become one key each
  (`sorted_unique`); wider rows are ordered by `np.lexsort`."""
  rows = np.asarray(rows)
  if (rows.ndim != 2 or rows.size == 0 or len(rows) < SMALL_VALUES
      or rows.dtype.kind not in "biu"):
    return np.unique(rows, axis=0, return_index=return_index,
                     return_inverse=return_inverse, return_counts=return_counts)
  packed = _packed_rows(rows)
  if packed is not None:
    key, lows, spans = packed
    out = sorted_unique(key, return_index=return_index, return_inverse=return_inverse,
                        return_counts=return_counts)
    out = out if isinstance(out, tuple) else (out,)
    distinct = _unpacked_rows(out[0], lows, spans).astype(rows.dtype)
    return distinct if len(out) == 1 else (distinct, *out[1:])
  order = np.lexsort(rows.T[::-1])  # Stable, first column most significant.
  ordered = rows[order]
  first = np.empty(len(rows), bool)
  first[0] = True
  np.any(ordered[1:] != ordered[:-1], axis=1, out=first[1:])
  return _from_runs(ordered, order, first, (len(rows),), return_index, return_inverse,
                    return_counts)


def _from_runs(ordered, order, first, shape, return_index, return_inverse, return_counts):
  """np.unique's outputs from the sorted items `ordered` (`order`: their positions), where
  `first` marks each run of equal items' start; the inverse takes `shape`."""
  out = [ordered[first]]
  if return_index:
    out.append(order[first])
  if return_inverse:
    inverse = np.empty(len(first), np.intp)
    inverse[order] = np.cumsum(first) - 1
    out.append(inverse.reshape(shape))
  if return_counts:
    out.append(np.diff(np.append(np.flatnonzero(first), len(first))))
  return out[0] if len(out) == 1 else tuple(out)


def _stable_order(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(`np.argsort(flat, kind="stable")`, `flat` in that order) for integers: one sort of
  (value - min, index) packed in an int64 when they fit, several times faster than
  numpy's stable argsort, and the values read back from the key rather than gathered;
  else that argsort."""
  low, high = int(flat.min()), int(flat.max())
  index_bits = max(len(flat) - 1, 1).bit_length()
  if (high - low).bit_length() + index_bits > _KEY_BITS or flat.dtype == np.uint64:
    order = np.argsort(flat, kind="stable")
    return order, flat[order]
  key = (flat.astype(np.int64) - low) << index_bits
  key |= np.arange(len(flat), dtype=np.int64)
  key.sort()
  ordered = (key >> index_bits) + low
  return key & ((1 << index_bits) - 1), ordered.astype(flat.dtype, copy=False)


def _packed_rows(rows: np.ndarray):
  """(int64 key per row, column minima, column spans) with the first column most
  significant, so keys order as the rows do; None when the spans' product passes 2**63
  (or a column is uint64, whose values int64 may not hold)."""
  if rows.dtype == np.uint64:
    return None
  lows = [int(v) for v in rows.min(axis=0)]
  spans = [int(v) - low + 1 for v, low in zip(rows.max(axis=0), lows)]
  if np.prod(spans, dtype=object) >= 1 << _KEY_BITS:
    return None
  key = np.zeros(len(rows), np.int64)
  for column, low, span in zip(rows.T, lows, spans):
    key *= span
    key += column.astype(np.int64) - low
  return key, lows, spans


def _unpacked_rows(keys: np.ndarray, lows: list[int], spans: list[int]) -> np.ndarray:
  """The rows (int64) that `_packed_rows` packed into `keys`."""
  columns = []
  for low, span in zip(lows[::-1], spans[::-1]):
    keys, digit = np.divmod(keys, span)
    columns.append(digit + low)
  return np.stack(columns[::-1], axis=1)

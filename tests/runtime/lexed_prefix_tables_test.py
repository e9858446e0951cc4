"""`lexed_tables.lane_prefix_tables` against a plain per-state set of prefixes.

The runtime runs each distinct lane prefix of a row's lexer state once and starts the
state's lanes after it (`runtime/_lexed_lanes._after_prefix`), so the derived tables
must list exactly the distinct prefixes (ascending, -1 past a shorter sequence) and
point every lane at its own. Random tables, including lanes without lexemes, padding,
prefix lengths 1-3, and lexeme ids large enough that the sort keys need int64.
"""

import numpy as np
import pytest

from constrained_decoding import lexed_tables


def _reference(lanes, seq_items, length):
  """(prefixes [S, F, length], lane index [S, Ks]) by sets, F >= 1."""
  items = np.pad(seq_items, [(0, 0), (0, max(0, length - seq_items.shape[1]))],
                 constant_values=-1)[:, :length]
  per_state = []
  for row in lanes:
    prefixes = {tuple(items[q]) for q in row if q >= 0 and items[q, 0] >= 0}
    per_state.append(sorted(prefixes))
  width = max([1] + [len(p) for p in per_state])
  out = np.full((len(lanes), width, length), -1)
  index = np.full(lanes.shape, -1)
  for s, (row, prefixes) in enumerate(zip(lanes, per_state)):
    for f, prefix in enumerate(prefixes):
      out[s, f] = prefix
    for x, q in enumerate(row):
      if q >= 0 and items[q, 0] >= 0:
        index[s, x] = prefixes.index(tuple(items[q]))
  return out, index


@pytest.mark.parametrize("seed", range(12))
def test_lane_prefix_tables_equal_a_set_per_state(seed):
  rng = np.random.default_rng(seed)
  classes = [4, 40, 3000, 2**17][seed % 4]  # the last needs int64 keys past length 1
  length = 1 + seed % 3
  n_seq, width = int(rng.integers(1, 40)), int(rng.integers(1, 6))
  seq_len = rng.integers(0, width + 1, n_seq)
  seq_items = np.where(np.arange(width)[None, :] < seq_len[:, None],
                       rng.integers(0, min(classes, 6) if seed % 2 else classes,
                                    (n_seq, width)), -1)
  if classes > 2**16:  # large ids appear
    seq_items[0, 0] = classes - 1
  lanes = rng.integers(-1, n_seq, (int(rng.integers(1, 9)), int(rng.integers(0, 30))))
  got, got_index = lexed_tables.lane_prefix_tables(lanes, seq_items, length)
  want, want_index = _reference(lanes, seq_items, length)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got_index, want_index)
  assert got.dtype == np.int32 and got_index.dtype == np.int16

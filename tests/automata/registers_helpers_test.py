"""The array helpers of `automata/_registers.py` against plain-Python oracles.

`_distinct_pairs` (the state graph of `live_sets`) against a set of pairs, sorted;
`_tokens_with` (which tokens may cross a register operation) against a per-token scan
of its bytes; `_untagged_arcs` (per byte class) against a scan of 256 columns;
`_crossed_hits` against walking each token byte by byte; `_tagged_extent` against a scan.
"""

import random

import numpy as np
import pytest

from constrained_decoding.automata import _registers
from constrained_decoding.automata._byte_dfa import ByteDfa


@pytest.mark.parametrize("seed", range(5))
def test_distinct_pairs_equal_sorted_set(seed):
  rng = np.random.default_rng(seed)
  q = int(rng.integers(1, 50))
  n = int(rng.integers(0, 400))
  src, dst = rng.integers(0, q, n), rng.integers(0, q, n)
  got_src, got_dst = _registers._distinct_pairs(src, dst, q)  # pylint: disable=protected-access
  assert list(zip(got_src.tolist(), got_dst.tolist())) == sorted(set(zip(src.tolist(),
                                                                         dst.tolist())))


def _random_tokens_and_byte_set(rng, max_length: int):
  """300 random tokens of 1..max_length bytes after a None and an empty one, and a
  random set of 0, 1, 3 or 40 bytes (bool [256])."""
  token_bytes = [None, b""] + [bytes(rng.randrange(256) for _ in range(rng.randrange(
      1, max_length + 1))) for _ in range(300)]
  wanted = np.zeros(256, bool)
  wanted[rng.sample(range(256), rng.choice([0, 1, 3, 40]))] = True
  return token_bytes, wanted


@pytest.mark.parametrize("seed", range(5))
def test_tokens_with_equals_byte_scan(seed):
  token_bytes, wanted = _random_tokens_and_byte_set(random.Random(seed), max_length=5)
  got = _registers._tokens_with(token_bytes, wanted)  # pylint: disable=protected-access
  expected = [any(wanted[b] for b in (t or b"")) for t in token_bytes]
  assert got.tolist() == expected


def _random_class_dfa(rng, q: int) -> ByteDfa:
  """A ByteDfa of q states whose bytes fall in random ranges (`class_edges`) that every
  state treats alike, with random missing arcs."""
  cuts = np.sort(rng.choice(np.arange(1, 256), int(rng.integers(0, 12)), replace=False))
  edges = np.concatenate([[0], cuts, [256]])
  table = rng.integers(-1, q, (q, len(edges) - 1)).astype(np.int32)
  transitions = np.repeat(table, np.diff(edges), axis=1)
  return ByteDfa(transitions, np.zeros(q, bool), 0, class_edges=edges)


@pytest.mark.parametrize("seed", range(8))
def test_untagged_arcs_equal_byte_scan(seed):
  """`_untagged_arcs` (counted per byte class) gives the (source, target) pairs of the
  arcs whose byte carries no operation, as a scan of all 256 columns does; tagged bytes
  sometimes cover a whole class."""
  rng = np.random.default_rng(seed)
  dfa = _random_class_dfa(rng, int(rng.integers(1, 30)))
  arcs = np.argwhere(dfa.transitions >= 0)
  picked = arcs[rng.random(len(arcs)) < [0.0, 0.01, 0.2, 0.9][seed % 4]]
  arc_ops = {(int(s), int(b)): ((_registers.SET, 0, 1),) for s, b in picked}
  src, dst = _registers._untagged_arcs(dfa, arc_ops)  # pylint: disable=protected-access
  got = set(zip(src.tolist(), dst.tolist()))
  expected = {(s, int(dfa.transitions[s, b])) for s, b in arcs.tolist() if (s, b) not in arc_ops}
  assert got == expected


@pytest.mark.parametrize("seed", range(6))
def test_crossed_hits_equal_byte_walk(seed):
  """`_crossed_hits` (a lockstep walk, longest tokens first) against walking each edge's
  token byte by byte from its source: (edge, position, op list index) per tagged arc
  read, by edge then position."""
  rng = np.random.default_rng(seed)
  q = int(rng.integers(2, 20))
  dfa = ByteDfa(rng.integers(0, q, (q, 256)).astype(np.int32), np.zeros(q, bool), 0)
  pairs = {(int(rng.integers(q)), int(rng.integers(256)))
           for _ in range(int(rng.integers(1, 300)))}
  arc_ops = {p: ((_registers.SET, int(rng.integers(3)), 1 << int(rng.integers(8))),)
             for p in pairs}
  contracted = _registers.Contracted(dfa, arc_ops, 3)
  token_bytes = [None, b""] + [bytes(rng.integers(0, 256, int(rng.integers(1, 9))).tolist())
                               for _ in range(60)]
  n = 200
  sources = rng.integers(0, q, n).astype(np.int32)
  tokens = rng.integers(0, len(token_bytes), n).astype(np.int32)
  edges = np.flatnonzero(rng.random(n) < 0.7)
  got_edge, got_pos, got_ops, ops_of = _registers._crossed_hits(  # pylint: disable=protected-access
      contracted, sources, tokens, edges, token_bytes)
  keys = sorted(arc_ops)
  assert ops_of == [arc_ops[k] for k in keys]
  expected = []
  for e in edges.tolist():
    state = int(sources[e])
    for position, byte in enumerate(token_bytes[tokens[e]] or b""):
      if (state, byte) in arc_ops:
        expected.append((e, position, keys.index((state, byte))))
      state = int(dfa.transitions[state, byte])
  assert list(zip(got_edge.tolist(), got_pos.tolist(), got_ops.tolist())) == expected


@pytest.mark.parametrize("seed", range(5))
def test_tagged_extent_equals_byte_scan(seed):
  """`_tagged_extent`: one past the last position of a wanted byte in each token, 0
  for none (empty and None tokens included)."""
  token_bytes, wanted = _random_tokens_and_byte_set(random.Random(seed), max_length=6)
  got = _registers._tagged_extent(token_bytes, wanted)  # pylint: disable=protected-access
  expected = [max((i + 1 for i, b in enumerate(t or b"") if wanted[b]), default=0)
              for t in token_bytes]
  assert got.tolist() == expected


@pytest.mark.parametrize("seed", range(6))
def test_unique_rows_equal_numpy_unique_over_rows(seed):
  """`_unique_rows` (rows packed into int64 codes when they fit, else `np.unique` over
  rows) gives `np.unique(axis=0)`'s distinct rows and inverse, -1 entries included."""
  rng = np.random.default_rng(seed)
  for _ in range(200):
    n, columns = int(rng.integers(1, 60)), int(rng.integers(1, 8))
    bound = int(rng.choice([1, 4, 3000, 1 << 20]))  # 1 << 20 with > 3 columns: no packing.
    rows = rng.integers(-1, bound, (n, columns))[rng.integers(0, n, n)]  # with repeats
    keys, inverse = np.unique(rows, axis=0, return_inverse=True)
    got_keys, got_inverse = _registers._unique_rows(rows, bound)  # pylint: disable=protected-access
    assert np.array_equal(got_keys, keys) and np.array_equal(got_inverse, inverse.reshape(-1))

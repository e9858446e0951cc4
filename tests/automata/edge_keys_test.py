"""Packed-key edge sorting and the walks' first level, against plain oracles.

`_compose._sorted_edges` writes its sort keys through int32 half views and
`_trie_walk._root_frontier` gathers the DFA table's rows and columns in either order;
both must give exactly what a lexicographic sort and a loop over (origin, root byte) give.
"""

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _byte_dfa
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _trie_walk


@pytest.mark.parametrize("num_states, token_span, count", [
    (3, 2, 5), (2, 262_145, 0), (300, 1 << 18, 4095), (300, 1 << 18, 5000),
    (4096, 262_145, 20_000),  # 12 + 19 bits: the low half's 31 exactly
    (8192, 262_145, 20_000),  # 13 + 19 bits: too wide, the argsort
    (1 << 20, 262_145, 20_000), (1 << 12, 3, 4096)])
def test_sorted_edges_equal_lexsort(num_states, token_span, count):
  """Random unique (source, token) edges, below and above the argsort cut-off, with
  fields that fit the key's low half exactly (31 bits), or not (the argsort fallback);
  the largest states and tokens included."""
  rng = np.random.default_rng(count + num_states)
  src = rng.integers(0, num_states, count)
  tok = rng.integers(0, token_span, count)
  src[:count // 4] = num_states - 1
  tok[:count // 4] = np.maximum(token_span - 1 - np.arange(count // 4), 0)
  first = np.unique(src * token_span + tok, return_index=True)[1]  # (source, token) unique
  src, tok = src[first], tok[first]
  order = rng.permutation(len(src))
  src, tok = src[order], tok[order]
  dst = rng.integers(0, num_states, len(src))
  for dtype in (np.int32, np.int64):
    got = _compose._sorted_edges(src.astype(dtype), tok.astype(dtype), dst.astype(dtype),  # pylint: disable=protected-access
                                 num_states, token_span)
    want = np.lexsort((tok, src))
    for array, expected in zip(got, (src[want], tok[want], dst[want])):
      assert array.dtype == np.int32 or dtype == np.int64
      np.testing.assert_array_equal(array, expected)


def _frontier_oracle(transitions, trie, origins, first_bytes):
  """(node, state, origin) per origin in order, then per root child by ascending byte."""
  children = range(trie.child_start[0], trie.child_start[1])
  out = []
  for i, q in enumerate(origins.tolist()):
    for slot in children:
      b = int(trie.child_byte[slot])
      r = int(transitions[q, b])
      if r >= 0 and (first_bytes is None or first_bytes[i, b]):
        out.append((int(trie.child_node[slot]), r, q))
  return out


@pytest.mark.parametrize("seed", range(16))
def test_root_frontier_equals_a_loop(seed):
  """Tries whose root has all 256 bytes in order, or a few; few origins (rows gathered
  first) or most states (columns first); with and without first-byte limits."""
  rng = np.random.default_rng(seed)
  firsts = np.arange(256) if seed % 2 else rng.choice(256, int(rng.integers(1, 12)), False)
  tokens = sorted({bytes([int(b)]) for b in firsts}
                  | {bytes([int(rng.choice(firsts))]) + bytes(rng.integers(0, 256, 2).tolist())
                     for _ in range(50)})
  trie = _detokenizer.build_trie(cd.Vocabulary.from_token_bytes(tokens + [None],
                                                                eos_ids=[len(tokens)]))
  num_states = int(rng.integers(1, 400))
  transitions = np.where(rng.random((num_states, 256)) < 0.3,
                         rng.integers(0, num_states, (num_states, 256)), -1).astype(np.int32)
  dfa = _byte_dfa.ByteDfa(transitions, np.ones(num_states, bool), 0)
  many = seed % 4 >= 2
  origins = np.sort(rng.choice(num_states, num_states if many else min(num_states, 3), False))
  first_bytes = rng.random((len(origins), 256)) < 0.5 if seed % 3 else None
  node, state, origin = _trie_walk._root_frontier(  # pylint: disable=protected-access
      dfa, trie, origins, first_bytes)
  assert node.dtype == state.dtype == origin.dtype == np.int32
  assert list(zip(node.tolist(), state.tolist(), origin.tolist())) == _frontier_oracle(
      transitions, trie, origins, first_bytes)

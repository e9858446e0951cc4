"""Helpers that make the lexer-state x token table fast (issue 18), each against a plain
reference on random inputs."""

import random
import types

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _lexer


@pytest.mark.parametrize("seed", range(6))
def test_stable_order_is_a_stable_argsort(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(0, 3000))
  top = [3, 1000, 2**40, 2**62][seed % 4]  # few keys (many ties) .. too wide to pack
  key = rng.integers(0, top, n).astype(np.int64)
  np.testing.assert_array_equal(_lexer._stable_order(key), np.argsort(key, kind="stable"))


@pytest.mark.parametrize("seed", range(6))
def test_unique_pairs_matches_numpy_unique_rows(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 2000))
  a = rng.integers(0, 50, n).astype(np.uint64) * np.uint64(2**58)  # (uint64 range)
  b = a // np.uint64(3) + np.uint64(7)
  if seed % 2:  # collisions: equal a, different b
    b[rng.integers(0, n, n // 3)] += np.uint64(1)
  _, rep, inv = np.unique(np.stack([a, b], 1), axis=0, return_index=True,
                          return_inverse=True)
  got_rep, got_inv = _lexer._unique_pairs(a, b)
  np.testing.assert_array_equal(got_rep, rep)
  np.testing.assert_array_equal(got_inv, inv.reshape(-1))


def test_ranges_concatenates_ranges():
  lo = np.array([5, 0, 9, 3], np.int64)
  hi = np.array([8, 0, 11, 4], np.int64)
  np.testing.assert_array_equal(_lexer.ranges(lo, hi), [5, 6, 7, 9, 10, 3])


def test_subtrees_match_the_token_strings():
  rng = random.Random(0)
  alphabet = b"ab\n\xff\x00a"
  tokens = sorted({bytes(rng.choices(alphabet, k=rng.randrange(1, 7))) for _ in range(300)})
  vocab = cd.Vocabulary.from_token_bytes(tokens + [None], eos_ids=[len(tokens)])
  trie = _detokenizer.build_trie(vocab)
  end, below = _lexer._subtrees(trie, np.arange(256), 4)
  # Each node's prefix: the bytes of any token spelled at or below it, cut to its depth.
  prefix = {}
  for n in range(trie.num_nodes):
    lo, hi = trie.token_start[n], trie.token_start[end[n]]
    spelled = [vocab.token_bytes[t] for t in trie.token_ids[lo:hi]]
    assert spelled, n  # every subtree holds a token
    prefix[n] = spelled[0][:trie.node_depth[n]]
    expected_tokens = [t for t in tokens if t.startswith(prefix[n])]
    assert sorted(spelled) == expected_tokens
    expected_bytes = {b for t in expected_tokens for b in t[len(prefix[n]):]}
    bits = np.unpackbits(below[n].view(np.uint8), bitorder="little")
    assert set(np.nonzero(bits)[0].tolist()) == expected_bytes


def _plain_product(dfas):
  """The specification of `_lexer._product`: breadth first, each level's new tuples
  numbered in ascending order."""
  start = tuple(d.start for d in dfas)
  index, tuples, rows, frontier = {start: 0}, [start], [], [start]
  while frontier:
    level = []
    for tup in frontier:
      row = []
      for b in range(256):
        nxt = tuple(int(d.transitions[q, b]) if q >= 0 else -1 for d, q in zip(dfas, tup))
        row.append(nxt)
        if any(q >= 0 for q in nxt) and nxt not in index:
          index[nxt] = None
          level.append(nxt)
      rows.append(row)
    frontier = sorted(level)
    for t in frontier:
      index[t] = len(tuples)
      tuples.append(t)
  table = np.array([[index[t] if any(q >= 0 for q in t) else -1 for t in row]
                    for row in rows])
  return table, tuples


def _random_dfas(seed):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(int(rng.integers(1, 6))):
    q = int(rng.integers(1, 6))
    bytes_used = rng.integers(0, 256, 4)  # few bytes, so that products stay small
    trans = np.full((q, 256), -1, np.int32)
    trans[:, bytes_used] = np.where(rng.random((q, 4)) < 0.7, rng.integers(0, q, (q, 4)), -1)
    out.append(types.SimpleNamespace(transitions=trans, start=0))
  return out


@pytest.mark.parametrize("seed", range(10))
def test_product_matches_plain_bfs(seed):
  dfas = _random_dfas(seed)
  table, tuples = _lexer._product(dfas)
  want_table, want_tuples = _plain_product(dfas)
  assert tuples == want_tuples
  np.testing.assert_array_equal(table, want_table)


def test_product_without_hashes_is_exact(monkeypatch):
  # Every successor of a level hashed alike: the entry check sees it and falls back.
  monkeypatch.setattr(_lexer, "_unique_pairs",
                      lambda a, b: (np.zeros(1, np.int64), np.zeros(len(a), np.int64)))
  dfas = _random_dfas(3)
  table, tuples = _lexer._product(dfas)
  want_table, want_tuples = _plain_product(dfas)
  assert tuples == want_tuples
  np.testing.assert_array_equal(table, want_table)


@pytest.mark.parametrize("tokens, dense", [
    # b"ac" dies after its first byte (a level of the walk with no live node).
    ([b"ac", b"a", b"abab", None], [[-1, 0, 1, -1], [-1, -1, -1, -1], [-1, 2, 3, -1]]),
    ([None, None], [[-1, -1]] * 3),  # no token has bytes: nothing to walk
])
def test_token_table_when_the_walk_dies(tokens, dense):
  lexer = _lexer.build_lexer_dfa([_lexer.Terminal("AB", "ab")])
  vocab = cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])
  table = _lexer.build_token_table(lexer, _detokenizer.build_trie(vocab), vocab.vocab_size)
  np.testing.assert_array_equal(table.dense(), dense)

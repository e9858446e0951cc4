"""`_detokenizer.build_trie` (vectorized) against a plain construction, token by token."""

import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _detokenizer

_FIELDS = ("child_start", "child_byte", "child_node", "node_depth", "token_start",
           "token_ids")


def _plain_trie(vocab):
  """The specification: prefixes numbered in ascending order, children sorted by byte,
  each node's tokens by id."""
  prefixes = sorted({b""} | {b[:d] for b in vocab.token_bytes if b is not None
                             for d in range(len(b) + 1)})
  node = {p: n for n, p in enumerate(prefixes)}
  children = [[] for _ in prefixes]
  for p in prefixes[1:]:
    children[node[p[:-1]]].append(node[p])
  tokens = [[] for _ in prefixes]
  for t, b in enumerate(vocab.token_bytes):
    if b is not None:
      tokens[node[b]].append(t)
  flat = [c for cs in children for c in cs]
  return dict(
      child_start=np.cumsum([0] + [len(c) for c in children]),
      child_byte=np.array([prefixes[c][-1] for c in flat], np.uint8),
      child_node=np.array(flat, np.int32),
      node_depth=np.array([len(p) for p in prefixes]),
      token_start=np.cumsum([0] + [len(t) for t in tokens]),
      token_ids=np.array([t for ts in tokens for t in ts], np.int32))


@pytest.mark.parametrize("seed", range(40))
def test_build_trie_matches_plain_construction(seed):
  rng = random.Random(seed)
  # Few letters (long shared prefixes), NUL bytes, repeats, empty and missing tokens.
  token_bytes = [bytes(rng.choices(b"ab\x00", k=rng.randrange(0, 6)))
                 if rng.random() < 0.9 else None for _ in range(rng.randrange(1, 60))]
  vocab = cd.Vocabulary.from_token_bytes(token_bytes + [None], eos_ids=[len(token_bytes)])
  trie = _detokenizer.build_trie(vocab)
  want = _plain_trie(vocab)
  for f in _FIELDS:
    np.testing.assert_array_equal(getattr(trie, f), want[f], err_msg=f)


def test_build_trie_without_tokens():
  vocab = cd.Vocabulary.from_token_bytes([None, None], eos_ids=[1])
  trie = _detokenizer.build_trie(vocab)
  want = _plain_trie(vocab)
  for f in _FIELDS:
    np.testing.assert_array_equal(getattr(trie, f), want[f], err_msg=f)


def test_previous_smaller_matches_a_scan():
  rng = np.random.default_rng(0)
  a = rng.integers(0, 6, 500)
  want = [max([j for j in range(k) if a[j] < a[k]], default=-1) for k in range(len(a))]
  np.testing.assert_array_equal(_detokenizer._previous_smaller(a), want)

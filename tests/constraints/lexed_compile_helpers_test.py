"""Helpers of the lexed-grammar compiler that make it fast (issue 18): each against a
plain reference on random inputs."""

import collections

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _lexed_grammar


def _bfs_reachable(trans: np.ndarray) -> np.ndarray:
  n = trans.shape[0]
  out = np.zeros((n, n), bool)
  for s in range(n):
    out[s, s] = True
    queue = collections.deque([s])
    while queue:
      for t in trans[queue.popleft()]:
        if t >= 0 and not out[s, t]:
          out[s, t] = True
          queue.append(t)
  return out


@pytest.mark.parametrize("seed", range(12))
def test_reachable_matches_bfs_on_random_dfas(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 60))
  width = int(rng.integers(1, 8))
  # Sparse random transitions (-1 = none): chains, cycles, dead ends and self-loops.
  trans = np.where(rng.random((n, width)) < rng.random(),
                   rng.integers(0, n, (n, width)), -1).astype(np.int32)
  np.testing.assert_array_equal(_lexed_grammar._reachable(trans), _bfs_reachable(trans))


def test_reachable_of_a_long_cycle_and_a_chain():
  n = 50
  trans = np.full((2 * n, 1), -1, np.int32)
  trans[:n, 0] = (np.arange(n) + 1) % n  # one cycle through states 0..n-1
  trans[n:2 * n - 1, 0] = np.arange(n + 1, 2 * n)  # a chain n -> ... -> 2n-1
  trans[2 * n - 1, 0] = 0  # that enters the cycle
  np.testing.assert_array_equal(_lexed_grammar._reachable(trans), _bfs_reachable(trans))


def test_cache_dir_keeps_trie_and_token_table(tmp_path):
  grammar = """
      start: NAME ("," NAME)*
      NAME: /[a-z]+/
      %ignore " "
  """
  tokens = [bytes([b]) for b in range(256)] + [b"ab", b", ", b"a,"]
  vocab = cd.Vocabulary.from_token_bytes(tokens + [None], eos_ids=[len(tokens)])
  plain = _lexed_grammar.compile_lexed_grammar(grammar, vocab)
  cold = _lexed_grammar.compile_lexed_grammar(grammar, vocab, cache_dir=str(tmp_path))
  names = sorted(p.name.split("-")[0] for p in tmp_path.iterdir())
  assert names == ["lexer", "trie"]
  warm = _lexed_grammar.compile_lexed_grammar(grammar, vocab, cache_dir=str(tmp_path))
  for f in _lexed_grammar.LexedArrays.ARRAY_FIELDS:
    np.testing.assert_array_equal(getattr(cold, f), getattr(plain, f), err_msg=f)
    np.testing.assert_array_equal(getattr(warm, f), getattr(plain, f), err_msg=f)

"""`_packing.estimate_nbytes`: the budget check answers the same with and without
`within` (the exact row count is skipped only where one row per state already fits)."""

import types

import numpy as np
import pytest

from constrained_decoding import _packing
from constrained_decoding.tables import bucket_size


def _token_dfa(rng, num_states: int, distinct: int, num_terminals: int = 3):
  """A token-DFA-shaped object whose states draw their edges and terminals from
  `distinct` patterns (so their mask rows repeat)."""
  patterns = [np.unique(rng.integers(0, 300, rng.integers(0, 12))) for _ in range(distinct)]
  terminal_of = rng.integers(-1, num_terminals, distinct)
  which = rng.integers(0, distinct, num_states)
  source = np.repeat(np.arange(num_states), [len(patterns[k]) for k in which])
  tokens = np.concatenate([patterns[k] for k in which] + [np.zeros(0, np.int64)])
  terminals = np.full((num_states, 1, 2), -1, np.int32)
  terminals[:, 0, 0] = terminal_of[which]
  terminals[:, 0, 1] = np.where(terminal_of[which] >= 0, 0, -1)
  return types.SimpleNamespace(
      num_states=num_states, edge_source=source.astype(np.int32),
      edge_token=tokens.astype(np.int32), edge_target=np.zeros(len(tokens), np.int32),
      state_terminals=terminals,
      terminal_bits=np.zeros((num_terminals, 10), np.uint32)), which, terminal_of, patterns


def _exact_rows(which, terminal_of, patterns) -> int:
  """Distinct (terminal, tokens) keys of the states: the oracle for the row count."""
  return len({(int(terminal_of[k]), tuple(patterns[k].tolist())) for k in which.tolist()})


@pytest.mark.parametrize("seed", range(6))
def test_within_gives_the_same_verdict_and_the_exact_count_when_over(seed):
  rng = np.random.default_rng(seed)
  vocab = types.SimpleNamespace(vocab_size=300)
  dfa, which, terminal_of, patterns = _token_dfa(rng, int(rng.integers(513, 1500)),
                                                 int(rng.integers(1, 40)))
  exact = _packing.estimate_nbytes(dfa, vocab, min_bucket=1)
  per_row = 10 * 4  # num_words(300) words of 4 bytes.
  rows = _exact_rows(which, terminal_of, patterns)
  rough = exact + (bucket_size(dfa.num_states, 1) - bucket_size(rows, 1)) * per_row
  assert rough > exact  # States repeat rows: the exact count is lower.
  for within in sorted({0, exact - 1, exact, exact + 1, (exact + rough) // 2, rough - 1,
                        rough, rough + 1, 10 * rough}):
    got = _packing.estimate_nbytes(dfa, vocab, min_bucket=1, within=within)
    assert (got > within) == (exact > within)
    assert got == (exact if rough > within else rough)


def test_small_automata_count_one_row_per_state():
  rng = np.random.default_rng(7)
  vocab = types.SimpleNamespace(vocab_size=300)
  dfa, *_ = _token_dfa(rng, 100, 3)
  assert (_packing.estimate_nbytes(dfa, vocab, min_bucket=1)
          == _packing.estimate_nbytes(dfa, vocab, min_bucket=1, within=0))

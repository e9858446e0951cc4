"""`lexed_tables.chain_shift_table` against a per-entry enumeration of the parser's rule.

A lane's micro-step after a reduction on terminal t (entering `goto_chain[e, t]` = q)
takes the shift that follows in the same micro-step when the packed table says so
(`runtime/_lexed_lanes.py`); the next micro-step would take the first member of the
lexeme's class that q has an action for. So the table may offer a shift only where that
first member is t itself for every class holding t, and must carry q unchanged. Random
tables: reductions (< -1), shifts (> 0), no action (0), -1 gotos, classes of one to three
members sharing terminals.
"""

import numpy as np
import pytest

from constrained_decoding import lexed_tables


def _reference(goto_chain, action, class_members):
  """(q [E, T], shift target or -1 [E, T]) entry by entry."""
  e, t = goto_chain.shape
  shift = np.full((e, t), -1)
  for i in range(e):
    for term in range(t):
      q = goto_chain[i, term]
      if q < 0 or action[q, term] <= 0:
        continue
      firsts = []  # for each class holding term: the first member q acts on
      for row in class_members:
        row = [m for m in row if m >= 0]
        if term in row:
          firsts.append(next(m for m in row if action[q, m] != 0))
      if all(m == term for m in firsts):
        shift[i, term] = action[q, term] - 1
  return goto_chain.astype(np.int64), shift


@pytest.mark.parametrize("seed", range(6))
def test_packed_goto_and_shift_equal_the_enumeration(seed):
  rng = np.random.default_rng(seed)
  states, terms, entries = 40, 9, 30
  action = rng.choice([0, 0, -1, -5, 3], size=(states, terms))
  action = np.where(action == 3, rng.integers(1, states + 1, (states, terms)), action)
  goto_chain = rng.integers(-1, states, (entries, terms)).astype(np.int16)
  class_members = np.full((6, 3), -1, np.int32)
  for c in range(6):
    k = rng.integers(1, 4)
    class_members[c, :k] = rng.choice(terms, k, replace=False)
  packed = lexed_tables.chain_shift_table(goto_chain, action, class_members)
  assert packed.dtype == np.int32 and packed.shape == goto_chain.shape
  want_q, want_shift = _reference(goto_chain, action, class_members)
  np.testing.assert_array_equal((packed & 0xFFFF) - 1, want_q)
  np.testing.assert_array_equal((packed >> 16) - 1, want_shift)
  assert (want_shift >= 0).any() and ((want_shift < 0) & (action[np.maximum(want_q, 0),
                                       np.arange(terms)] > 0) & (want_q >= 0)).any()


def test_too_many_parser_states_for_16_bits():
  goto_chain = np.zeros((2, 3), np.int32)
  assert lexed_tables.chain_shift_table(
      goto_chain, np.zeros((2**16, 3), np.int32), np.zeros((1, 1), np.int32)) is None

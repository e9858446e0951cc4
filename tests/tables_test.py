"""Structural invariants of packed tables, stacking and the size report."""

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import _stacking
from constrained_decoding import tables as tables_lib
from constrained_decoding.testing import reference_allowed, reference_walk

_PATTERNS = [r"Red|Orange|Yellow", r"\d{4}-\d\d", r"(ab)*c?", r"[^x]{2}", r"é+"]


def _live_states(t):
  s = _stacking._used_sizes(t)[0]  # pylint: disable=protected-access
  return range(s)


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_invariants(pattern, gemma_compiler, gemma_vocab):
  t = gemma_compiler.compile(cd.Regex(pattern))
  s_pad, e_pad = t.accepting.shape[0], t.edge_tokens.shape[0]
  for n in (s_pad, e_pad, t.mask_bits.shape[0]):
    assert n & (n - 1) == 0 and n >= 8  # power-of-two buckets
  live = list(_live_states(t))
  eos = np.asarray(gemma_vocab.eos_ids)
  # `[^x]{2}` is a counted chain (a wide class: `automata/_counting.py`); the others not.
  counted = bool(t.token_counts.shape[0])
  assert counted == (pattern == r"[^x]{2}")
  for q in live:
    allowed = reference_allowed(t, q)
    assert allowed.any(), f"state {q} allows nothing"
    assert allowed[eos].all() == bool(t.accepting[q])
    assert allowed[eos].any() == bool(t.accepting[q])
    g = int(t.state_groups[q, 0])  # q itself, but for a counted chain's shared groups
    edges = t.edge_tokens[t.edge_start[g]:t.edge_start[g + 1]]
    assert np.all(np.diff(edges) > 0)  # sorted, distinct
    allowed_ids = np.nonzero(allowed & ~np.isin(np.arange(len(allowed)), eos))[0]
    if counted:  # Counting terminals allow tokens beside the explicit edges.
      assert np.isin(edges, allowed_ids).all()
    else:
      np.testing.assert_array_equal(allowed_ids, edges)
  # Padding is dead and unreachable: its states have no group, padding groups no edges
  # (a counted chain's states share groups: fewer groups than states).
  padding = np.arange(len(live), s_pad)
  assert not t.accepting[padding].any()
  assert (t.state_groups[padding] == tables_lib.NO_STATE).all()
  groups = int(t.state_groups.max()) + 1
  padding_groups = np.arange(groups, len(t.edge_start) - 1)
  assert (t.edge_start[padding_groups] == t.edge_start[padding_groups + 1]).all()
  assert (t.edge_tokens[t.edge_start[groups]:] == tables_lib.PAD_TOKEN).all()
  assert t.edge_targets.max() < len(live)


def test_stacked_tables_equal_individual(gemma_compiler, gemma_vocab):
  from constrained_decoding.testing import TokenIndex  # pylint: disable=g-import-not-at-top

  parts = [gemma_compiler.compile(cd.Regex(p)) for p in _PATTERNS[:3]]
  stacked = cd.stack_tables(parts)
  assert stacked.num_constraints == 3
  index = TokenIndex(gemma_vocab)
  for i, (part, text) in enumerate(zip(parts, [b"Yellow", b"2024-11", b"ababc"])):
    tokens = index.longest_tokenization(text)
    states_a, ok_a = reference_walk(part, tokens)
    states_b, ok_b = reference_walk(stacked, tokens, start=int(stacked.start[i]))
    assert ok_a and ok_b
    offset = int(stacked.start[i]) - int(part.start[0])
    assert [s + offset for s in states_a] == states_b
    for a, b in zip([0] + states_a, [offset] + states_b):
      np.testing.assert_array_equal(reference_allowed(part, a), reference_allowed(stacked, b))
      assert part.accepting[a] == stacked.accepting[b]


def test_stack_rejects_other_vocabulary(gemma_compiler, byte_compiler):
  a = gemma_compiler.compile(cd.Regex("a"))
  b = byte_compiler.compile(cd.Regex("a"))
  with pytest.raises(ValueError, match=r"Tables 1 were built for another vocabulary"):
    cd.stack_tables([a, b])
  with pytest.raises(ValueError, match=r"stack_tables got no tables"):
    cd.stack_tables([])


def test_size_report(gemma_compiler):
  t, info = gemma_compiler.compile_with_info(cd.Regex(r"\d{4}"))
  sizes = cd.tables_nbytes(t)
  assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")
  assert sizes["mask_bits"] == t.mask_bits.shape[0] * 8192 * 4
  assert info.nbytes == sizes and info.token_states == 5 and info.byte_states == 5
  assert "nbytes=" in repr(t)

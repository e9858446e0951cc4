"""The numpy shortcuts of counted chains' compile equal the plain computations they
replace (`automata/_counting.py`, `_chain_edges.py`, `_counting_terminals.py`): rows
deduplicated by one lexsort (np.unique), liveness by breadth-first search in numpy
(`_compose`'s loop), and `CountingTerminals.fold` with `entry_ids` (groups deduplicated
in numpy) against the loop over every group.
"""

import dataclasses

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _chain_edges
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _counting
from constrained_decoding.automata import _counting_terminals


def test_unique_rows_equal_np_unique():
  rng = np.random.default_rng(0)
  for _ in range(50):
    rows = rng.integers(-2, 3, size=(int(rng.integers(1, 40)), int(rng.integers(1, 6))))
    want_rows, want_inverse = np.unique(rows, axis=0, return_inverse=True)
    got_rows, got_inverse = _chain_edges.unique_rows(rows)
    np.testing.assert_array_equal(got_rows, want_rows)
    np.testing.assert_array_equal(got_inverse, want_inverse.reshape(-1))


def test_live_states_equal_compose_loop():
  rng = np.random.default_rng(1)
  for _ in range(100):
    q = int(rng.integers(1, 30))
    e = int(rng.integers(0, 3 * q))
    src, dst = rng.integers(0, q, e), rng.integers(0, q, e)
    accepting = rng.random(q) < 0.2
    start = int(rng.integers(0, q))
    np.testing.assert_array_equal(
        _chain_edges.live_states(q, src, dst, start, accepting),
        _compose._live_states(q, src, dst, start, accepting))  # pylint: disable=protected-access


@pytest.fixture(scope="module")
def vocab():
  extra = [b"ab", b"abc", b"xyz ", b"abcdefgh", b"\xc3\xa4", b'b"', b'c"!', b"\\u", b'a\\',
           b"u00e4", b'\\"']
  tokens = [bytes([b]) for b in range(256)] + extra + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


@pytest.mark.parametrize("spec", [
    cd.JsonSchema({"type": "string", "maxLength": 40}),
    cd.JsonSchema({"type": "string", "minLength": 30}),
    cd.Regex('[^"]{0,50}'),
    cd.Regex("[a-z]{1,60}"),
])
def test_fold_by_ids_equals_fold_per_group(spec, vocab, monkeypatch):
  plain_fold = _counting_terminals.CountingTerminals.fold
  calls = []

  def both(self, mask_bits, row_of_group, entries_of_group, min_bucket, **kwargs):
    got = plain_fold(self, mask_bits, row_of_group, entries_of_group, min_bucket, **kwargs)
    want = plain_fold(self, mask_bits, row_of_group, entries_of_group, min_bucket)
    for field in dataclasses.fields(got):
      np.testing.assert_array_equal(getattr(got, field.name), getattr(want, field.name))
    calls.append("entry_ids" in kwargs)
    return got

  monkeypatch.setattr(_counting_terminals.CountingTerminals, "fold", both)
  _counting._COMPRESSED_CACHE.clear()  # pylint: disable=protected-access
  compiler = cd.Compiler(vocab, cd.CompileOptions(memoize=False))
  compiler.compile(spec)
  assert any(calls)  # A counted chain was compiled, its groups deduplicated by ids.

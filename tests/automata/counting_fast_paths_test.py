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


def test_entry_table_equals_a_loop_over_states():
  rng = np.random.default_rng(3)
  for _ in range(50):
    q, width = int(rng.integers(1, 40)), int(rng.integers(1, 5))
    # Lists shared by several states (as add_chain gives them), equal copies, empty ones.
    lists = [[(int(rng.integers(0, 9)), int(rng.integers(-40, 3)))
              for _ in range(int(rng.integers(0, width + 1)))] for _ in range(5)]
    entries_of = {}
    for state in rng.permutation(q)[:int(rng.integers(0, q + 1))].tolist():
      pick = lists[int(rng.integers(0, len(lists)))]
      entries_of[state] = pick if rng.random() < 0.7 else list(pick)
    live = rng.random(q) < 0.7
    want = np.full((q, width, 2), -1, np.int64)
    for state, entries in entries_of.items():
      if live[state]:
        for column, entry in enumerate(entries):
          want[state, column] = entry
    np.testing.assert_array_equal(_chain_edges.entry_table(entries_of, live, width), want)


def test_rows_by_fingerprint_number_like_a_dict_of_bytes():
  # Rows of 600 words (two folded columns of 256 and a tail), many of them pairs that
  # differ in bits the fold cancels (one bit in word i and the same one in i + 256):
  # equal fingerprints, unequal rows.
  rng = np.random.default_rng(2)
  for _ in range(30):
    base = rng.integers(0, 2**32, size=(4, 600), dtype=np.uint32)
    rows = []
    for _ in range(40):
      row = base[rng.integers(0, 4)].copy()
      for _ in range(int(rng.integers(0, 3))):
        i, bit = int(rng.integers(0, 256)), np.uint32(1 << int(rng.integers(0, 32)))
        row[i] ^= bit
        row[i + 256] ^= bit
      if rng.random() < 0.2:
        row[-1] ^= np.uint32(1)  # In the tail: a different fingerprint.
      rows.append(row)
    got = _counting_terminals._Rows()  # pylint: disable=protected-access
    want: dict = {}
    for row in rows:
      key = _counting_terminals.fingerprint(row) if rng.random() < 0.5 else None
      assert got.add(row, key) == want.setdefault(row.tobytes(), len(want))
    assert len(got) == len(want)
    np.testing.assert_array_equal(got.padded(lambda n: n + 1, 600)[:len(want)],
                                  np.frombuffer(b"".join(want), np.uint32).reshape(-1, 600))


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


@pytest.mark.parametrize("spec, excluded", [
    (cd.JsonSchema({"type": "string", "maxLength": 40}), True),
    (cd.JsonSchema({"type": "object", "properties": {"a": {"type": "string",
                                                           "maxLength": 45}}}), False),
    (cd.Regex('[^"]{0,50}'), False),
])
def test_split_by_free_max_equals_comparing_rows(spec, excluded, monkeypatch):
  """`_split` decides "row less exclusion is exact" from the unbounded tokens' largest
  count; comparing the rows themselves gives the same tables. Tokens of up to 30
  characters (some ending in an escape or a quote), so rows near a chain's end are
  stored less exclusion rows."""
  long = [c * k for c in (b"a", b"xy", b"q z") for k in range(1, 31)]
  tokens = ([bytes([b]) for b in range(256)] + long + [t + b"\\" for t in long[::3]]
            + [t + b'"' for t in long[1::3]] + [b"\\n" + t for t in long[::4]] + [None])
  vocab = cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])

  def compile_fresh():
    _counting._COMPRESSED_CACHE.clear()  # pylint: disable=protected-access
    return cd.Compiler(vocab, cd.CompileOptions(memoize=False)).compile(spec)

  plain_free_max = _counting_terminals.CountingTerminals._free_max  # pylint: disable=protected-access
  calls = []
  monkeypatch.setattr(_counting_terminals.CountingTerminals, "_free_max",
                      lambda self, free, row: calls.append(row) or plain_free_max(self, free, row))
  by_count = compile_fresh()
  assert calls, "the shortcut was taken"
  if excluded:
    assert by_count.excluded_bits.shape[0], "rows are stored less exclusion rows"
  monkeypatch.setattr(_counting_terminals.CountingTerminals, "_free_max",
                      lambda self, free, row: None)
  by_rows = compile_fresh()
  for field in dataclasses.fields(by_count):
    a, b = getattr(by_count, field.name), getattr(by_rows, field.name)
    if isinstance(a, np.ndarray):
      np.testing.assert_array_equal(a, b, err_msg=field.name)


def test_split_by_free_max_equals_comparing_rows_gemma(gemma_vocab, monkeypatch):
  """As above with Gemma 3's vocabulary and `maxLength` 10,000 (exclusion rows)."""
  spec = cd.JsonSchema({"type": "string", "maxLength": 10_000})
  compiler = cd.Compiler(gemma_vocab, cd.CompileOptions(memoize=False))

  def compile_fresh():
    _counting._COMPRESSED_CACHE.clear()  # pylint: disable=protected-access
    return compiler.compile(spec)

  by_count = compile_fresh()
  monkeypatch.setattr(_counting_terminals.CountingTerminals, "_free_max",
                      lambda self, free, row: None)
  by_rows = compile_fresh()
  assert by_count.excluded_bits.shape[0]
  for field in dataclasses.fields(by_count):
    a, b = getattr(by_count, field.name), getattr(by_rows, field.name)
    if isinstance(a, np.ndarray):
      np.testing.assert_array_equal(a, b, err_msg=field.name)


def test_free_max_is_the_largest_count_in_the_row(vocab, tmp_path):
  chain = _counting.find_chain(cd.Regex("[a-z]{1,40}").to_ir())
  counts = _counting._class_counts(vocab, chain.char_class, str(tmp_path))  # pylint: disable=protected-access
  w = (vocab.vocab_size + 31) // 32
  terminals = _counting_terminals.CountingTerminals(w)
  row = terminals.class_row(chain.char_class, counts)
  rng = np.random.default_rng(0)
  for _ in range(20):
    tokens = rng.choice(vocab.vocab_size, rng.integers(0, 30), replace=False)
    free = np.zeros(32 * w, bool)
    free[tokens] = True
    bits = np.packbits(free, bitorder="little").view(np.uint32)
    want = int(counts.counts[tokens].max(initial=0))
    assert terminals._free_max(bits, row) == want  # pylint: disable=protected-access


def _inner_reference(vocab, counts, body, inner):
  """`_inner_tokens` token by token in Python: each token wholly in K read byte by byte
  through X's DFA from each inner state."""
  out = {"finish": {}, "inside": {}}
  for x in inner:
    for t in np.flatnonzero(counts.counts > 0).tolist():
      data, state = vocab.token_bytes[t], x
      for p, b in enumerate(data[:8]):
        state = int(body.transitions[state, b])
        if state < 0:
          break
        if body.accepting[state]:
          if any(c >= 0x80 for c in data[:p + 1]):
            return None
          out["finish"].setdefault((x, p + 1), set()).add(t)
          break
      else:
        if state >= 0 and len(data) <= 8 and data[:1] and body.transitions[x, data[0]] >= 0:
          out["inside"].setdefault((x, state), set()).add(t)
  return out


@pytest.mark.parametrize("spec", [
    cd.JsonSchema({"type": "string", "maxLength": 40}),
    cd.Regex('[^"]{0,50}'),
    cd.Regex(".{0,50}"),
])
def test_inner_tokens_equal_a_walk_per_token(spec, vocab, tmp_path):
  chain = _counting.find_chain(spec.to_ir())
  slots = _counting._body_slots(chain.body)  # pylint: disable=protected-access
  counts = _counting._class_counts(vocab, chain.char_class, str(tmp_path))  # pylint: disable=protected-access
  counts.inner.clear()
  got = _counting_terminals._walk_inner_tokens(counts, slots.body, slots.inner)  # pylint: disable=protected-access
  want = _inner_reference(vocab, counts, slots.body, slots.inner)
  assert (got is None) == (want is None)
  for part in ("finish", "inside"):
    assert {k: set(v.tolist()) for k, v in got[part].items()} == want[part]
  if isinstance(spec, cd.JsonSchema):
    assert got["finish"], "escapes are finished inside an X"

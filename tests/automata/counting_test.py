"""Counted chains (`automata/_counting.py`): relative targets, checked against `re`.

The counted path must accept exactly the strings `re.fullmatch` accepts, under random
tokenizations (tokens cross character and chain boundaries), and the device step must
agree with the numpy reference walk over the same tables.
"""

import json
import os
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import tables as _tables
from constrained_decoding.automata import _array_file
from constrained_decoding.automata import _counting
from constrained_decoding.testing import _reference as ref

# Byte tokens plus multi-character ones: ASCII runs, whole and partial UTF-8 characters,
# tokens that cross the suffix (`ab"`), and ones starting with a continuation byte.
_EXTRA = [b"ab", b"abc", b"xyz ", b"  ", b"\xc3\xa4", b"a\xc3\xa4b", b"\xc3\xa4\xc3",
          b"\xa4x", b"\xe4\xb8\xad", b"\xe4\xb8", b"\xb8\xad!", b'b"', b'"a', b'c"!',
          b"\xf0\x9f\x98\x80", b"\n\n", b"abcdefgh",
          # JSON escapes split across tokens: `\` + `nab`, `\u` + `00e4 a`, `a\`, ...
          b"nab", b"n", b"u00", b"00e4 a", b"e4", b'\\"', b'a\\', b"\\u", b"/b", b'\\\\',
          b'"\\', b'\\n"', b"uD83D", b"\\uDE00"]


@pytest.fixture(scope="module")
def vocab():
  tokens = [bytes([b]) for b in range(256)] + _EXTRA + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


@pytest.fixture(scope="module")
def compiler(vocab, tmp_path_factory):
  return cd.Compiler(vocab, cd.CompileOptions(
      cache_dir=str(tmp_path_factory.mktemp("counting")), memoize=False))


# One JSON string character each (escapes of surrogates are not generated: the front
# end excludes them).
_JSON_ALPHABET = ["a", "b", " ", "ä", "中", "😀", "\\n", '\\"', "\\u00e4", "\\\\", "\\/"]

_ALPHABET = ["a", "b", "c", "x", " ", "\n", "ä", "中", "😀", "!", '"', "Z", "7"]

# (pattern, counted): counted says whether the counted path must be taken.
_CASES = [
    (r"[a-z]{3,40}", True),
    (r"[^\"]{0,50}", True),
    (r'"[^"]{2,45}"!', True),
    (r".{1,60}", True),
    (r"\w{1,45}", True),
    (r"[^\"]{30,70}", True),
    (r"[a-z\u00e4]{0,17}", True),
    (r"[^\"]{0,200}", True),
    (r"[^\"]{2,5}", True),
    (r"[a-z]{9,}", True),
    (r'"[^"]{10,}"!', True),
    (r".{3,}", True),
]


def _random_text(rng, length, pattern):
  # Characters the pattern's class allows mostly, with a few others mixed in.
  chars = [c for c in _ALPHABET if re.fullmatch(pattern.split("{")[0].lstrip('"') + "*", c)]
  out = [rng.choice(chars) for _ in range(length)]
  if rng.random() < 0.2 and out:
    out[rng.randrange(len(out))] = rng.choice(_ALPHABET)
  text = "".join(out)
  if pattern.startswith('"'):
    text = '"' + text + rng.choice(['"!', '"', '!', '"!!'])
  return text


@pytest.mark.parametrize("pattern, counted", _CASES)
def test_counted_chain_matches_re(pattern, counted, compiler, vocab):
  tables, info = compiler.compile_with_info(cd.Regex(pattern))
  assert (tables.token_counts.shape[0] == 1) == counted
  index = ref.TokenIndex(vocab)
  rng = random.Random(pattern)
  low, high = re.findall(r"\{(\d+),(\d*)\}", pattern)[0]
  high = int(high or 3 * int(low) + 20)  # Unbounded: well past the strip.
  for length in range(high + 3):
    for _ in range(2):
      text = _random_text(rng, length, pattern)
      expected = re.fullmatch(pattern, text, re.ASCII) is not None  # `\\w` is ASCII here
      tokens = index.random_tokenization(text.encode(), rng)
      assert ref.reference_accepts(tables, tokens) == expected, (pattern, text, tokens)


@pytest.mark.parametrize("spec, suffix, units", [
    (cd.Regex(r'"[^"]{2,45}"!'), '"!', list("abä中 😀")),
    (cd.JsonSchema({"type": "string", "minLength": 2, "maxLength": 45}), '"', _JSON_ALPHABET),
    (cd.JsonSchema({"type": "string", "minLength": 2}), '"', _JSON_ALPHABET),
])
def test_counted_chain_device_agrees_with_reference(spec, suffix, units, compiler, vocab):
  tables = compiler.compile(spec)
  index = ref.TokenIndex(vocab)
  rng = random.Random(0)
  step = jax.jit(cd.advance)
  high = 45 if "45" in spec.describe() else None
  for length in (0, 2, 20, 44, 45, 46, 90):
    text = '"' + "".join(rng.choice(units) for _ in range(length)) + suffix
    tokens = index.random_tokenization(text.encode(), rng)
    states, ok = ref.reference_walk(tables, tokens)
    state = cd.init_state(tables, batch_size=1)
    for t, expected in zip(tokens, states):
      allowed = np.asarray(cd.allowed_tokens(tables, state))[0]
      np.testing.assert_array_equal(allowed, ref.reference_allowed(tables, int(state.state[0])))
      state = step(tables, state, np.array([t], np.int32))
      assert int(state.state[0]) == expected
    if not ok:  # The reference stopped at a forbidden token: the device flags it.
      state = step(tables, state, np.array([tokens[len(states)]], np.int32))
    assert bool(state.error[0]) == (not ok)
    assert ok == (2 <= length <= (high or length))


@pytest.mark.parametrize("spec", [
    cd.JsonSchema({"type": "string", "minLength": 2, "maxLength": 12}),
    cd.Regex(r'"[^"]{2,12}"!'),
    cd.JsonSchema({"type": "object", "properties": {  # Embedded: `_embedded_chains.py`.
        "a": {"type": "string", "maxLength": 12}, "b": {"type": "integer"}},
        "required": ["a"]}),
    cd.JsonSchema({"type": "string", "minLength": 9}),  # Unbounded: the strip's states too.
], ids=["json-string", "regex", "object", "min-length"])
def test_advance_takes_a_token_iff_the_mask_offers_it(spec, compiler, vocab):
  """Every token id fed at every live state (one row per token): the rows left without
  `error` are exactly the mask row, which is `reference_allowed`'s (counting entries
  and their filters read entry by entry), and a taken token leads where
  `reference_step` says. Bound 12 is below the longest token (8 characters) plus a few,
  so most states have filters, and escapes under way have several counting entries."""
  tables = compiler.compile(spec)
  assert tables.token_counts.shape[0] == 1
  assert tables.state_terminals.shape[1] > 1 or isinstance(spec, cd.Regex)
  ids = np.arange(vocab.vocab_size, dtype=np.int32)
  eos = set(vocab.eos_ids)
  mask, step = jax.jit(cd.allowed_tokens), jax.jit(cd.advance)
  live = np.flatnonzero(np.asarray(tables.state_groups)[:, 0] >= 0)
  assert len(live) > 40
  for q in live.tolist():
    state = cd.init_state(tables, batch_size=len(ids))
    state = state.replace(state=jnp.full(len(ids), q, jnp.int32))
    allowed = np.asarray(mask(tables, state))[0]
    np.testing.assert_array_equal(allowed, ref.reference_allowed(tables, q), err_msg=str(q))
    after = step(tables, state, ids)
    np.testing.assert_array_equal(~np.asarray(after.error), allowed, err_msg=str(q))
    targets = np.asarray(after.state)
    for t in np.flatnonzero(allowed).tolist():
      if t not in eos:
        assert targets[t] == ref.reference_step(tables, q, t), (q, t)


def test_stacked_counted_and_plain_tables(compiler, vocab):
  counted = compiler.compile(cd.Regex(r"[a-z]{3,40}"))
  plain = compiler.compile(cd.Regex(r"(ab|c)+"))
  stacked = cd.stack_tables([plain, counted])
  index = ref.TokenIndex(vocab)
  rng = random.Random(1)
  start = int(stacked.start[1])
  for length in (2, 3, 17, 40, 41):
    text = "".join(rng.choice("abcxyz") for _ in range(length)).encode()
    tokens = index.random_tokenization(text, rng)
    assert ref.reference_accepts(stacked, tokens, start) == (3 <= length <= 40)
    assert ref.reference_accepts(counted, tokens) == (3 <= length <= 40)



@pytest.mark.parametrize("low, high", [(0, 20), (3, 40), (25, 60)])
def test_json_string_lengths_count_escapes_once(low, high, compiler, vocab):
  """maxLength/minLength lower to a counted chain of JSON string characters (a code
  point or one escape); escapes started in one token and finished in the next count once."""
  schema = {"type": "string", "minLength": low, "maxLength": high}
  tables = compiler.compile(cd.JsonSchema(schema))
  assert tables.token_counts.shape[0] == 1
  index = ref.TokenIndex(vocab)
  rng = random.Random(high)
  for length in range(high + 3):
    for _ in range(2):
      units = [rng.choice(_JSON_ALPHABET) for _ in range(length)]
      text = '"' + "".join(units) + '"'
      tokens = index.random_tokenization(text.encode(), rng)
      assert ref.reference_accepts(tables, tokens) == (low <= length <= high), text


def test_huge_bound_trips_the_table_budget_first(vocab):
  # Checked before the states are allocated (a MemoryError would be a defect).
  small = cd.Compiler(vocab, cd.CompileOptions(cache_dir=None, max_table_bytes=1 << 20))
  with pytest.raises(cd.CompileBudgetError, match="states .* for them alone"):
    small.compile(cd.Regex(r"[a-z]{1,90000}"))


def test_find_chain_shapes():
  assert _counting.find_chain(cd.Regex(r"[a-z]{1,200}").to_ir()) is not None
  assert _counting.find_chain(cd.Regex(r"[a-z]{1,8}").to_ir()) is not None
  assert _counting.find_chain(cd.Regex(r"[a-z]{1,7}").to_ir()) is None  # short: plain
  assert _counting.find_chain(cd.Regex(r"[^a]{1,2}").to_ir()) is not None  # ... unless wide
  assert _counting.find_chain(cd.Regex(r"[a-z]{0,1}").to_ir()) is None  # short: plain
  assert _counting.find_chain(cd.Regex(r"[a-z]{8,}").to_ir()).max is None  # unbounded
  assert _counting.find_chain(cd.Regex(r"[a-z]+").to_ir()) is None  # a plain loop
  assert _counting.find_chain(cd.Regex(r"[0-9]{1,200}").to_ir()) is None  # narrow class
  assert _counting.find_chain(cd.Regex(r"[a-z]{1,200}b").to_ir()) is None  # suffix in K


@pytest.mark.parametrize("pattern", [r'[^"]{0,10000}', r"\w{1,10000}", r".{0,500}",
                                     r"[a-z]{1,200}"])
def test_gemma_counted_chains_are_small_and_exact(pattern, gemma_compiler, gemma_vocab):
  tables, info = gemma_compiler.compile_with_info(cd.Regex(pattern))
  assert tables.token_counts.shape[0] == 1
  # Most of it are mask rows near the end (without the bound, plus one exclusion row
  # per count of characters left below the longest token: `tables.py`), terminals and
  # one word per state: whatever the bound, not growing with it.
  assert info.nbytes["total"] <= 8 << 20
  index = ref.TokenIndex(gemma_vocab)
  rng = random.Random(pattern)
  low, high = (int(x) for x in re.findall(r"\{(\d+),(\d+)\}", pattern)[0])
  chars = "abc xyzä中😀" if pattern.startswith(("[^", ".")) else "abcxyz_09"
  if pattern.startswith("[a-z]"):
    chars = "abcxyz"
  for length in sorted({0, 1, low, high - 60, high - 1, high, high + 1, high + 2}):
    if length < 0:
      continue
    text = "".join(rng.choice(chars) for _ in range(length))
    tokens = index.random_tokenization(text.encode(), rng)
    assert ref.reference_accepts(tables, tokens) == (low <= length <= high), length


@pytest.mark.parametrize("pattern", [r'"[^"]{2,45}"!', r"[a-z\u00e4]{0,17}", r".{1,30}",
                                     r"[^\"]{20,40}", {"type": "string", "maxLength": 24},
                                     {"type": "string", "minLength": 18, "maxLength": 30},
                                     r"[a-z]{9,}", {"type": "string", "minLength": 12},
                                     {"type": "string", "minLength": 3}])
def test_counted_chain_equals_plain_composition(pattern, compiler, vocab, tmp_path):
  """Random token walks agree, prefix by prefix, with plain composition's tables."""
  spec = cd.Regex(pattern) if isinstance(pattern, str) else cd.JsonSchema(pattern)
  counted = compiler.compile(spec)
  plain = cd.Compiler(vocab, cd.CompileOptions(cache_dir=str(tmp_path), memoize=False,
                                               wide_states=False)).compile(spec)
  assert counted.token_counts.shape[0] == 1 and plain.token_counts.shape[0] == 0
  rng = np.random.default_rng(0)
  eos = set(vocab.eos_ids)
  for _ in range(60):
    tokens, c_state, p_state = [], int(counted.start[0]), int(plain.start[0])
    # Long enough to run through an unbounded chain's strip and back.
    for _ in range(int(rng.integers(1, 100))):
      c_allowed = ref.reference_allowed(counted, c_state)
      p_allowed = ref.reference_allowed(plain, p_state)
      np.testing.assert_array_equal(c_allowed, p_allowed)
      choices = [t for t in np.flatnonzero(c_allowed) if t not in eos]
      if not choices:
        break
      # Mostly allowed tokens; sometimes any token (both must then reject it alike).
      token = int(rng.choice(choices) if rng.random() < 0.9 else rng.integers(vocab.vocab_size))
      tokens.append(token)
      c_next = ref.reference_step(counted, c_state, token)
      p_next = ref.reference_step(plain, p_state, token)
      assert (c_next is None) == (p_next is None), tokens
      if c_next is None:
        break
      c_state, p_state = c_next, p_next
    assert ref.reference_accepts(counted, tokens) == ref.reference_accepts(plain, tokens)


@pytest.mark.parametrize("low, high", [(0, 10_000), (9_990, 10_000), (0, 80)])
def test_gemma_json_max_length(low, high, gemma_compiler, gemma_vocab):
  schema = {"type": "string", "minLength": low, "maxLength": high}
  tables, info = gemma_compiler.compile_with_info(cd.JsonSchema(schema))
  assert tables.token_counts.shape[0] == 1
  # Most of it are mask rows near the end (without the bound, plus one exclusion row
  # per count of characters left below the longest token: `tables.py`), terminals and
  # one word per state: whatever the bound, not growing with it.
  assert info.nbytes["total"] <= 8 << 20
  index = ref.TokenIndex(gemma_vocab)
  rng = random.Random(high)
  for length in sorted({0, 1, low - 1, low, high - 1, high, high + 1}):
    if length < 0:
      continue
    units = [rng.choice(_JSON_ALPHABET) for _ in range(length)]
    text = '"' + "".join(units) + '"'
    for _ in range(2):
      tokens = index.random_tokenization(text.encode(), rng)
      assert ref.reference_accepts(tables, tokens) == (low <= length <= high), length


@pytest.mark.parametrize("low", [2, 8, 100])  # 10,000: benchmarks/scale_bench.py
def test_gemma_json_min_length(low, gemma_compiler, gemma_vocab):
  """`minLength` alone (`X{n,}`): counted up to n, then a strip of positions that a
  token runs up (lower half) or down (upper half) without leaving: small tables, exact
  at n and far past it under random tokenizations (long tokens cross the strip)."""
  tables, info = gemma_compiler.compile_with_info(cd.JsonSchema({"type": "string",
                                                                 "minLength": low}))
  assert tables.token_counts.shape[0] == 1
  assert info.nbytes["total"] <= 8 << 20
  index = ref.TokenIndex(gemma_vocab)
  rng = random.Random(low)
  for length in sorted({0, 1, low - 1, low, low + 1, low + 300}):
    if length < 0:
      continue
    # Runs of one character, so that long tokens (spaces, repeated letters) are drawn.
    chars = []
    while len(chars) < length:
      chars += [rng.choice(_JSON_ALPHABET)] * rng.randint(1, 12)
    text = '"' + "".join(chars[:length]) + '"'
    assert len(json.loads(text)) == length
    for _ in range(2):
      tokens = index.random_tokenization(text.encode(), rng)
      assert ref.reference_accepts(tables, tokens) == (length >= low), length


def test_class_counts_are_cached_on_disk(vocab, tmp_path, spy):
  """A second process (here: the in-memory cache emptied) reads the counts back instead
  of scanning the vocabulary, and compiles the same tables."""
  spec = cd.JsonSchema({"type": "object", "properties": {"a": {"type": "string",
                                                               "maxLength": 30}}})
  options = cd.CompileOptions(cache_dir=str(tmp_path), memoize=False)
  _counting._CLASS_CACHE.clear()  # pylint: disable=protected-access
  scans = spy(_counting, "_count_tokens")
  first = cd.Compiler(vocab, options).compile(spec)
  assert len(scans) == 1
  assert any(name.startswith("class-counts-v") for name in os.listdir(tmp_path))
  _counting._CLASS_CACHE.clear()  # pylint: disable=protected-access
  second = cd.Compiler(vocab, options).compile(spec)
  assert len(scans) == 1  # Read from disk.
  for name in _tables._ARRAY_FIELDS:  # pylint: disable=protected-access
    np.testing.assert_array_equal(getattr(first, name), getattr(second, name), err_msg=name)
  # A damaged file is counted again, not trusted. Replaced, not rewritten in place: the
  # cache maps its files, and a mapped file cut short faults when touched.
  for name in os.listdir(tmp_path):
    if name.startswith("class-counts-v"):
      with open(tmp_path / (name + ".damaged"), "wb") as f:
        f.write(b"not an npz")
      os.replace(tmp_path / (name + ".damaged"), tmp_path / name)
  _counting._CLASS_CACHE.clear()  # pylint: disable=protected-access
  cd.Compiler(vocab, options).compile(spec)
  assert len(scans) == 2


def test_chain_subtries_are_cached_on_disk(vocab, tmp_path, spy):
  """The sub-trie chain states walk and the tokens read inside an escape are saved next
  to the class counts: a second process (in-memory caches emptied) reads them back and
  compiles the same tables; a damaged file is built again."""
  from constrained_decoding.automata import _counting_terminals  # pylint: disable=g-import-not-at-top
  from constrained_decoding.automata import _loops  # pylint: disable=g-import-not-at-top

  spec = cd.JsonSchema({"type": "string", "maxLength": 30})
  options = cd.CompileOptions(cache_dir=str(tmp_path), memoize=False)

  def compile_fresh():
    _counting._CLASS_CACHE.clear()  # pylint: disable=protected-access
    _counting._COMPRESSED_CACHE.clear()  # pylint: disable=protected-access
    return cd.Compiler(vocab, options).compile(spec)

  builds = spy(_loops, "_subtrie")
  walks = spy(_counting_terminals, "_walk_inner_tokens")
  first = compile_fresh()
  assert len(builds) == 1 and len(walks) == 1
  files = [name for name in os.listdir(tmp_path) if "-subtrie-" in name]
  assert len(files) == 1
  second = compile_fresh()
  assert len(builds) == 1 and len(walks) == 1  # Read from disk.
  for name in _tables._ARRAY_FIELDS:  # pylint: disable=protected-access
    np.testing.assert_array_equal(getattr(first, name), getattr(second, name), err_msg=name)
  arrays = dict(_array_file.read(str(tmp_path / files[0])))
  arrays["token_ids"] = arrays["token_ids"][:-1]  # Not a trie any more.
  with open(tmp_path / (files[0] + ".new"), "wb") as f:  # Replaced, not cut in place.
    _array_file.write(f, arrays)
  os.replace(tmp_path / (files[0] + ".new"), tmp_path / files[0])
  third = compile_fresh()
  assert len(builds) == 2
  np.testing.assert_array_equal(first.edge_tokens, third.edge_tokens)

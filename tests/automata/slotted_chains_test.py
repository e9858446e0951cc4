"""Counted chains with slots (`automata/_slotted_chains.py`): a pattern and `maxLength`.

Oracles: plain composition of the same spec (allowed sets compared state by state along
random token walks, over fixed and random multi-character vocabularies), exact
enumeration of every accepted token sequence against every tokenization of every
string `re.fullmatch` accepts, `re.fullmatch` plus the length bounds under random
tokenizations, and the device step against the numpy reference walk.
"""

import itertools
import json
import random
import re

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata import _slotted_chains
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.testing import _exact
from constrained_decoding.testing import _reference as ref

DNS = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PACKAGE = "^(?:@[a-z0-9-*~][a-z0-9-*._~]*/)?[a-z0-9-~][a-z0-9-._~]*$"
PAIRS = "^([a-p][0-9])*$"  # Slots that alternate: only even lengths finish.

# Byte tokens plus multi-character ones inside the chain's class, ones that cross its
# start and end (`"ab`, `b",`), and ones that change slot (`a-`, `-b`, `--`).
_EXTRA = [b"ab", b"a-", b"-b", b"--", b"abc-def", b"x9-", b"z" * 20, b"a0b1", b"0b",
          b'a"', b'"a', b'b",', b'":"', b'{"n":"', b'"}', b"@a", b"a/b", b"ab.c", b"9"]


@pytest.fixture(scope="module")
def vocab():
  tokens = [bytes([b]) for b in range(256)] + _EXTRA + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


def _compilers(vocab):
  counted = cd.Compiler(vocab, cd.CompileOptions(memoize=False))
  plain = cd.Compiler(vocab, cd.CompileOptions(memoize=False, counted_chains=False))
  return counted, plain


def _string(pattern, max_length, min_length=0):
  return {"type": "string", "pattern": pattern, "maxLength": max_length,
          "minLength": min_length}


_SCHEMAS = [
    _string(DNS, 20),
    _string(DNS, 9, 3),
    _string(PACKAGE, 30, 1),
    _string(PAIRS, 13, 4),
    {"type": "object", "properties": {"n": _string(DNS, 12), "i": {"type": "integer"}},
     "required": ["n"]},
    {"type": "array", "items": _string(DNS, 10)},
    {"anyOf": [_string(DNS, 15), {"type": "null"}]},
]


def _assert_slotted_equals_plain(schema, vocab, walks: int, seed: int = 0) -> None:
  """The slotted-chain tables of `schema` walk like its plain composition."""
  counted_compiler, plain_compiler = _compilers(vocab)
  counted = counted_compiler.compile(cd.JsonSchema(schema))
  plain = plain_compiler.compile(cd.JsonSchema(schema))
  assert counted.token_counts.shape[0] >= 1, "the slotted-chain path was not taken"
  assert plain.token_counts.shape[0] == 0
  ref.assert_same_walks(counted, plain, vocab.eos_ids, walks=walks, max_steps=40, seed=seed)


@pytest.mark.parametrize("schema", _SCHEMAS, ids=lambda s: json.dumps(s)[:60])
def test_slotted_chains_equal_plain_composition(schema, vocab):
  _assert_slotted_equals_plain(schema, vocab, walks=80)


@pytest.mark.parametrize("pattern,low,high", [(DNS, 0, 20), (DNS, 2, 9), (PACKAGE, 1, 25),
                                              (PAIRS, 4, 13)])
def test_random_tokenizations_match_re(pattern, low, high, vocab):
  tables = _compilers(vocab)[0].compile(cd.JsonSchema(_string(pattern, high, low)))
  assert tables.token_counts.shape[0] >= 1
  index = ref.TokenIndex(vocab)
  rng = random.Random(5)
  alphabet = "abz09-._~@/*"
  for n in [0, 1, 2, low, high - 1, high, high + 1] * 6:
    for text in ("".join(rng.choice(alphabet) for _ in range(n)),
                 "".join(rng.choice("ab0-") for _ in range(n)),
                 "a" * max(n - 1, 0) + "-" * (n > 0), "ab" * (n // 2),
                 "a1" * (n // 2), "@a/" + "b" * max(n - 3, 0)):
      data = json.dumps(text).encode()
      want = bool(re.fullmatch(pattern.strip("^$"), text)) and low <= len(text) <= high
      for _ in range(2):
        tokens = index.random_tokenization(data, rng)
        assert ref.reference_accepts(tables, tokens) == want, (pattern, text)


def _tokenizations(data: bytes, token_ids: dict) -> list[tuple[int, ...]]:
  if not data:
    return [()]
  out = []
  for k in range(1, len(data) + 1):
    head = token_ids.get(data[:k])
    if head is not None:
      out += [(head,) + rest for rest in _tokenizations(data[k:], token_ids)]
  return out


@pytest.mark.parametrize("pattern,chars,low,high", [
    ("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "a-", 0, 8),
    ("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "a0-", 2, 8),
    ("^([a-p][0-9])*$", "a0", 2, 9),
])
def test_exact_enumeration_on_a_small_vocabulary(pattern, chars, low, high):
  # Only a few of the class's characters are tokens, so the language is small enough to
  # list; multi-character tokens cross slots and the string's ends.
  pieces = [c.encode() for c in chars] + [b'"']
  pieces += [a + b for a, b in itertools.product(pieces, repeat=2)]
  pieces += [b"a-a", b'a"', b'"a-', b"aaaa"]
  tokens = sorted(set(pieces)) + [None]
  vocab = cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])
  tables = _compilers(vocab)[0].compile(cd.JsonSchema(_string(pattern, high, low)))
  assert tables.token_counts.shape[0] >= 1
  token_ids = {t: k for k, t in enumerate(tokens) if t is not None}
  want = set()
  for n in range(low, high + 1):
    for text in map("".join, itertools.product(chars, repeat=n)):
      if re.fullmatch(pattern.strip("^$"), text):
        want.update(_tokenizations(json.dumps(text).encode(), token_ids))
  got = set(_exact.accepted_sequences(tables, max_length=high + 2, limit=1_000_000))
  assert got == want


_ALPHABET = "ab09-._\"x"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(_ALPHABET, min_size=2, max_size=5), min_size=3, max_size=25),
       st.sampled_from([DNS, PACKAGE, PAIRS, "^[a-z0-9]+(\\.[a-z0-9_-]+)*$"]),
       st.integers(8, 18), st.integers(0, 3), st.integers(0, 10 ** 6))
def test_random_vocabularies_equal_plain_composition(extra, pattern, high, low, seed):
  tokens = [bytes([b]) for b in range(128)] + sorted({t.encode() for t in extra}) + [None]
  vocab = cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])
  schema = {"type": "object", "properties": {"n": _string(pattern, high, low)},
            "required": ["n"]}
  _assert_slotted_equals_plain(schema, vocab, walks=20, seed=seed)


def test_device_step_agrees_with_reference(vocab):
  schema = {"type": "object", "properties": {"n": _string(DNS, 20)}, "required": ["n"]}
  tables = _compilers(vocab)[0].compile(cd.JsonSchema(schema))
  index = ref.TokenIndex(vocab)
  rng = random.Random(0)
  step = jax.jit(cd.advance)
  for text in ['{"n":"ab-c"}', '{"n":"' + "a" * 20 + '"}', '{"n":"' + "a-" * 10 + '"}',
               '{"n":"abc-def-x9-0b"}']:
    tokens = index.random_tokenization(text.encode(), rng)
    states, ok = ref.reference_walk(tables, tokens)
    state = cd.init_state(tables, batch_size=1)
    for token, expected in zip(tokens, states):
      allowed = np.asarray(cd.allowed_tokens(tables, state))[0]
      np.testing.assert_array_equal(allowed, ref.reference_allowed(tables, int(state.state[0])))
      state = step(tables, state, np.array([token], np.int32))
      assert int(state.state[0]) == expected
    value = json.loads(text)["n"]
    assert ok == (bool(re.fullmatch(DNS.strip("^$"), value)) and len(value) <= 20)


def test_length_product_is_layered_and_recognized():
  text = ir.concat(ir.char_class([(ord("a"), ord("z"))]),
                   ir.repeat(ir.char_class([(ord("-"), ord("-")), (ord("a"), ord("z"))]), 0,
                             None))
  graph = _slotted_chains.length_product(text, 2, 30)
  assert graph is not None
  slotted = _slotted_chains.find_slotted(graph)
  assert slotted is not None and slotted.num_slots == 2 and slotted.length == 30
  # Not a slotted chain: an arc that skips a layer, or non-ASCII characters.
  skipping = ir.Graph(graph.num_states, graph.arcs + ((0, graph.arcs[0][1], 4),), graph.finals)
  assert _slotted_chains.find_slotted(skipping) is None
  # Two slot functions: slot 0 reads "a" into slot 0 at layer 0, into slot 1 at layer 1.
  a = ir.char_class([(ord("a"), ord("a"))])
  letters = ir.char_class([(ord("b"), ord("z"))])
  arcs = tuple((2 * j, letters, 2 * j + 2) for j in range(10)) + ((0, a, 2), (2, a, 5))
  assert _slotted_chains.find_slotted(ir.Graph(22, arcs, (20,))) is None
  # An arc missing between present cells (the graph is not the product of its slots).
  for k in (0, 5, len(graph.arcs) - 1):
    missing = ir.Graph(graph.num_states, graph.arcs[:k] + graph.arcs[k + 1:], graph.finals)
    assert _slotted_chains.find_slotted(missing) is None
  assert _slotted_chains.find_slotted(ir.Graph(22, ((0, ir.CharClass(()), 2),), (2,))) is None
  # Non-ASCII characters are counted too; a class of fewer than 16 characters is not.
  wide = _slotted_chains.length_product(ir.repeat(ir.char_class([(0xE0, 0x1FF)]), 0, None),
                                        0, 30)
  assert wide is not None and _slotted_chains.find_slotted(wide).num_slots == 1
  assert _slotted_chains.length_product(ir.repeat(ir.char_class([(0xE0, 0xEE)]), 0, None),
                                        0, 30) is None
  # A layout past `MAX_CHAIN_STATES` (a class with many UTF-8 decoder states, a long
  # bound) is left to plain composition and its budgets.
  scattered = random.Random(0).sample(range(0x800, 0xD800), 1500)  # ~500 decoder states
  many = ir.char_class([(c, c) for c in scattered])
  long = _slotted_chains.length_product(ir.repeat(many, 0, None), 0, 2000)
  assert long is not None and _slotted_chains.find_slotted(long) is None
  assert _slotted_chains.find_slotted(
      _slotted_chains.length_product(ir.repeat(many, 0, None), 0, 20)) is not None
  # Too short for a chain: intersected as before.
  assert _slotted_chains.length_product(text, 0, 5) is None


SUBDOMAIN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


@pytest.mark.parametrize("pattern,high", [(DNS, 63), (SUBDOMAIN, 253)])
def test_gemma_dns_names_are_small_and_exact(pattern, high, gemma_compiler, gemma_vocab):
  """The DNS label needed 50 MiB (3.8M token edges) with Gemma 3, the subdomain was
  refused past 20M edges."""
  tables, info = gemma_compiler.compile_with_info(cd.JsonSchema(_string(pattern, high)))
  assert tables.token_counts.shape[0] >= 1
  assert info.nbytes["total"] <= 8 << 20 and info.token_edges <= 10_000
  index = ref.TokenIndex(gemma_vocab)
  rng = random.Random(2)
  for n in (0, 1, 2, 30, high - 1, high, high + 1):
    texts = ["".join(rng.choice(alphabet) for _ in range(n))
             for alphabet in ("abcxyz09-", "ab-.", "k8s-app.")]
    texts += ["a" * n, ("a-" * n)[:max(n - 1, 0)] + "b" * (n > 0)]
    for text in texts:
      want = bool(re.fullmatch(pattern.strip("^$"), text)) and len(text) <= high
      for _ in range(2):
        tokens = index.random_tokenization(json.dumps(text).encode(), rng)
        assert ref.reference_accepts(tables, tokens) == want, text


# Patterns over any JSON string character: non-ASCII ones (several bytes each) and
# escaped ones (`\"`, `\\`, `\t`, `\u0001`) count as one character each.
NONBLANK = "^\\S(.*\\S)?$"
NO_EMPTY_FIELD = "^[^,]+(,[^,]+)*$"
LATIN_WORDS = "^[a-zà-ÿ]([- a-zà-ÿ]*[a-zà-ÿ])?$"
LETTERS = "^[\\p{L}\\d]([-\\p{L}\\d_. ]*[\\p{L}\\d])?$"  # ~1,300 code point ranges

# Tokens that split characters (single bytes), hold whole ones (`é`, `日本`), escapes or
# parts of one (`\\`, `\\u00`, `1f`, `nab`: `n` finishes `\`, then `ab`), and cross the
# string's ends.
_UNICODE_EXTRA = ["é", "ab", "é,", "\\n", "\\u00", "\\u001", "1f", "01", "nab", "té", '"',
                  '",', "a b", " ", "\\", '\\"', "x\\", "ü é", "日本", "本\\t", '"}', "fa",
                  ",,", "à-z", '{"n":"', "\\\\", "é\\"]


@pytest.fixture(scope="module")
def unicode_vocab():
  tokens = ([bytes([b]) for b in range(256)] + [t.encode() for t in _UNICODE_EXTRA]
            + [None])
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


_UNICODE_SCHEMAS = [
    _string(NONBLANK, 12),
    _string(NONBLANK, 9, 2),
    _string(NO_EMPTY_FIELD, 10, 3),
    _string(LATIN_WORDS, 11),
    _string(LETTERS, 9),
    {"type": "object", "properties": {"n": _string(NONBLANK, 10), "i": {"type": "integer"}},
     "required": ["n"]},
    {"type": "array", "items": _string(NO_EMPTY_FIELD, 9)},
]


@pytest.mark.parametrize("schema", _UNICODE_SCHEMAS, ids=lambda s: json.dumps(s)[:60])
def test_unicode_and_escapes_equal_plain_composition(schema, unicode_vocab):
  _assert_slotted_equals_plain(schema, unicode_vocab, walks=120)


# ECMA-262's `\S` (JSON Schema patterns), not Python's (which counts \x1c-\x1f as space).
_ECMA_NON_SPACE = "[^\t\n\v\f\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"


def _python(pattern: str) -> str:
  r"""`pattern` for `re.fullmatch` (the texts tested hold no \r, \u2028 or \u2029, which
  ECMA's `.` excludes too)."""
  return pattern.strip("^$").replace("\\S", _ECMA_NON_SPACE)


@pytest.mark.parametrize("pattern,low,high", [(NONBLANK, 0, 12), (NONBLANK, 2, 9),
                                              (NO_EMPTY_FIELD, 3, 10), (LATIN_WORDS, 0, 11)])
def test_unicode_random_tokenizations_match_re(pattern, low, high, unicode_vocab):
  tables = _compilers(unicode_vocab)[0].compile(cd.JsonSchema(_string(pattern, high, low)))
  assert tables.token_counts.shape[0] >= 1
  index = ref.TokenIndex(unicode_vocab)
  rng = random.Random(7)
  alphabets = ["aé日 ,", "ab \"\\\t\n\x01,", "é-à z", "\x1f\"é,"]
  for n in [0, 1, 2, low, high - 1, high, high + 1] * 5:
    for alphabet in alphabets:
      text = "".join(rng.choice(alphabet) for _ in range(n))
      data = json.dumps(text, ensure_ascii=False).encode()
      want = bool(re.fullmatch(_python(pattern), text)) and low <= len(text) <= high
      for _ in range(2):
        tokens = index.random_tokenization(data, rng)
        assert ref.reference_accepts(tables, tokens) == want, (pattern, text)


def test_unicode_exact_enumeration():
  # Every accepted token sequence against every tokenization of every text: characters
  # of two bytes (split or whole) and an escaped quote (split after its backslash), and
  # a token that ends one character and the string (50,608 sequences).
  chars = ["é", ",", '"']
  pieces = [b"\xc3\xa9", b"\xc3", b"\xa9", b",", b"\\", b'"', b'\xa9"']
  tokens = sorted(set(pieces)) + [None]
  vocab = cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])
  low, high = 1, 8
  pattern = "^[^,\\\\]+(,[^,\\\\]+)*$"  # No backslash (`chars` has none).
  tables = _compilers(vocab)[0].compile(cd.JsonSchema(_string(pattern, high, low)))
  assert tables.token_counts.shape[0] >= 1
  token_ids = {t: k for k, t in enumerate(tokens) if t is not None}
  want = set()
  for n in range(low, high + 1):
    for text in map("".join, itertools.product(chars, repeat=n)):
      if re.fullmatch(_python(pattern), text):
        want.update(_tokenizations(json.dumps(text, ensure_ascii=False).encode(), token_ids))
  got = set(_exact.accepted_sequences(tables, max_length=2 * high + 2, limit=1_000_000))
  assert got == want


_UNICODE_ALPHABET = "aé日 ,\"\\nt01fu"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(_UNICODE_ALPHABET, min_size=1, max_size=5), min_size=3, max_size=25),
       st.sampled_from([NONBLANK, NO_EMPTY_FIELD, LATIN_WORDS]),
       st.integers(8, 14), st.integers(0, 3), st.integers(0, 10 ** 6))
def test_unicode_random_vocabularies_equal_plain_composition(extra, pattern, high, low, seed):
  tokens = ([bytes([b]) for b in range(256)] + sorted({t.encode() for t in extra} - {
      bytes([b]) for b in range(256)}) + [None])
  vocab = cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])
  schema = {"type": "object", "properties": {"n": _string(pattern, high, low)},
            "required": ["n"]}
  _assert_slotted_equals_plain(schema, vocab, walks=20, seed=seed)


def test_gemma_non_blank_string_is_small_and_exact(gemma_compiler, gemma_vocab):
  """`^\\S(.*\\S)?$` with maxLength 100 was refused past 20M token edges with Gemma 3."""
  high = 100
  tables, info = gemma_compiler.compile_with_info(cd.JsonSchema(_string(NONBLANK, high)))
  assert tables.token_counts.shape[0] >= 1
  assert info.nbytes["total"] <= 64 << 20
  index = ref.TokenIndex(gemma_vocab)
  rng = random.Random(3)
  for n in (0, 1, 2, 50, high - 1, high, high + 1):
    for alphabet in ("abc xyz", "é日本 \t\"\\,", "Hello, world!\n"):
      text = "".join(rng.choice(alphabet) for _ in range(n))
      for edit in (text, " " + text[1:], text[:-1] + " "):
        want = bool(re.fullmatch(_python(NONBLANK), edit)) and len(edit) <= high
        for _ in range(2):
          data = json.dumps(edit, ensure_ascii=False).encode()
          tokens = index.random_tokenization(data, rng)
          assert ref.reference_accepts(tables, tokens) == want, edit


def test_unique_bool_rows_is_numpys_unique_by_rows():
  """The landing patterns of `add_slotted` (one int code per row, or numpy's own past 62
  columns) in numpy's order, with its inverse: random and repeated rows, 1..70 columns."""
  from constrained_decoding.automata import _slotted_counting  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  for trial in range(600):
    n, c = int(rng.integers(1, 40)), int(rng.integers(1, 71))
    rows = rng.random((n, c)) < rng.random()
    if trial % 3 == 0:
      rows[rng.integers(0, n, n)] = rows[rng.integers(0, n)]
    want, want_inverse = np.unique(rows, axis=0, return_inverse=True)
    got, inverse = _slotted_counting._unique_bool_rows(rows)  # pylint: disable=protected-access
    assert got.dtype == bool and np.array_equal(got, want)
    assert np.array_equal(inverse, want_inverse.reshape(-1))

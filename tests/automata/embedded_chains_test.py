"""Counted chains inside larger constraints (`automata/_embedded_chains.py`).

Oracles: plain composition of the same spec (allowed sets compared state by state along
random token walks), `re.fullmatch` and `jsonschema` under random tokenizations, and the
device step against the numpy reference walk.
"""

import dataclasses
import json
import random
import re

import jax
import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import _reference as ref

# Byte tokens plus multi-character ones that cross chain starts and ends (`":"ab`,
# `ab",`, `"}`), escapes split across tokens and partial UTF-8 characters.
_EXTRA = [b"ab", b"abc", b"xyz ", b"\xc3\xa4", b"a\xc3\xa4b", b"\xc3\xa4\xc3", b"\xa4x",
          b"\xe4\xb8\xad", b'b"', b'"a', b'c"!', b'ab",', b'","', b'":"', b'":"ab', b'"}',
          b'"]', b'",{"', b'{"a":"', b"abcdefgh", b"nab", b"u00", b"00e4 a", b"e4", b'\\"',
          b'a\\', b"\\u", b'\\\\', b'"\\', b"Yab", b"bY", b"null", b'":null']


@pytest.fixture(scope="module")
def vocab():
  tokens = [bytes([b]) for b in range(256)] + _EXTRA + [None]
  return cd.Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) - 1])


_OBJECT = {"type": "object", "properties": {
    "a": {"type": "string", "maxLength": 20}, "b": {"type": "integer"},
    "c": {"type": "string", "minLength": 2, "maxLength": 9},
    "d": {"type": "string", "minLength": 4}}, "required": ["a"]}  # d: unbounded
_SPECS = [
    cd.Regex(r"x[a-z]{0,20}Y[a-z]{3,30}Z"),          # two chains in sequence
    cd.Regex(r'(a[^"]{0,12}")+'),                     # one chain in a loop
    cd.JsonSchema(_OBJECT),                           # string properties, any order
    cd.JsonSchema({"type": "array", "items": {"type": "string", "maxLength": 12}}),
    cd.JsonSchema({"anyOf": [{"type": "string", "maxLength": 15}, {"type": "null"}]}),
    cd.JsonSchema({"type": "object", "properties": {"a": {"type": "string", "maxLength": 10}},
                   "additionalProperties": True}),   # with schema-free fragments
    cd.Regex(r'(a[^"]{3,}")+'),                      # an unbounded chain in a loop
    cd.JsonSchema({"type": "array", "items": {"type": "string", "minLength": 5}}),
]


@pytest.mark.parametrize("spec", _SPECS, ids=lambda s: s.describe()[:50])
def test_embedded_chains_equal_plain_composition(spec, compilers, vocab):
  counted_compiler, plain_compiler = compilers
  counted = counted_compiler.compile(spec)
  plain = plain_compiler.compile(spec)
  assert counted.token_counts.shape[0] >= 1, "the embedded-chain path was not taken"
  assert plain.token_counts.shape[0] == 0
  ref.assert_same_walks(counted, plain, vocab.eos_ids, walks=120, max_steps=70)


def test_two_chains_match_re(compilers, vocab):
  pattern = r"x[a-z]{0,20}Y[a-z]{3,30}Z"
  tables = compilers[0].compile(cd.Regex(pattern))
  index = ref.TokenIndex(vocab)
  rng = random.Random(7)
  for n1 in (0, 1, 19, 20, 21):
    for n2 in (2, 3, 29, 30, 31):
      for _ in range(2):
        text = ("x" + "".join(rng.choice("abcxyz") for _ in range(n1)) + "Y"
                + "".join(rng.choice("abcxyz") for _ in range(n2)) + "Z")
        tokens = index.random_tokenization(text.encode(), rng)
        assert ref.reference_accepts(tables, tokens) == bool(re.fullmatch(pattern, text))


_UNITS = ["a", "b", " ", "ä", "中", "\\n", '\\"', "\\u00e4", "\\\\"]


def test_object_string_lengths_match_jsonschema(compilers, vocab):
  tables = compilers[0].compile(cd.JsonSchema(_OBJECT))
  validator = jsonschema.Draft202012Validator(_OBJECT)
  index = ref.TokenIndex(vocab)
  rng = random.Random(3)
  for _ in range(150):
    value = {}
    for key, high in (("a", 20), ("c", 9), ("d", 14)):
      if key == "a" or rng.random() < 0.6:
        value[key] = json.loads('"' + "".join(rng.choice(_UNITS)
                                              for _ in range(rng.randint(0, high + 2))) + '"')
    if rng.random() < 0.5:
      value["b"] = rng.randint(-5, 500)
    keys = list(value)
    rng.shuffle(keys)
    text = json.dumps({k: value[k] for k in keys}, ensure_ascii=False, separators=(",", ":"))
    tokens = index.random_tokenization(text.encode(), rng)
    assert ref.reference_accepts(tables, tokens) == validator.is_valid(value), text


def test_device_step_agrees_with_reference(compilers, vocab):
  tables = compilers[0].compile(cd.JsonSchema(_OBJECT))
  index = ref.TokenIndex(vocab)
  rng = random.Random(0)
  step = jax.jit(cd.advance)
  for text in ['{"c":"ab","a":"' + "x" * 20 + '"}', '{"a":"' + "y" * 21 + '"}',
               '{"b":7,"a":"\\u00e4\\n"}', '{"d":"' + "abc" * 9 + '","a":""}',
               '{"a":"","d":"\\n\\u00e4b"}']:
    tokens = index.random_tokenization(text.encode(), rng)
    # The object's keys are checked in register words (its copies are past the any-order
    # budget): the reference is asked with the registers of the walk so far.
    states, ok = ref.reference_walk(tables, tokens, with_stacks=True)
    state = cd.init_state(tables, batch_size=1)
    registers = ref.zero_registers(tables)
    for token, expected in zip(tokens, states):
      allowed = np.asarray(cd.allowed_tokens(tables, state))[0]
      np.testing.assert_array_equal(
          allowed, ref.reference_allowed(tables, int(state.state[0]), (), registers))
      state = step(tables, state, np.array([token], np.int32))
      assert int(state.state[0]) == expected[0]
      registers = expected[2] if len(expected) > 2 else registers
    assert ok == validate_text(text)


def validate_text(text: str) -> bool:
  return jsonschema.Draft202012Validator(_OBJECT).is_valid(json.loads(text))


def test_gemma_nested_max_length_is_small_and_exact(gemma_compiler, gemma_vocab):
  """`maxLength` 200 inside an object used to need ~50M token edges (over budget)."""
  schema = {"type": "object", "properties": {
      "subject": {"type": "string", "maxLength": 200},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}}},
      "required": ["subject"]}
  tables, info = gemma_compiler.compile_with_info(cd.JsonSchema(schema))
  assert tables.token_counts.shape[0] >= 1
  assert info.nbytes["total"] <= 64 << 20
  validator = jsonschema.Draft202012Validator(schema)
  index = ref.TokenIndex(gemma_vocab)
  rng = random.Random(1)
  for n in (0, 1, 150, 199, 200, 201):
    for tags in ([], ["x" * 40], ["y" * 41, "z"]):
      value = {"subject": "".join(rng.choice("ab cä中") for _ in range(n)), "tags": tags}
      text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
      tokens = index.random_tokenization(text.encode(), rng)
      assert ref.reference_accepts(tables, tokens) == validator.is_valid(value), (n, tags)


def test_gemma_nested_min_length_is_small_and_exact(gemma_compiler, gemma_vocab):
  """`minLength` alone inside an object (a password of at least 8 characters) used to
  cost 68 MiB and a second: now the unbounded chain's strip (`_counting.py`)."""
  schema = {"type": "object", "properties": {
      "user": {"type": "string", "minLength": 3},
      "password": {"type": "string", "minLength": 8, "maxLength": 64}},
      "required": ["user", "password"]}
  tables, info = gemma_compiler.compile_with_info(cd.JsonSchema(schema))
  assert tables.token_counts.shape[0] >= 1
  assert info.nbytes["total"] <= 32 << 20
  validator = jsonschema.Draft202012Validator(schema)
  index = ref.TokenIndex(gemma_vocab)
  rng = random.Random(2)
  for n in (0, 2, 3, 7, 8, 64, 65, 400):
    value = {"user": "u" * n + " " * (n // 2), "password": "".join(
        rng.choice(["ab", " ", "ä", "中", "\\n", "    "]) for _ in range(n))}
    value["password"] = json.loads('"' + value["password"] + '"')
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    tokens = index.random_tokenization(text.encode(), rng)
    assert ref.reference_accepts(tables, tokens) == validator.is_valid(value), (n, text)


def test_wide_state_search_stops_at_the_deadline(gemma_compiler):
  """The search for wide states checks the compile deadline (a 90 s overrun before)."""
  from constrained_decoding.automata import _fsa  # pylint: disable=g-import-not-at-top

  compiler = gemma_compiler
  dfa = _fsa.compile_byte_dfa(cd.JsonSchema({"type": "object", "properties": {
      "a": {"type": "string"}, "b": {"type": "string"}}}).to_ir())
  assert compiler.wide_states.find(dfa)  # String bodies are wide loops.
  with pytest.raises(cd.CompileBudgetError,
                     match="The schema exceeded its compile time budget while finding wide "
                           "states. Raise CompileOptions.max_seconds"):
    compiler.wide_states.find(dfa, deadline=0.0, what="The schema")


def test_ambiguous_repetition_stops_determinizing_with_its_message(compilers):
  with pytest.raises(cd.CompileBudgetError,
                     match=r"Determinizing the byte automaton needs more than 100000 states "
                           r"\(an ambiguous bounded repetition"):
    compilers[0].compile(cd.Regex("(a|b)*a(a|b){20}"))


def _random_ir(rng: random.Random, depth: int, shared: list):
  """A random IR tree over a few byte strings, with repeats, fragments and shared
  sub-trees (`shared`: nodes made so far, reused by identity)."""
  from constrained_decoding.constraints import _ir as ir  # pylint: disable=g-import-not-at-top

  kind = rng.randrange(6) if depth else 0
  if kind == 5 and shared:
    return rng.choice(shared)
  if kind == 0:
    node = ir.Bytes(rng.choice([b"a", b"bc", b"d"]))
  elif kind == 1:
    node = ir.concat(*[_random_ir(rng, depth - 1, shared) for _ in range(rng.randint(2, 3))])
  elif kind == 2:
    node = ir.union(*[_random_ir(rng, depth - 1, shared) for _ in range(rng.randint(2, 3))])
  elif kind == 3:
    low = rng.randint(0, 2)
    node = ir.repeat(_random_ir(rng, depth - 1, shared), low, low + rng.randint(1, 3))
  else:
    node = ir.Fragment(f"f{rng.randrange(3)}", _random_ir(rng, depth - 1, shared))
  shared.append(node)
  return node


def test_chain_search_visits_what_the_rewrite_visits_up_to_the_first_found():
  """`extract`'s search before rewriting (`_any_node`): True exactly when the transform
  finds a node, and the same nodes in the same order up to the first found one (fragment
  names are numbered in that order)."""
  from constrained_decoding.automata import _embedded_chains  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _ir as ir  # pylint: disable=g-import-not-at-top

  rng = random.Random(5)
  for _ in range(300):
    node = _random_ir(rng, rng.randint(1, 5), [])
    wanted = rng.choice([2, 3, 4])
    found = lambda n, wanted=wanted: (  # noqa: E731
        ir.Bytes(b"!") if isinstance(n, ir.Repeat) and n.max == wanted else None)
    by_transform, by_search = [], []

    def record(n, into, found=found):
      into.append(n)
      return found(n)

    ir.transform(node, before=lambda n: record(n, by_transform))
    hit = _embedded_chains._any_node(node, lambda n: record(n, by_search))  # pylint: disable=protected-access
    firsts = [k for k, n in enumerate(by_transform) if found(n) is not None]
    assert hit == bool(firsts)
    want = by_transform[:firsts[0] + 1] if firsts else by_transform
    assert [id(n) for n in by_search] == [id(n) for n in want]
    # Told the kinds `found` can hit, the search asks it about those alone, in order.
    by_kind = []
    assert _embedded_chains._any_node(  # pylint: disable=protected-access
        node, lambda n: record(n, by_kind), (ir.Repeat,)) == hit
    assert [id(n) for n in by_kind] == [id(n) for n in want if isinstance(n, ir.Repeat)]


def test_edge_spans_are_the_concatenated_slices():
  from constrained_decoding.automata import _embedded_chains  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(3)
  for _ in range(100):
    n = int(rng.integers(0, 30))
    lo = rng.integers(0, 50, size=n).astype(np.int32)  # int32, as searchsorted may give
    hi = lo + rng.integers(0, 4, size=n)
    want = [i for a, b in zip(lo.tolist(), hi.tolist()) for i in range(a, b)]
    got = _embedded_chains._spans(lo, hi)  # pylint: disable=protected-access
    assert got.dtype == np.int64 and got.tolist() == want


def test_counting_bitmaps_kept_for_the_vocabulary_give_the_same_tables(compilers):
  """The finishing / inside-X token bitmaps of a chain's escapes are kept with the class
  counts (per vocabulary) after the first compile: a compile that reuses them builds the
  tables a compile that makes them does, and they are read only (shared)."""
  from constrained_decoding.automata import _counting  # pylint: disable=g-import-not-at-top

  counted, _ = compilers
  spec = cd.JsonSchema(_OBJECT)  # JSON string chains: escapes under way (inner states).
  _counting._CLASS_CACHE.clear()  # pylint: disable=protected-access
  fresh = counted.compile(spec)
  kept = [bits for counts in _counting._CLASS_CACHE.values()  # pylint: disable=protected-access
          for pieces in counts.inner.values() if isinstance(pieces, dict)
          for bits in pieces.get("bits", {}).values()]
  assert kept, "no escape bitmaps were kept"
  assert not any(bits.flags.writeable for bits in kept)
  again = counted.compile(spec)
  for field in dataclasses.fields(fresh):
    a, b = np.asarray(getattr(fresh, field.name)), np.asarray(getattr(again, field.name))
    assert a.dtype == b.dtype and np.array_equal(a, b), field.name

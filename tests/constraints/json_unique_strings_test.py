"""Arrays of distinct strings (`uniqueItems` with string items), checked on the device.

Oracles: `jsonschema` on the decoded array; the byte language against the exact
register-aware `ByteDfa.accepts` (it compares item bytes, not hashes); the device mask
against `testing.reference_allowed` (guards and hashes evaluated with Python integers
by `tables.apply_guard`); the device's modular arithmetic against Python integers.
Texts are canonical JSON (`json.dumps(..., ensure_ascii=False)`, compact), the one
spelling the constraint writes (`docs/unique_items.md`, "Narrowings").
"""

import itertools
import json
import random

import hypothesis
import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata import _unique_strings
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.runtime import _guards
from constrained_decoding.tables import HASH_PRIME
from constrained_decoding.testing import TokenIndex, reference_allowed, reference_step_stack

STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
TAGS = {"type": "array", "items": {"type": "string", "pattern": "^[^,]+$"},
        "uniqueItems": True, "minItems": 1, "maxItems": 4}
NESTED = {"type": "object", "required": ["tags"], "additionalProperties": False,
          "properties": {"tags": STRINGS, "n": {"type": "integer"},
                         "more": {"type": "array", "items": TAGS}}}
SCHEMAS = {"strings": STRINGS, "tags": TAGS, "nested": NESTED}
# Pieces of items: escapes, quotes, commas, non-ASCII, a separator look-alike.
PIECES = ["a", "b", "ab", " ", '"', "\\", "\n", "\t", "\x01", "é", "日本", "😀", "/", ",",
          "]", "[", "\u2028", '","', "the"]
_items = st.lists(st.sampled_from(PIECES), max_size=3).map("".join)


def _text(value) -> bytes:
  return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _valid(schema, value) -> bool:
  return jsonschema.Draft202012Validator(schema).is_valid(value)


@pytest.fixture(scope="module")
def gemma_tables(gemma_compiler):
  return {name: gemma_compiler.compile(cd.JsonSchema(schema)) for name, schema in
          SCHEMAS.items()}


@pytest.fixture(scope="module")
def gemma_index(gemma_vocab):
  """Random tokenizations without the tokens that may finish two items at once (three
  quotes or more: `","",`), which the tables refuse (a narrowing, tested below)."""
  index = TokenIndex(gemma_vocab)
  index.by_bytes = {b: ids for b, ids in index.by_bytes.items() if b.count(b'"') < 3}
  return index


@jax.jit
def _device_walk(tables, tokens, lengths, eos):
  """Feeds each row its tokens (`[B, L]`, the first `lengths` of them), then end of
  sequence: whether each row ends `done` without `error`."""
  state = cd.init_state(tables, tokens.shape[0])

  def step(state, i):
    moved = cd.advance(tables, state, tokens[:, i])
    active = i < lengths
    return jax.tree.map(lambda a, b: jnp.where(
        active.reshape(active.shape + (1,) * (a.ndim - 1)), a, b), moved, state), None

  state, _ = jax.lax.scan(step, state, jnp.arange(tokens.shape[1]))
  state = cd.advance(tables, state, jnp.full(tokens.shape[0], eos, jnp.int32))
  return state.done & ~state.error


def _walk_many(tables, token_lists, eos) -> np.ndarray:
  width = 64 * -(-max(map(len, token_lists)) // 64)  # Few shapes: few compilations.
  tokens = np.zeros((len(token_lists), width), np.int32)
  for row, ids in enumerate(token_lists):
    tokens[row, :len(ids)] = ids
  lengths = np.array([len(ids) for ids in token_lists], np.int32)
  return np.asarray(_device_walk(tables, tokens, lengths, eos))


# ---- Byte language: exact, against jsonschema. ----


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(name=st.sampled_from(sorted(SCHEMAS)), items=st.lists(_items, max_size=6),
                  data=st.data())
def test_byte_language_agrees_with_jsonschema(name, items, data):
  if name == "nested":
    value = {"tags": items, **data.draw(st.sampled_from([{}, {"more": [items[:2]]}]))}
  else:
    value = items
  dfa = _byte_dfa(name)
  assert dfa.accepts(_text(value)) == _valid(SCHEMAS[name], value), value


_DFAS = {}


def _byte_dfa(name):
  if name not in _DFAS:
    _DFAS[name] = compile_byte_dfa(cd.JsonSchema(SCHEMAS[name]).to_ir())
  return _DFAS[name]


def test_one_spelling_per_string():
  dfa = _byte_dfa("strings")
  assert dfa.accepts(b'["\\\\","\\"","\\n","\\u0001"]')
  # Other spellings of valid arrays are not written (a narrowing): with them, equal
  # strings would have different bytes.
  for text in [b'["\\u0041"]', b'["\\/"]', b'["\\u000a"]', b'["a","\\u0061"]']:
    assert _valid(STRINGS, json.loads(text)) != (b"\\u0061" in text)
    assert not dfa.accepts(text), text


# ---- Device: random tokenizations of the Gemma 3 vocabulary. ----


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(name=st.sampled_from(sorted(SCHEMAS)),
                  items=st.lists(st.one_of(_items, st.sampled_from(["a", "b", "\n"])),
                                 max_size=6),
                  seed=st.integers(0, 2**32 - 1))
def test_device_accepts_what_jsonschema_accepts(gemma_tables, gemma_vocab, gemma_index,
                                                name, items, seed):
  value = {"tags": items} if name == "nested" else items
  rng = random.Random(seed)
  text = _text(value)
  tokenizations = [gemma_index.random_tokenization(text, rng) for _ in range(4)]
  accepted = _walk_many(gemma_tables[name], tokenizations, gemma_vocab.eos_ids[0])
  assert accepted.tolist() == [_valid(SCHEMAS[name], value)] * 4, (value, tokenizations)


def test_device_mask_matches_reference_and_refuses_repeats(gemma_tables, gemma_vocab,
                                                           gemma_index):
  """Along tokenizations of arrays with repeats, the device's allowed sets equal the
  reference's at every step, and the token finishing the first repeat is refused."""
  tables = gemma_tables["strings"]
  allowed = jax.jit(cd.allowed_tokens)
  advance = jax.jit(cd.advance)
  rng = random.Random(0)
  refused = 0
  for value in [["a", "b", "a"], ["x\n", "é", "x\n"], ["", ""], ["ab", "a", "b", "ab"]]:
    ids = gemma_index.random_tokenization(_text(value), rng)
    state = cd.init_state(tables, 1)
    ref = (int(tables.start[0]), (), tuple(int(x) for x in tables.register_init))
    for token in ids:
      mask = np.asarray(allowed(tables, state))[0]
      expected = reference_allowed(tables, ref[0], ref[1], registers=ref[2])
      np.testing.assert_array_equal(mask, expected)
      if not mask[token]:
        refused += 1
        break
      state = advance(tables, state, jnp.array([token], jnp.int32))
      ref = reference_step_stack(tables, ref[0], ref[1], token, registers=ref[2])
      assert tuple(np.asarray(state.registers[0]).tolist()) == ref[2]
  assert refused == 4


def test_random_walks_write_valid_arrays(gemma_tables, gemma_vocab):
  """Tokens drawn among the allowed ones (half the time among those holding a quote,
  comma or bracket, so that items end) only ever make valid arrays."""
  vocab_bytes = gemma_vocab.token_bytes
  structural = np.array([bool(b) and any(c in b for c in b'",]') for b in vocab_bytes]
                        + [False] * (gemma_vocab.vocab_size - len(vocab_bytes)))
  allowed = jax.jit(cd.allowed_tokens)
  advance = jax.jit(cd.advance)
  rng = np.random.default_rng(0)
  for name in ("strings", "tags"):
    tables = gemma_tables[name]
    finished = 0
    for _ in range(12):
      state, text = cd.init_state(tables, 1), b""
      for _ in range(60):
        mask = np.array(allowed(tables, state))[0]
        ends = mask[list(gemma_vocab.eos_ids)].any()
        mask[list(gemma_vocab.eos_ids)] = False
        if ends and (rng.random() < 0.3 or not mask.any()):
          finished += 1
          value = json.loads(text)
          assert _valid(SCHEMAS[name], value), text
          break
        pool = np.flatnonzero(mask & structural) if rng.random() < 0.5 else []
        token = int(rng.choice(pool if len(pool) else np.flatnonzero(mask)))
        state = advance(tables, state, jnp.array([token], jnp.int32))
        assert not bool(state.error[0])
        text += vocab_bytes[token]
    assert finished >= 4, name


def test_a_token_finishing_two_items_is_refused(gemma_tables, gemma_vocab):
  """`","",` would finish the item being written and a whole empty one: refused, while
  the same text stays reachable through other tokens (a documented narrowing)."""
  tables = gemma_tables["strings"]
  ids = {b: i for i, b in enumerate(gemma_vocab.token_bytes) if b}
  two = ids[b'","",']
  start = [ids[b'["'], ids[b"a"]]
  state = cd.init_state(tables, 1)
  for token in start:
    state = cd.advance(tables, state, jnp.array([token], jnp.int32))
  mask = np.asarray(cd.allowed_tokens(tables, state))[0]
  assert not mask[two] and mask[ids[b'","']]
  other = start + [ids[b'","'], ids[b'",'], ids[b'"'], ids[b"b"], ids[b'"]']]  # ["a","","b"]
  repeated = start + [ids[b'","'], ids[b'",'], ids[b'"'], ids[b'"]']]  # ["a","",""]
  assert _walk_many(tables, [other, repeated], gemma_vocab.eos_ids[0]).tolist() == [
      True, False]


# ---- Counts, stacking, errors. ----


def test_item_counts_and_capacity(byte_compiler, byte_vocab):
  index = TokenIndex(byte_vocab)
  rng = random.Random(1)
  for bounds in [{"minItems": 2, "maxItems": 3}, {}]:
    schema = {**STRINGS, **bounds}
    tables = byte_compiler.compile(cd.JsonSchema(schema))
    values = [[f"s{i}" for i in range(n)] for n in (0, 1, 2, 3, 4, 32, 33)]
    got = _walk_many(tables, [index.random_tokenization(_text(v), rng) for v in values],
                     byte_vocab.eos_ids[0])
    # Without maxItems a row keeps 32 strings (a narrowing: 33 distinct ones are valid).
    expected = [_valid(schema, v) and len(v) <= 32 for v in values]
    assert got.tolist() == expected, bounds


def test_stacked_with_other_tables(byte_compiler, byte_vocab):
  index = TokenIndex(byte_vocab)
  parts = [byte_compiler.compile(cd.JsonSchema(s)) for s in
           ({"type": "integer"}, STRINGS, TAGS)]
  stacked = cd.stack_tables(parts)
  texts = [b"12", b'["a","b"]', b'["a","a"]', b'["x,y"]', b'["x","y"]']
  ids = jnp.array([0, 1, 1, 2, 2], jnp.int32)
  rows = [index.longest_tokenization(t) for t in texts]
  width = max(map(len, rows))
  tokens = np.zeros((len(rows), width), np.int32)
  for r, row in enumerate(rows):
    tokens[r, :len(row)] = row
  state = cd.init_state(stacked, constraint_ids=ids)
  for i in range(width):
    active = jnp.array([i < len(r) for r in rows])
    moved = cd.advance(stacked, state, jnp.asarray(tokens[:, i]))
    state = jax.tree.map(lambda a, b: jnp.where(
        active.reshape(active.shape + (1,) * (a.ndim - 1)), a, b), moved, state)
  state = cd.advance(stacked, state, jnp.full(len(rows), byte_vocab.eos_ids[0], jnp.int32))
  assert (state.done & ~state.error).tolist() == [True, True, False, False, True]


def test_saved_tables_keep_their_hashes(byte_compiler, byte_vocab, tmp_path):
  tables = byte_compiler.compile(cd.JsonSchema(TAGS))
  tables.save(tmp_path / "t.cdt", vocab=byte_vocab)
  loaded = cd.load_tables(tmp_path / "t.cdt", vocab=byte_vocab)
  assert loaded.has_hashes and loaded.shape_key == tables.shape_key
  index = TokenIndex(byte_vocab)
  rows = [index.longest_tokenization(t) for t in (b'["x","y"]', b'["x","x"]', b'["x,y"]')]
  assert _walk_many(loaded, rows, byte_vocab.eos_ids[0]).tolist() == [True, False, False]


@pytest.mark.parametrize("policy", ["single", "flexible"])
def test_whitespace_policies(policy):
  dfa = compile_byte_dfa(cd.JsonSchema(STRINGS, policy).to_ir())
  separators = (", ", ": ") if policy == "single" else (" ,  ", ":")
  for value in [["a", "b"], ["a", "a"], ["a", "b", "a"], [], ["a,", "a"]]:
    text = json.dumps(value, ensure_ascii=False, separators=separators).encode()
    if policy == "flexible":
      text = text.replace(b"[", b"[ ").replace(b"]", b"\n]") if value else text
    assert dfa.accepts(text) == _valid(STRINGS, value), text


# (Inside a recursive schema they compile since issue 14: `json_registers_pda_test.py`.)
@pytest.mark.parametrize("schema, message", [
    ({**STRINGS, "maxItems": 100},
     r"uniqueItems at #/uniqueItems: maxItems at #/maxItems allows 100 distinct strings"),
    ({"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": True},
     r"uniqueItems at #/uniqueItems: its string items can be finished in only finitely"),
    ({"type": "array", "items": {"type": ["string", "integer"]}, "uniqueItems": True},
     r"uniqueItems at #/uniqueItems needs items with at most 8 possible values.* or string"
     r" items"),
])
def test_refusals_name_the_place_and_the_reason(schema, message):
  with pytest.raises(cd.UnsupportedSchemaError, match=message):
    cd.JsonSchema(schema).to_ir()
  lenient = cd.JsonSchema(schema, lenient=("uniqueItems",))
  assert any(k.endswith("uniqueItems") for k in lenient.ignored_keywords())


def test_modular_arithmetic_matches_python_integers():
  rng = np.random.default_rng(0)
  edges = [0, 1, 2, 0x7FFF, 0xFFFF, 0x10000, 1 << 30, HASH_PRIME - 1]
  values = np.concatenate([rng.integers(0, HASH_PRIME, (20_000, 3)),
                           np.array(list(itertools.product(edges, repeat=3)))])
  h, m, a = values.T
  got = jax.jit(_guards.mul_add_mod)(*(jnp.asarray(x, jnp.uint32) for x in (h, m, a)))
  expected = [(int(x) * int(y) + int(z)) % HASH_PRIME for x, y, z in values]
  assert np.asarray(got).astype(np.int64).tolist() == expected


def test_token_hashes_compose():
  """hash(xy) = hash(x) * B^|y| + hash(y): what lets a token's hash split anywhere."""
  token_bytes = [b"ab", "日本\"".encode(), b"ab" + "日本\"".encode(), None]
  table = _unique_strings.token_hash(token_bytes).astype(object)
  assert table[3].tolist() == [1, 0, 1, 0]
  for w in (0, 1):
    m, a = table[:, 2 * w], table[:, 2 * w + 1]
    assert (a[0] * m[1] + a[1]) % HASH_PRIME == a[2]
    assert list(table[2]) == list(_unique_strings.hash_of(token_bytes[2]))


def test_alternatives_whose_arrays_differ_are_refused(byte_compiler):
  """anyOf objects read in step, one with distinct strings and one without: the markers
  cannot be folded, and the compiler's fallback refuses (never a wrong answer)."""
  plain = {"type": "array", "items": {"type": "string"}}
  schema = {"anyOf": [{"type": "object", "properties": {"t": STRINGS}, "required": ["t"]},
                      {"type": "object", "properties": {"t": plain, "u": {"type": "null"}},
                       "required": ["t", "u"]}]}
  with pytest.raises(cd.UnsupportedSchemaError, match=r"alike in every alternative"):
    byte_compiler.compile(cd.JsonSchema(schema))
  same = {"anyOf": [{"type": "object", "properties": {"t": STRINGS, "a": {"const": 1}},
                     "required": ["a"]},
                    {"type": "object", "properties": {"t": STRINGS, "b": {"const": 2}},
                     "required": ["b"]}]}
  dfa = compile_byte_dfa(cd.JsonSchema(same).to_ir())
  for value in [{"a": 1, "t": ["x", "y"]}, {"t": ["x", "x"], "b": 2}, {"b": 2, "t": []}]:
    assert dfa.accepts(_text(value)) == _valid(same, value), value

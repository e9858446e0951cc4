"""Arrays and objects whose items and members the device counts in a register.

`minItems`/`maxItems` of large items (objects) would write the item once per position,
and `minProperties`/`maxProperties` the members once per count; instead they are
written once and a register word counts the commas: `count` before `,` (fails when the
array or object is full), `atleast` before `]`/`}` (fails below the minimum).
Oracles: `jsonschema` on the byte language and on random tokenizations; the jitted
device step against `testing.reference_*` (guards evaluated independently), on random
walks that are pushed to fill arrays up to `maxItems`.
"""

import json
import random

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.testing import TokenIndex, reference_accepts, reference_allowed
from constrained_decoding.testing import reference_step_stack

ITEM = {"type": "object", "required": ["a"], "additionalProperties": False,
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
                       "c": {"enum": ["x", "yy"]}, "d": {"type": "null"},
                       "e": {"type": "string", "maxLength": 3}}}
SCHEMAS = {
    "bounded": {"type": "array", "items": ITEM, "minItems": 2, "maxItems": 7},
    "at_most": {"type": "array", "items": ITEM, "maxItems": 6},
    "at_least": {"type": "array", "items": ITEM, "minItems": 30},
    # Two arrays of one schema share their word; a third, different, gets its own.
    "nested": {"type": "object", "additionalProperties": False,
               "properties": {"p": {"type": "array", "items": ITEM, "maxItems": 5},
                              "q": {"type": "array", "items": ITEM, "maxItems": 5},
                              "r": {"type": "array", "maxItems": 4, "items": {
                                  "type": "array", "items": ITEM, "maxItems": 4}}}},
}
# (minItems, maxItems) of the top-level arrays; `at_least` has no maxItems.
LIMITS = {"bounded": (2, 7), "at_most": (0, 6), "at_least": (30, 10**9)}
# Objects: keys matching a pattern (CloudFormation's Outputs: maxProperties 200) and a
# closed object with a minimum and a maximum.
MEMBERS = {"pattern": {"type": "object", "maxProperties": 6, "additionalProperties": False,
                       "patternProperties": {"^k[0-9]+$": ITEM}},
           "closed": {"type": "object", "minProperties": 3, "maxProperties": 5,
                      "additionalProperties": False,
                      "properties": {f"p{i}": ITEM for i in range(8)}}}


def _vocab(seed: int = 0) -> cd.Vocabulary:
  """Every byte, plus random strings over the schemas' alphabet and tokens that cross
  item ends, commas and brackets."""
  rng = random.Random(seed)
  tokens = [bytes([b]) for b in range(256)]
  alphabet = sorted(set('{"a":1,"b":true,"c":"yy","d":null}[], pqr'))
  tokens += ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5))).encode()
             for _ in range(400)]
  tokens += [b'},{"a":', b'}]', b'},{', b'[{"a":', b'1}', b'1},', b'}],"', b'[]', b'],[',
             b'null}', b'true},{']
  tokens = list(dict.fromkeys(tokens))
  return cd.Vocabulary.from_token_bytes(tokens + [b""], eos_ids=[len(tokens)])


VOCAB = _vocab()
INDEX = TokenIndex(VOCAB)


@pytest.fixture(scope="module")
def compiled():
  compiler = cd.Compiler(VOCAB)
  return {name: compiler.compile(cd.JsonSchema(schema)) for name, schema in SCHEMAS.items()}


def _item(rng: random.Random, broken: float = 0.0) -> dict:
  """A random item, invalid (without `a`) with probability `broken`."""
  out = {}
  if rng.random() >= broken:
    out["a"] = rng.randint(0, 99)
  if rng.random() < 0.4:
    out["b"] = rng.random() < 0.5
  if rng.random() < 0.3:
    out["c"] = rng.choice(["x", "yy"])
  if rng.random() < 0.2:
    out["e"] = rng.choice(["", "x", "xyz"])
  return out


def _top(lo: int, hi: int) -> int:
  """The longest array length drawn: past maxItems, or a few past minItems without it."""
  return hi + 2 if hi < 10**9 else lo + 4


def _array_texts(lo: int, hi: int, rng: random.Random, n: int) -> list[bytes]:
  out = []
  for _ in range(n):
    size = rng.randint(max(0, lo - 2), _top(lo, hi))
    broken = 0.02 if rng.random() < 0.3 else 0.0
    out.append(json.dumps([_item(rng, broken) for _ in range(size)],
                          separators=(",", ":")).encode())
  return out


def _valid(schema, text: bytes) -> bool:
  return jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))


def test_large_items_are_counted_in_one_register_word_per_distinct_array():
  dfa = compile_byte_dfa(cd.JsonSchema(SCHEMAS["bounded"]).to_ir())
  assert {m.kind for m in dfa.markers} >= {"clear", "count", "atleast"}
  nested = compile_byte_dfa(cd.JsonSchema(SCHEMAS["nested"]).to_ir())
  counted_words = {m.word for m in nested.markers if m.kind == "count"}
  assert len(counted_words) == 3  # p and q share one; r and its items have one each.
  small = {"type": "array", "items": {"type": "integer"}, "maxItems": 5}
  assert not len(compile_byte_dfa(cd.JsonSchema(small).to_ir()).marker_arcs)
  bounded = cd.JsonSchema(SCHEMAS["bounded"], property_order="any_bounded").to_ir()
  assert not len(compile_byte_dfa(bounded).marker_arcs)  # Registers off: copies.


@pytest.mark.parametrize("whitespace", ["compact", "single", "flexible"])
@pytest.mark.parametrize("name", sorted(LIMITS))
def test_byte_language_matches_jsonschema_for_every_length(name, whitespace):
  schema = SCHEMAS[name]
  walker = compile_byte_dfa(cd.JsonSchema(schema, whitespace).to_ir())
  rng = random.Random(f"{name}-{whitespace}")
  lo, hi = LIMITS[name]
  separators = {"compact": (",", ":"), "single": (", ", ": "), "flexible": (" ,\n", ":")}
  for size in range(max(0, lo - 2), _top(lo, hi) + 1):
    value = [_item(rng) for _ in range(size)]
    text = json.dumps(value, separators=separators[whitespace]).encode()
    if whitespace == "flexible":
      text = text.replace(b"[", b"[ ", 1)
    assert walker.accepts(text) == (lo <= size <= hi), (size, text)
    if size:
      value[rng.randrange(size)].pop("a")  # An invalid item: rejected at any length.
      assert not walker.accepts(json.dumps(value, separators=separators[whitespace]).encode())


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_tokenized_texts_are_accepted_exactly_when_valid(name, compiled):
  schema, tables = SCHEMAS[name], compiled[name]
  assert tables.has_registers
  rng = random.Random(f"tok-{name}")
  verdicts = set()
  for text in _array_texts(*LIMITS[name], rng, 40):
    want = _valid(schema, text)
    verdicts.add(want)
    assert reference_accepts(tables, INDEX.random_tokenization(text, rng)) == want, text
  assert verdicts == {True, False}


def test_nested_counted_arrays_count_separately(compiled):
  schema, tables = SCHEMAS["nested"], compiled["nested"]
  rng = random.Random("nested")
  item = {"a": 1}
  cases = [{"p": [item] * 5, "q": [item] * 5}, {"p": [item] * 6}, {"q": [item] * 6},
           {"r": [[item] * 4] * 4}, {"r": [[item] * 5]}, {"r": [[item]] * 5},
           {"p": [item] * 3, "r": [[item] * 2, [item] * 4], "q": [item] * 5}]
  for value in cases:
    text = json.dumps(value, separators=(",", ":")).encode()
    want = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert reference_accepts(tables, INDEX.random_tokenization(text, rng)) == want, text


@pytest.mark.parametrize("name", ["bounded", "nested"])
def test_device_walks_fill_arrays_without_dead_ends(name, compiled):
  """Random walks over the device's allowed tokens that prefer commas (so arrays fill
  up to maxItems): the mask equals the reference's, no row errs or has nothing
  allowed, finished texts are valid."""
  schema, tables = SCHEMAS[name], compiled[name]
  batch, eos = 6, VOCAB.eos_ids[0]
  rng = random.Random(f"walk-{name}")
  allowed_fn, advance_fn = jax.jit(cd.allowed_tokens), jax.jit(cd.advance)
  state = cd.init_state(tables, batch)
  texts, finished = [b""] * batch, [None] * batch
  positions = [(int(tables.start[0]), ())] * batch
  registers = [(0,) * tables.register_init.shape[0]] * batch
  for step in range(160):
    allowed = np.asarray(allowed_fn(tables, state))
    chosen = []
    for r in range(batch):
      if finished[r] is None and step % 2 == 0:
        want = reference_allowed(tables, *positions[r], registers=registers[r])
        want[eos] = allowed[r, eos]
        np.testing.assert_array_equal(allowed[r], want)
      ids = np.flatnonzero(allowed[r])
      assert len(ids), texts[r]
      if finished[r] is None and allowed[r, eos] and (rng.random() < 0.3 or step > 130
                                                      or len(ids) == 1):
        finished[r] = texts[r]
      if finished[r] is not None:
        chosen.append(eos)
        continue
      ids = [t for t in ids if t != eos]
      commas = [t for t in ids if b"," in VOCAB.token_bytes[t]]
      token = int(rng.choice(commas if commas and rng.random() < 0.8 else ids))
      chosen.append(token)
      texts[r] += VOCAB.token_bytes[token]
      *positions[r], registers[r] = reference_step_stack(tables, *positions[r], token,
                                                         registers[r])
    state = advance_fn(tables, state, jnp.asarray(chosen, jnp.int32))
    assert not np.asarray(state.error).any()
  done = [f for f in finished if f is not None]
  assert done, texts
  for text in done:
    assert _valid(schema, text), text
  assert max(_longest_array(json.loads(t)) for t in done) == WALK_FULL[name], done


WALK_FULL = {"bounded": 7, "nested": 5}  # The longest array the schema allows.


def _longest_array(value) -> int:
  if isinstance(value, list):
    return max([len(value), *map(_longest_array, value)])
  if isinstance(value, dict):
    return max([0, *map(_longest_array, value.values())])
  return 0


def _object_text(keys: list, rng: random.Random) -> bytes:
  return ("{" + ",".join(f'"{k}":' + json.dumps(_item(rng), separators=(",", ":"))
                         for k in keys) + "}").encode()


def _members_valid(schema, text: bytes) -> bool:
  """Valid for `schema`, and no key twice (the language never repeats a declared key;
  a repeated additional key counts twice towards maxProperties: a documented narrowing,
  so the texts drawn here repeat none)."""
  pairs = json.loads(text, object_pairs_hook=lambda p: p)
  keys = [k for k, _ in pairs]
  return len(set(keys)) == len(keys) and jsonschema.Draft202012Validator(schema).is_valid(
      json.loads(text))


def _member_keys(name: str, rng: random.Random) -> list:
  if name == "pattern":
    keys = [f"k{i}" for i in rng.sample(range(40), rng.randint(0, 9))]
    if keys and rng.random() < 0.1:
      keys[-1] = "x"  # Matches no pattern.
    return keys
  keys = rng.sample([f"p{i}" for i in range(8)], rng.randint(0, 8))
  if keys and rng.random() < 0.2:
    keys.append(keys[0])
  return keys


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_counted_objects_match_jsonschema(name):
  schema = MEMBERS[name]
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  assert "count" in {m.kind for m in dfa.markers}
  rng = random.Random(f"members-{name}")
  verdicts = set()
  for _ in range(200):
    text = _object_text(_member_keys(name, rng), rng)
    want = _members_valid(schema, text)
    verdicts.add(want)
    assert dfa.accepts(text) == want, text
  assert verdicts == {True, False}


@pytest.fixture(scope="module")
def compiled_members():
  compiler = cd.Compiler(VOCAB)
  return {name: compiler.compile(cd.JsonSchema(schema)) for name, schema in MEMBERS.items()}


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_counted_objects_under_random_tokenizations(name, compiled_members):
  schema, tables = MEMBERS[name], compiled_members[name]
  rng = random.Random(f"members-tok-{name}")
  for _ in range(30):
    text = _object_text(_member_keys(name, rng), rng)
    want = _members_valid(schema, text)
    assert reference_accepts(tables, INDEX.random_tokenization(text, rng)) == want, text

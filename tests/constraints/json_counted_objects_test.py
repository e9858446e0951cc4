"""Objects whose size bounds need several distinct additional keys
(`_json_counted_objects`): every key hashed distinct and the members counted on the
device, so `minProperties`, `dependentSchemas` size bounds and `dependentRequired`
beside `minProperties`/`maxProperties` are exact.

Oracles: `jsonschema` on the parsed object, and a duplicate-key check on the text (a
parser keeps one value per key, so a repeated key would overstate the count). The
byte language is the register-aware `ByteDfa.accepts` (it compares key bytes exactly,
no hashes); the token tables are walked by `testing.reference_accepts` (guards and
hashes in Python integers) and by the jitted device step.
"""

import itertools
import json
import random

import jax
import jax.numpy as jnp
import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.testing import random_accepted_bytes, reference_accepts

INTEGERS = {"type": "integer"}
SCHEMAS = {
    # Three additional members with distinct keys beside the declared one.
    "min_extras": {"type": "object", "properties": {"k": INTEGERS},
                   "additionalProperties": INTEGERS, "minProperties": 4},
    # The suite's `dependentSchemas` case, with integer values.
    "dependent_min": {"type": "object", "additionalProperties": INTEGERS,
                      "dependentSchemas": {"t": {"minProperties": 3},
                                           "q": {"required": ["d"]}}},
    "dependent_max": {"type": "object", "additionalProperties": INTEGERS,
                      "properties": {"a": INTEGERS},
                      "dependentSchemas": {"s": {"maxProperties": 2}}},
    "required_and_counts": {"type": "object", "properties": {"a": INTEGERS, "b": INTEGERS},
                            "required": ["a"], "dependentRequired": {"b": ["c"]},
                            "additionalProperties": INTEGERS,
                            "minProperties": 3, "maxProperties": 4},
}
KEYS = ["k", "t", "q", "d", "s", "a", "b", "c", "x", "y", "xy", "z"]


def _no_repeated_key(pairs):
  keys = [k for k, _ in pairs]
  assert len(keys) == len(set(keys)), keys
  return dict(pairs)


def _valid(schema, value) -> bool:
  return jsonschema.Draft202012Validator(schema).is_valid(value)


def _text(members) -> bytes:
  return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members) + "}").encode()


@pytest.fixture(scope="module")
def dfas():
  return {name: compile_byte_dfa(cd.JsonSchema(schema).to_ir())
          for name, schema in SCHEMAS.items()}


@pytest.mark.parametrize("name", ["dependent_min", "dependent_max", "required_and_counts"])
def test_random_walks_are_valid_without_repeated_keys(name, dfas):
  rng = random.Random(name)
  sizes = set()
  for _ in range(12):
    text = random_accepted_bytes(dfas[name], rng, stop=0.3, soft_limit=50)
    value = json.loads(text, object_pairs_hook=_no_repeated_key)
    assert _valid(SCHEMAS[name], value), text
    sizes.add(len(value))
  assert len(sizes) > 1


@pytest.mark.parametrize("name", SCHEMAS)
def test_agrees_with_jsonschema_on_every_small_object(name, dfas):
  """Every object of up to 4 keys from `KEYS` (declared keys first, in the schema's
  order of declaration, the documented narrowing), and each with a key repeated."""
  schema, dfa = SCHEMAS[name], dfas[name]
  depends = {**schema.get("dependentRequired", {}), **{
      k: d.get("required", []) for k, d in schema.get("dependentSchemas", {}).items()}}
  declared = list(dict.fromkeys([*schema.get("properties", {}), *schema.get("required", []),
                                 *(k for key, ks in depends.items() for k in (key, *ks)),
                                 *schema.get("dependentSchemas", {})]))
  for n in range(5):
    for keys in itertools.combinations(KEYS[:8] if n > 2 else KEYS, n):
      keys = sorted(keys, key=lambda k: declared.index(k) if k in declared else len(declared))
      members = [(k, i) for i, k in enumerate(keys)]
      assert dfa.accepts(_text(members)) == _valid(schema, dict(members)), keys
      if members:  # A repeated key never counts twice, and is never written.
        assert not dfa.accepts(_text(members + [members[-1]])), keys


def test_repeated_additional_keys_do_not_reach_the_minimum(dfas):
  dfa = dfas["min_extras"]
  assert dfa.accepts(b'{"k":1,"a":2,"b":3,"c":4}')
  assert dfa.accepts(b'{"a":2,"b":3,"c":4,"d":5}')
  assert not dfa.accepts(b'{"k":1,"a":2,"a":3,"c":4}')
  assert not dfa.accepts(b'{"k":1,"a":2,"b":3}')
  assert not dfa.accepts(b'{"k":1,"a":2,"b":3,"k":4}')


def test_keys_after_an_array_value_are_still_distinct():
  # An array value's `]` inside the object does not end the object's block of keys.
  schema = {"type": "object", "minProperties": 3,
            "additionalProperties": {"type": ["integer", "array"], "items": {"type": "array"}}}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  assert dfa.accepts(b'{"a":[],"b":2,"c":3}')
  assert dfa.accepts(b'{"a":[[]],"b":[],"c":3}')
  assert not dfa.accepts(b'{"a":[],"b":2,"a":3}')
  assert not dfa.accepts(b'{"a":[[]],"b":[],"b":3}')
  assert not dfa.accepts(b'{"a":[[],[]],"b":2,"a":3}')  # after the inner `]`
  tables = cd.Compiler(cd.Vocabulary.from_token_bytes(
      [bytes([b]) for b in range(256)] + [None], eos_ids=[256])).compile(cd.JsonSchema(schema))
  for text, want in ((b'{"a":[],"b":2,"c":3}', True), (b'{"a":[],"b":2,"a":3}', False)):
    assert reference_accepts(tables, list(text)) == want, text


def test_escaped_keys_of_the_suite():
  schema = {"dependentSchemas": {"foo\tbar": {"minProperties": 4},
                                 "foo'bar": {"required": ["foo\"bar"]}}}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  assert dfa.accepts(b'{"foo\\tbar":1,"a":2,"b":3,"c":4}')
  assert not dfa.accepts(b'{"foo\\tbar":1,"a":2,"b":3,"b":4}')
  assert not dfa.accepts(b'{"foo\\tbar":1,"a":2}')
  assert not dfa.accepts(b'{"foo\'bar":1}')
  assert dfa.accepts(b'{"foo\'bar":1,"foo\\"bar":2}')


def test_members_past_the_default_cap_are_not_written():
  schema = {"type": "object", "additionalProperties": INTEGERS, "minProperties": 2}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  members = [(f"k{i}", i) for i in range(33)]
  assert dfa.accepts(_text(members[:32])) and not dfa.accepts(_text(members))


def test_refusals_name_the_keyword():
  too_many = {"type": "object", "minProperties": 65}
  with pytest.raises(cd.UnsupportedSchemaError, match="minProperties 65 at #/minProperties"):
    cd.JsonSchema(too_many).to_ir()
  order = {"type": "object", "dependentRequired": {"a": ["b"]}, "minProperties": 3}
  with pytest.raises(cd.UnsupportedSchemaError,
                     match="dependentRequired at #/dependentRequired next to minProperties"):
    cd.JsonSchema(order, property_order="schema").to_ir()


@jax.jit
def _device_accepts(tables, tokens, eos):
  state = cd.init_state(tables, 1)
  state, _ = jax.lax.scan(lambda s, t: (cd.advance(tables, s, t[None]), None), state, tokens)
  state = cd.advance(tables, state, jnp.full(1, eos, jnp.int32))
  return state.done & ~state.error


def test_token_tables_and_device_agree_with_jsonschema(byte_compiler, byte_vocab):
  schema = SCHEMAS["dependent_min"]
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  eos = byte_vocab.eos_ids[0]
  for members in ([("t", 1), ("a", 2), ("b", 3)], [("t", 1), ("a", 2), ("a", 3)],
                  [("t", 1), ("a", 2)], [("q", 1), ("d", 2)], [("q", 1), ("a", 2)],
                  [("a", 1), ("b", 2), ("a", 3)]):
    text = _text(members)
    expected = _valid(schema, dict(members)) and len(set(dict(members))) == len(members)
    assert reference_accepts(tables, list(text)) == expected, text
  for text in (b'{"t":1,"a":2,"b":3}', b'{"t":1,"a":2,"a":3}'):
    padded = jnp.array(list(text), jnp.int32)
    assert bool(_device_accepts(tables, padded, eos)[0]) == (text.count(b'"a"') == 1), text

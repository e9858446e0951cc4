"""Shared definitions called on the device stack (`shared_definitions`, issue 15).

A `$ref` target lowered alike in several places becomes one grammar rule, called where
it was inlined (`constraints/_json_shared.py`). The language must not change. Oracles:
the inlined compilation of the same schema, token by token (lockstep random walks over
both tables with the Python reference stepper: the same allowed set at every step,
registers and stack included), `jsonschema` on the texts those walks end with, and
random Gemma 3 tokenizations of valid and invalid documents.
"""

import json
import pathlib
import random

import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import (TokenIndex, reference_accepts, reference_allowed,
                                          reference_end_allowed, reference_step_stack)
from constrained_decoding.testing._reference import zero_registers

KEYS = [f"k{i:02d}" for i in range(14)]
# `address` is used three times, one use inside `person`, itself used twice; `record`
# and `person` (4 copies of `name` and of `address`'s counted `street`: past the budget
# of wide parts, `_json_objects.wide_parts`) are register objects (their keys are
# register bits), used twice, so they stay inlined, `address` called inside `person`;
# `point` is one alternative of a union with another object that also starts with `{`.
SCHEMA = {
    "$defs": {
        "address": {"type": "object", "additionalProperties": False,
                    "required": ["city"],
                    "properties": {"street": {"type": "string", "maxLength": 6},
                                   "city": {"enum": ["Oslo", "Rome", "Lima"]},
                                   "zip": {"type": "string", "pattern": "^[0-9]{2}$"}}},
        "person": {"type": "object", "additionalProperties": False, "required": ["name"],
                   "properties": {"name": {"type": "string", "maxLength": 4},
                                  "home": {"$ref": "#/$defs/address"},
                                  "age": {"type": "integer", "minimum": 0, "maximum": 99}}},
        "record": {"type": "object", "additionalProperties": False,
                   "required": ["k00", "k13"],
                   "properties": {k: {"type": "integer"} for k in KEYS}},
        "point": {"type": "object", "additionalProperties": False, "required": ["x"],
                  "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}},
    },
    "type": "object", "additionalProperties": False, "required": ["owner"],
    "properties": {
        "owner": {"$ref": "#/$defs/person"},
        "buyer": {"$ref": "#/$defs/person"},
        "office": {"$ref": "#/$defs/address"},
        "stops": {"type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/address"}},
        "a": {"$ref": "#/$defs/record"},
        "b": {"anyOf": [{"$ref": "#/$defs/record"}, {"type": "null"}]},
        "p": {"anyOf": [{"$ref": "#/$defs/point"},
                        {"type": "object", "additionalProperties": False,
                         "required": ["r"], "properties": {"r": {"type": "boolean"}}}]},
        "q": {"$ref": "#/$defs/point"},
    },
}
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
# Gemma 3 tokenizations are checked on a lighter schema: push-down tables of counted
# strings (`maxLength`, `pattern` of bounded length) cost seconds with Gemma 3.
LIGHT_ADDRESS = {"type": "object", "additionalProperties": False, "required": ["city"],
                 "properties": {"street": {"type": "string"},
                                "city": {"enum": ["Oslo", "Rome", "Lima"]},
                                "no": {"type": "integer", "minimum": 0, "maximum": 99}}}
LIGHT = {"$defs": {"address": LIGHT_ADDRESS}, "type": "object",
         "additionalProperties": False, "required": ["home"],
         "properties": {"home": {"$ref": "#/$defs/address"},
                        "work": {"$ref": "#/$defs/address"},
                        "past": {"type": "array", "items": {"$ref": "#/$defs/address"}}}}


def _address(rng):
  value = {"city": rng.choice(["Oslo", "Rome", "Lima", "Pisa"])}
  if rng.random() < 0.5:
    value["street"] = rng.choice(["", "Main", "Long st"])
  if rng.random() < 0.5:
    value["zip"] = rng.choice(["12", "1a", "345"])
  if rng.random() < 0.1:
    del value["city"]
  items = list(value.items())
  rng.shuffle(items)
  return dict(items)


def _document(rng):
  """A random instance: valid about half the time (bad cities, long strings, missing
  keys, keys out of schema order)."""
  def person():
    value = {"name": rng.choice(["Ann", "Bo", "Carla"])}
    if rng.random() < 0.6:
      value["home"] = _address(rng)
    if rng.random() < 0.4:
      value["age"] = rng.choice([0, 42, 100])
    return dict(sorted(value.items(), key=lambda _: rng.random()))

  def record():
    keys = set(rng.sample(KEYS, rng.randint(0, 5)))
    if rng.random() < 0.8:
      keys |= {"k00", "k13"}
    return {k: rng.randint(0, 9) for k in sorted(keys, key=lambda _: rng.random())}

  doc = {"owner": person()}
  makers = {"buyer": person, "office": lambda: _address(rng),
            "stops": lambda: [_address(rng) for _ in range(rng.randint(0, 4))],
            "a": record, "b": lambda: rng.choice([None, record()]),
            "p": lambda: rng.choice([{"x": 1}, {"x": 2, "y": 3}, {"r": True}, {"y": 1}]),
            "q": lambda: rng.choice([{"x": -4}, {"y": 5, "x": 0}])}
  for key in rng.sample(sorted(makers), rng.randint(0, len(makers))):
    doc[key] = makers[key]()
  return dict(sorted(doc.items(), key=lambda _: rng.random()))


def _text(value) -> bytes:
  return json.dumps(value, separators=(",", ":")).encode()


@pytest.fixture(scope="module")
def byte_pair(byte_compiler):
  return (byte_compiler.compile(cd.JsonSchema(SCHEMA)),
          byte_compiler.compile(cd.JsonSchema(SCHEMA, shared_definitions="call")))


def test_shared_targets_become_rules():
  grammar = cd.JsonSchema(SCHEMA, shared_definitions="call").pushdown_grammar()
  assert grammar is not None
  for name in ("#/$defs/address", "#/$defs/point"):
    assert name in grammar.names
  for name in ("#/$defs/record", "#/$defs/person"):
    assert name not in grammar.names  # They use register words.
  assert cd.JsonSchema(SCHEMA).pushdown_grammar() is None  # Inlined: regular.


def _state(tables):
  return int(np.asarray(tables.start)[0]), (), zero_registers(tables)


def test_lockstep_walks_allow_the_same_tokens(byte_pair):
  """Along random walks drawn from the called tables, both tables allow the same
  tokens at every step; every walk that may end there is valid for `jsonschema`."""
  inline, called = byte_pair
  rng = np.random.default_rng(0)
  ended = 0
  for _ in range(20):
    a, b, text = _state(inline), _state(called), b""
    for _ in range(400):
      allowed = reference_allowed(called, b[0], b[1], b[2])
      np.testing.assert_array_equal(reference_allowed(inline, a[0], a[1], a[2]), allowed)
      choices = np.flatnonzero(allowed[:256])
      if reference_end_allowed(called, b[0], b[1]) and (rng.random() < 0.3 or not len(choices)):
        assert VALIDATOR.is_valid(json.loads(text)), text
        ended += 1
        break
      token = int(rng.choice(choices))
      a = reference_step_stack(inline, a[0], a[1], token, a[2])
      b = reference_step_stack(called, b[0], b[1], token, b[2])
      text += bytes([token])
  assert ended >= 10


def test_documents_under_random_gemma_tokenizations(gemma_compiler, gemma_vocab):
  """Tokens cross the calls' borders (`"},"` returns, `{"` enters)."""
  spec = cd.JsonSchema(LIGHT, shared_definitions="call")
  assert "#/$defs/address" in spec.pushdown_grammar().names
  called = gemma_compiler.compile(spec)
  validator = jsonschema.Draft202012Validator(LIGHT)
  index = TokenIndex(gemma_vocab)
  rng = random.Random(1)
  verdicts = set()
  for _ in range(60):
    doc = {"home": _address(rng)}
    for key in rng.sample(["work", "past", "x"], rng.randint(0, 3)):
      doc[key] = [_address(rng) for _ in range(rng.randint(0, 3))] if key == "past" else (
          _address(rng))
    for address in [doc["home"], *doc.get("past", [])]:
      if rng.random() < 0.3:
        address["no"] = rng.choice([7, 100])
    doc = dict(sorted(doc.items(), key=lambda _: rng.random()))
    valid = validator.is_valid(doc)
    verdicts.add(valid)
    tokens = index.random_tokenization(_text(doc), rng)
    assert reference_accepts(called, tokens) == valid, doc
  assert verdicts == {True, False}


def test_register_objects_keep_any_order(byte_compiler):
  """A register object (`rule`, keys in any order) calling a shared definition, in a
  register object: called register objects made the compiler fall back to schema
  order (a `RegisterError` on the call), so they stay inlined."""
  path = pathlib.Path(__file__).parents[2] / "benchmarks" / "schemas" / "config_renovate.json"
  schema = json.loads(path.read_text())["schema"]
  spec = cd.JsonSchema(schema, shared_definitions="call")
  assert "#/definitions/schedule" in spec.pushdown_grammar().names
  tables = byte_compiler.compile(spec)
  for rule in ('{"enabled":true,"schedule":["every weekend"]}',
               '{"enabled":true,"groupName":"x","automerge":false}'):
    for text in (f'{{"lockFileMaintenance":{rule}}}', f'{{"packageRules":[{rule},{rule}]}}'):
      assert reference_accepts(tables, list(text.encode())), text


@pytest.mark.parametrize("kwargs, match", [
    ({"shared_definitions": "share"}, "Expected one of"),
    ({"shared_definitions": "call", "max_ref_depth": 2}, "needs max_ref_depth=None"),
])
def test_bad_options(kwargs, match):
  with pytest.raises(ValueError, match=match):
    cd.JsonSchema(SCHEMA, **kwargs)

"""Tests for the JSON Schema front end (`constraints/_json_schema.py`, `cd.JsonSchema`):
soundness and completeness over the example schemas of `json_schema_cases.CASES`.

Oracles: `jsonschema.validate` and `json.loads` for random walks through the byte DFA
(soundness); hypothesis-generated instances serialized under each whitespace policy
(completeness), also at token level with the Gemma 3 vocabulary. The other
`json_schema_*_test.py` files test one concept each (strings and formats, values,
objects, references, errors, the spec).
"""

import json
import random

import hypothesis
import numpy as np
import pytest

from constrained_decoding.testing import random_accepted_bytes
from constrained_decoding.testing import reference_accepts
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex, reference_allowed, reference_step

from json_schema_cases import (  # pylint: disable=import-error  (same directory)
    CASES, FORMAT_ORACLES, POLICIES, RPG, _OPTIONS, _dfa, _strategy, _validate,
    _whitespace_outside_strings, dump)


@pytest.mark.parametrize("strict", [False, True], ids=["extras", "strict"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name, schema, _", CASES, ids=[c[0] for c in CASES])
def test_random_walks_validate(name, schema, _, policy, strict):
  spec = cd.JsonSchema(schema, policy, strict_properties=strict, **_OPTIONS.get(name, {}))
  dfa = _dfa(spec)
  rng = random.Random(f"{name}-{policy}-{strict}")
  for _ in range(12):
    text = random_accepted_bytes(dfa, rng, soft_limit=120).decode("utf-8")
    instance = spec.parse(text)
    _validate(instance, schema)
    if policy == "compact":
      assert not _whitespace_outside_strings(text), text
    if name in ("formats",):
      _check_formats(instance, schema)


def _check_formats(instance, schema):
  for key, value in instance.items():
    assert FORMAT_ORACLES[schema["properties"][key]["format"]](value), (key, value)


@pytest.mark.parametrize("strict", [False, True], ids=["extras", "strict"])
@pytest.mark.parametrize("name, schema, generator", CASES, ids=[c[0] for c in CASES])
def test_generated_instances_are_accepted(name, schema, generator, strict):
  specs = {p: cd.JsonSchema(schema, p, strict_properties=strict, **_OPTIONS.get(name, {}))
           for p in POLICIES}

  @hypothesis.settings(max_examples=20, deadline=None, database=None,
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(_strategy(generator, generator, extras=not strict),
                    st.randoms(use_true_random=False))
  def check(instance, rng):
    _validate(instance, schema)
    for policy, spec in specs.items():
      text = dump(instance, policy, rng)
      assert _dfa(spec).accepts(text.encode()), (policy, text)

  check()


def test_rpg_examples_by_hand():
  spec = cd.JsonSchema(RPG, strict_properties=True)
  dfa = _dfa(spec)
  good = ['{}', '{"name":"Ann","class":"Rogue"}',
          '{"life":-3,"equipment":[{"name":"Axe","durability":10,"quality":"Magic"},{}]}']
  bad = ['{"class":"Bard"}', '{"mana":1.5}', '{"name":"a","name":"b"}',
         '{"equipment":[{"quality":"Rare"}]}', '{"extra":1}', '{,}', '{"name":"a",}']
  assert all(dfa.accepts(t.encode()) for t in good)
  assert not any(dfa.accepts(t.encode()) for t in bad)
  # The items are small objects: any order. The top level's five members, one a nested
  # array, would exceed the any-order budget: its keys are checked in registers.
  assert dfa.accepts(b'{"equipment":[{"quality":"Magic","name":"Axe"}]}')
  assert dfa.accepts(b'{"life":1,"name":"x"}')
  assert not dfa.accepts(b'{"life":1,"name":"x","life":2}')
  assert not _dfa(cd.JsonSchema(RPG, strict_properties=True, property_order="any_bounded")
                  ).accepts(b'{"life":1,"name":"x"}')
  assert not _dfa(cd.JsonSchema(RPG, strict_properties=True, property_order="schema")).accepts(
      b'{"equipment":[{"quality":"Magic","name":"Axe"}]}')
  loose = _dfa(cd.JsonSchema(RPG))
  assert loose.accepts(b'{"name":"a","extra":[1,{"k":null}],"more":"x"}')
  assert not loose.accepts(b'{"name":"a","extra":1,"name":"b"}')  # Declared keys not repeated.
  assert not loose.accepts(b'{"n\\u0061me":1}')  # Another spelling of a declared key.



TOKEN_CASES = [
    ({"type": "object",
      "properties": {"answer": {"enum": ["A", "B", "C", "D"]},
                     "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
                     "sure": {"type": "boolean"}},
      "required": ["answer", "confidence"], "additionalProperties": False}, "flexible"),
    ({"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1}, "maxItems": 3},
     "single"),
    ({"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                       "n": {"type": "integer"}},
      "required": ["day"], "additionalProperties": False}, "compact"),
]


@pytest.fixture(scope="module")
def index(gemma_vocab):
  return TokenIndex(gemma_vocab)


@pytest.mark.parametrize("schema, policy", TOKEN_CASES, ids=["answer", "numbers", "date"])
def test_token_level_random_tokenizations_and_walks(schema, policy, gemma_compiler, gemma_vocab,
                                                    index):
  spec = cd.JsonSchema(schema, policy)
  tables = gemma_compiler.compile(spec)
  rng = random.Random(policy)
  eos = set(gemma_vocab.eos_ids)

  def accepted(tokens):
    return reference_accepts(tables, tokens)

  instances = _strategy(schema, schema, extras=False)

  @hypothesis.settings(max_examples=10, deadline=None, database=None,
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(instances)
  def completeness(instance):
    data = dump(instance, policy, rng).encode()
    for _ in range(3):
      assert accepted(index.random_tokenization(data, rng)), data
    assert not accepted(index.longest_tokenization(data[:-1]))

  completeness()
  for _ in range(5):  # Soundness: random allowed tokens until a stop in an accepting state.
    state, data = int(tables.start[0]), b""
    while True:
      allowed = [t for t in np.nonzero(reference_allowed(tables, state))[0].tolist()
                 if t not in eos]
      if tables.accepting[state] and (rng.random() < 0.3 or len(data) > 200 or not allowed):
        break
      token = rng.choice(allowed)
      data += gemma_vocab.token_bytes[token]
      state = reference_step(tables, state, token)
    _validate(json.loads(data.decode()), schema)

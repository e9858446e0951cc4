"""JSON Schema objects: `propertyNames` and `patternProperties`, `minProperties` and
`maxProperties`, `unevaluatedProperties` / `unevaluatedItems`, property order and
`dependentRequired`, discriminated unions; every case against `jsonschema` and random
walks through the byte DFA.
"""

import json
import random
import re

import hypothesis
import jsonschema
import pytest

from constrained_decoding.testing import random_accepted_bytes
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa

from json_schema_cases import (  # pylint: disable=import-error  (same directory)
    POLICIES, _dfa, _validate)


def test_strict_properties_keeps_free_form_objects_and_explicit_schemas():
  any_object = _dfa(cd.JsonSchema({"type": "object"}, strict_properties=True))
  assert any_object.accepts(b'{"a":[1]}')
  typed = _dfa(cd.JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}},
                              "additionalProperties": {"type": "boolean"}}, strict_properties=True))
  assert typed.accepts(b'{"a":1,"b":true}') and not typed.accepts(b'{"a":1,"b":1}')


_NAMED = {"type": "object", "properties": {"id": {"type": "integer"}, "Zed": {"type": "null"}},
          "propertyNames": {"pattern": "^[a-z]", "maxLength": 4}}
_PATTERNED = {"type": "object", "properties": {"ab": {"type": "integer", "minimum": 5},
                                               "az": {"type": "integer"}},
              "patternProperties": {"^a[a-c]*x?$": {"type": "integer", "maximum": 9}},
              "additionalProperties": False}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("schema", [_NAMED, _PATTERNED], ids=["names", "patterned"])
def test_key_constraints_random_walks_validate(schema, policy):
  dfa = _dfa(cd.JsonSchema(schema, policy))
  rng = random.Random(policy)
  for _ in range(30):
    _validate(json.loads(random_accepted_bytes(dfa, rng, soft_limit=100)), schema)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(key=st.one_of(st.text(max_size=6),
                                st.sampled_from(["id", "Zed", "ab", "az", "a", "abx", "ax"])),
                  value=st.sampled_from([1, 7, 12, -3, "s", None]))
def test_key_constraints_agree_with_jsonschema(key, value):
  # One property, so no narrowing applies (order, extras after declared): accepted
  # exactly when valid.
  for schema in (_NAMED, _PATTERNED):
    instance = {key: value}
    text = json.dumps(instance, ensure_ascii=False, separators=(",", ":")).encode()
    valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
    if not key.isascii():
      try:
        key.encode()
      except UnicodeEncodeError:
        valid = False  # Lone surrogates are not text: never generated.
    assert _dfa(cd.JsonSchema(schema)).accepts(text) == valid, (schema, instance)


def test_pattern_properties_narrowing_and_pydantic_dicts():
  import pydantic  # pylint: disable=import-outside-toplevel
  import typing  # pylint: disable=import-outside-toplevel

  class Model(pydantic.BaseModel):
    labels: dict[typing.Literal["x", "y"], int]
    words: dict[pydantic.constr(pattern=r"^[a-z]+$"), str]

  schema = Model.model_json_schema()
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"labels":{"x":1,"y":2},"words":{"cat":"a"}}')
  assert not dfa.accepts(b'{"labels":{"z":1},"words":{}}')  # propertyNames: exact.
  # A key matching no pattern is valid (additionalProperties defaults to true) but not
  # generated: the documented narrowing.
  assert jsonschema.Draft202012Validator(schema).is_valid({"labels": {}, "words": {"Cat": 1}})
  assert not dfa.accepts(b'{"labels":{},"words":{"Cat":1}}')
  rng = random.Random(0)
  for _ in range(30):
    Model.model_validate_json(random_accepted_bytes(dfa, rng, soft_limit=80))


def test_key_constraints_in_lenient_mode():
  schema = {"type": "object", "patternProperties": {c: {} for c in "abcdefg"},
            "propertyNames": {"pattern": "^[xy]", "x-note": 1}}
  spec = cd.JsonSchema(schema, lenient=True)
  assert spec.ignored_keywords() == ("#/propertyNames/x-note", "#/patternProperties")
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"x1":[],"y":{}}') and not dfa.accepts(b'{"z":1}')


_COUNTED = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"},
                                             "c": {"const": "c"}},
            "required": ["b"], "additionalProperties": {"type": "boolean"}}


@pytest.mark.parametrize("policy", ["compact", "flexible"])
@pytest.mark.parametrize("bounds", [{"minProperties": 2}, {"maxProperties": 2},
                                    {"minProperties": 3, "maxProperties": 4},
                                    {"maxProperties": 0}], ids=["min", "max", "both", "zero"])
def test_property_counts_walks_validate(bounds, policy):
  schema = {**_COUNTED, **bounds}
  if bounds == {"maxProperties": 0}:  # "b" is required: nothing fits.
    with pytest.raises(cd.SchemaError, match="accepts no JSON value"):
      cd.JsonSchema(schema, policy).to_ir()
    return
  dfa = _dfa(cd.JsonSchema(schema, policy))
  rng = random.Random(policy)
  sizes = set()
  for _ in range(40):  # Repeated extra keys collapse when parsed: still valid.
    instance = json.loads(random_accepted_bytes(dfa, rng, soft_limit=100))
    _validate(instance, schema)
    sizes.add(len(instance))
  assert len(sizes) > 1


def test_repeated_additional_keys_do_not_count_towards_min_properties():
  # One possible extra key: walks repeat it often, and a parser keeps one.
  schema = {"type": "object", "properties": {"a": {"type": "null"}},
            "propertyNames": {"enum": ["a", "x"]}, "additionalProperties": {"type": "boolean"},
            "minProperties": 2, "maxProperties": 3}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"a":null,"x":true}') and not dfa.accepts(b'{"x":true,"x":false}')
  rng = random.Random(0)
  for _ in range(60):
    _validate(json.loads(random_accepted_bytes(dfa, rng, soft_limit=60)), schema)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(declared=st.lists(st.sampled_from("abc"), unique=True),
                  extras=st.lists(st.sampled_from(["x", "y", "zz"]), unique=True, max_size=3),
                  lo=st.integers(0, 4), hi=st.integers(0, 5))
def test_property_counts_agree_with_jsonschema(declared, extras, lo, hi):
  schema = {**_COUNTED, "minProperties": lo, "maxProperties": hi}
  values = {"a": 1, "b": None, "c": "c"}
  instance = {k: values[k] for k in "abc" if k in declared} | {k: True for k in extras}
  text = json.dumps(instance, separators=(",", ":")).encode()
  valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
  # The documented narrowing: towards minProperties one additional property counts.
  generated = valid and len(declared) + min(len(extras), 1) >= lo
  try:
    dfa = _dfa(cd.JsonSchema(schema))
  except cd.UnsupportedSchemaError:
    assert lo > 3 + 1  # More than the declared properties and one extra.
    return
  except cd.SchemaError:
    assert not generated
    return
  assert dfa.accepts(text) == generated, (schema, instance)


def test_pydantic_discriminated_union():
  import pydantic  # pylint: disable=import-outside-toplevel
  import typing  # pylint: disable=import-outside-toplevel

  class Cat(pydantic.BaseModel):
    kind: typing.Literal["cat"]
    lives: int

  class Dog(pydantic.BaseModel):
    kind: typing.Literal["dog"]
    bark: str

  class Owner(pydantic.BaseModel):
    pet: typing.Union[Cat, Dog] = pydantic.Field(discriminator="kind")

  schema = Owner.model_json_schema()
  assert "discriminator" in schema["properties"]["pet"]
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"pet":{"kind":"cat","lives":9}}')
  assert not dfa.accepts(b'{"pet":{"kind":"cat","bark":"woof"}}')
  rng = random.Random(0)
  for _ in range(30):
    Owner.model_validate_json(random_accepted_bytes(dfa, rng, soft_limit=60))


UNEVALUATED_CASES = [
    # (schema, accepted, rejected): checked against jsonschema too.
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "unevaluatedProperties": False},
     ['{"a":1}', "{}"], ['{"a":1,"b":2}', '{"b":2}']),
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}],
      "properties": {"b": {"type": "string"}}, "unevaluatedProperties": False},
     ['{"a":1,"b":"x"}', '{"a":1}'], ['{"a":1,"c":2}']),
    ({"$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
      "$ref": "#/$defs/base", "unevaluatedProperties": {"type": "string"}},
     ['{"a":1,"z":"s"}'], ['{"a":1,"z":2}']),
    ({"anyOf": [{"properties": {"kind": {"const": 1}, "a": {"type": "integer"}},
                 "required": ["kind"]},
                {"properties": {"kind": {"const": 2}, "b": {"type": "integer"}},
                 "required": ["kind"]}],
      "unevaluatedProperties": False},
     ['{"kind":1,"a":1}', '{"kind":2,"b":2}'], ['{"kind":1,"b":1}', '{"kind":1,"c":0}']),
    ({"type": "object", "additionalProperties": True, "unevaluatedProperties": False},
     ['{"x":1}'], []),
    ({"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False},
     ['["a"]', "[]"], ['["a",1]']),
    ({"type": "array", "items": {"type": "integer"}, "unevaluatedItems": False},
     ["[1,2]"], []),
    ({"allOf": [{"prefixItems": [{"type": "string"}]}], "unevaluatedItems": {"type": "integer"}},
     ['["a",1,2]'], ['["a","b"]']),
]


@pytest.mark.parametrize("schema", [
    # Overlapping alternatives whose evaluated properties depend on a nested anyOf
    # (exact ones: json_unevaluated_regions_test.py).
    {"anyOf": [{"anyOf": [{"required": ["a"]}, {"properties": {"c": {}}}]},
               {"properties": {"b": {"const": 2}}}],
     "unevaluatedProperties": False},
    # A negated `if` whose violations are not expressible (exact `not`/`if` branches:
    # json_unevaluated_regions_test.py).
    {"if": {"patternProperties": {"^a": {"type": "string"}}}, "then": {"required": ["b"]},
     "unevaluatedProperties": False},
    {"allOf": [{"not": {"required": ["a"]}}], "unevaluatedProperties": False},
    # Items evaluated through a nested anyOf (exact next to contains, not, if and flat
    # alternatives: json_unevaluated_items_test.py).
    {"anyOf": [{"anyOf": [{"prefixItems": [True]}, {"minItems": 2}]},
               {"prefixItems": [True, True]}],
     "unevaluatedItems": False},
])
def test_unevaluated_keywords_refused_where_inexact(schema):
  with pytest.raises(cd.UnsupportedSchemaError, match=r"unevaluated(Properties|Items) at #/"):
    cd.JsonSchema(schema).to_ir()


@pytest.mark.parametrize("schema, accepted, rejected", UNEVALUATED_CASES)
def test_unevaluated_keywords_match_jsonschema(schema, accepted, rejected):
  validator = jsonschema.Draft202012Validator(schema)
  dfa = _dfa(cd.JsonSchema(schema))
  for text in accepted:
    assert validator.is_valid(json.loads(text)) and dfa.accepts(text.encode()), text
  for text in rejected:
    assert not validator.is_valid(json.loads(text)) and not dfa.accepts(text.encode()), text
  rng = random.Random(json.dumps(schema))
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=80).decode()
    assert validator.is_valid(json.loads(text)), text



ORDER_CASES = [
    # (schema, texts), every text checked against jsonschema and the automaton.
    ({"type": "object", "properties": {"radius": {"type": "number"},
                                       "shape": {"enum": ["circle", "square"]}},
      "required": ["shape", "radius"]},
     ['{"shape":"circle","radius":5}', '{"radius":5,"shape":"circle"}',
      '{"$schema":"x","radius":5,"shape":"circle"}', '{"radius":5,"shape":"circle","$schema":"x"}',
      '{"radius":5}', '{"shape":"circle"}', '{"shape":"circle","radius":"5"}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                       "c": {"type": "boolean"}},
      "additionalProperties": False},
     ["{}", '{"c":true,"a":1}', '{"b":"x","c":false,"a":2}', '{"a":1,"z":1}', '{"c":1}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "dependentRequired": {"a": ["b"], "b": ["c"]}},
     ['{"a":1}', '{"a":1,"b":2}', '{"c":0,"a":1,"b":2}', '{"b":2,"c":3}', '{"c":3}', "{}",
      '{"x":[],"a":1,"c":1,"b":1}']),
    ({"type": "object", "dependencies": {"credit": ["billing"]},  # Draft-07 spelling.
      "properties": {"credit": {"type": "integer"}, "billing": {"type": "string"}}},
     ['{"credit":1}', '{"billing":"x","credit":1}', '{"billing":"x"}']),
    ({"allOf": [{"dependentRequired": {"a": ["b"]}}, {"dependentRequired": {"a": ["c"]}}]},
     ['{"a":1,"b":1}', '{"a":1,"c":1,"b":1}', '{"b":1}']),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("schema, texts", ORDER_CASES)
def test_any_property_order_matches_jsonschema(schema, texts, policy):
  draft = jsonschema.Draft7Validator if "dependencies" in schema else jsonschema.Draft202012Validator
  validator = draft(schema)
  spec = cd.JsonSchema(schema, policy)
  dfa = _dfa(spec)
  for text in texts:
    value = json.loads(text)
    dumped = json.dumps(value, separators=(",", ":")) if policy == "compact" else json.dumps(value)
    assert dfa.accepts(dumped.encode()) == validator.is_valid(value), dumped
  rng = random.Random(f"order-{policy}")
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=80).decode()
    value = json.loads(text)
    assert validator.is_valid(value), text


def test_any_order_never_repeats_a_declared_key():
  spec = cd.JsonSchema({"type": "object", "properties": {"a": {"type": "integer"},
                                                          "b": {"type": "integer"}}})
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"b":1,"a":2}') and dfa.accepts(b'{"x":0,"b":1,"a":2,"y":3}')
  # Additional members between declared ones: a documented narrowing (cost, see
  # _json_objects.py), valid but not accepted.
  assert not dfa.accepts(b'{"b":1,"x":0,"a":2}')
  assert not dfa.accepts(b'{"a":1,"b":2,"a":3}') and not dfa.accepts(b'{"b":1,"b":2}')


def test_large_objects_check_keys_in_registers_or_keep_schema_order(caplog):
  properties = {f"p{i}": {"type": "integer"} for i in range(20)}
  spec = cd.JsonSchema({"type": "object", "properties": properties})
  with caplog.at_level("INFO"):
    dfa = compile_byte_dfa(spec.to_ir())
  assert "checks its 20 keys on the device" in caplog.text
  # Any order, each key at most once, additional members anywhere.
  assert dfa.accepts(b'{"p0":1,"p19":2}') and dfa.accepts(b'{"p19":2,"p0":1}')
  assert dfa.accepts(b'{"p19":2,"x":0,"p0":1}')
  assert not dfa.accepts(b'{"p19":2,"p0":1,"p19":3}')
  bounded = cd.JsonSchema({"type": "object", "properties": properties},
                          property_order="any_bounded")
  with caplog.at_level("INFO"):
    dfa = compile_byte_dfa(bounded.to_ir())
  assert not len(dfa.marker_arcs)
  assert dfa.accepts(b'{"p0":1,"p19":2}') and not dfa.accepts(b'{"p19":2,"p0":1}')
  assert "keeps schema order" in caplog.text
  with pytest.raises(cd.UnsupportedSchemaError, match=r"dependentRequired at #/dependentRequired"):
    cd.JsonSchema({"type": "object", "properties": properties,
                   "dependentRequired": {"p0": ["p1"]}}).to_ir()


def test_objects_choose_registers_by_the_measured_cost_of_their_copies(caplog):
  # A member's copies are weighed by what they cost once composed (`wide_parts`): an
  # `email` (a bounded hostname of [A-Za-z0-9] positions) weighs several string bodies,
  # so three members with one of them check their keys in registers, while three
  # integers (no wide part) or one plain string among integers keep the automaton.
  from constrained_decoding.constraints import _json_objects  # pylint: disable=g-import-not-at-top

  def weight(schema):
    return _json_objects.wide_parts(cd.JsonSchema(schema).to_ir())

  assert weight({"type": "integer"}) == 0 and weight({"type": "string"}) == 1
  assert weight({"type": "string", "format": "date-time"}) < 1  # Digits only.
  assert weight({"type": "string", "format": "email"}) > 6
  assert 1 < weight({"type": "string", "format": "uri"}) < weight(
      {"type": "string", "format": "email"})
  assert weight({"type": "string", "maxLength": 16}) == 2  # 16 positions of the body.
  for first, registers in [({"type": "string", "format": "email"}, True),
                           ({"type": "string"}, False), ({"type": "integer"}, False)]:
    schema = {"type": "object", "properties": {"a": first, "b": {"type": "integer"},
                                               "c": {"type": "integer"}}}
    caplog.clear()
    with caplog.at_level("INFO"):
      dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
    assert bool(len(dfa.marker_arcs)) == registers, first
    assert ("checks its 3 keys on the device" in caplog.text) == registers
    validator = jsonschema.Draft202012Validator(schema)
    value = "x@example.com" if first.get("type") == "string" else 7
    for text in [f'{{"c":1,"a":{json.dumps(value)},"b":2}}', '{"b":1,"x":[0],"c":2}',
                 f'{{"a":{json.dumps(value)},"a":{json.dumps(value)}}}', '{"b":"1"}']:
      expected = validator.is_valid(json.loads(text)) and text.count('"a"') < 2
      # Additional members between declared ones: accepted by registers only.
      if not registers and re.search(r'\d,"x"', text):
        expected = False
      assert dfa.accepts(text.encode()) == expected, (first, text)


def test_property_order_option_is_checked():
  with pytest.raises(ValueError, match=r"property_order is 'sorted'"):
    cd.JsonSchema({}, property_order="sorted")


PATTERN_CASES = [
    # Overlapping patterns: a key matching both needs both schemas.
    ({"type": "object", "patternProperties": {"a*": {"type": "integer"},
                                              "aaa*": {"maximum": 20}}},
     ['{"a":21}', '{"aaaa":18}', '{"b":1}', '{"aaaa":31}', '{"aaa":"x"}']),
    ({"type": "object", "patternProperties": {"^x-": {"type": "string"}, "^[a-z]+$": {}},
      "properties": {"id": {"type": "integer"}}, "additionalProperties": False},
     ['{"id":1,"x-a":"s"}', '{"x-a":1}', '{"abc":[1]}', '{"ABC":1}', '{"id":"1"}']),
]


@pytest.mark.parametrize("schema, texts", PATTERN_CASES)
def test_several_pattern_properties_match_jsonschema(schema, texts):
  # Valid keys that match no pattern are not generated (a documented narrowing), so
  # acceptance implies validity; on these texts, validity implies acceptance too.
  validator = jsonschema.Draft202012Validator(schema)
  dfa = _dfa(cd.JsonSchema(schema))
  for text in texts:
    value = json.loads(text)
    matched = all(any(re.search(p, k) for p in schema["patternProperties"])
                  or k in schema.get("properties", {}) for k in value)
    assert dfa.accepts(text.encode()) == (validator.is_valid(value) and matched), text
  rng = random.Random(json.dumps(schema))
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=60).decode()
    assert validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize("other", [
    {"properties": {"a": {"type": "integer"}}},
    {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
])
def test_all_of_with_patterns_that_constrain_nothing(other):
  # OpenAPI 3.1 mixes `specification-extensions` ({"^x-": true}) into its objects.
  schema = {"type": "object", "allOf": [{"patternProperties": {"^x-": True}}, other]}
  dfa = _dfa(cd.JsonSchema(schema))
  for value in ({}, {"a": 1}, {"a": "1"}, {"x-b": [1]}, {"a": 2, "x-b": {}}, {"b": None}):
    text = json.dumps(value, separators=(",", ":")).encode()
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert dfa.accepts(text) == expected, value


def test_many_pattern_properties_split_into_the_regions_keys_fall_in():
  """Eight patterns, some overlapping: a key matching several takes all their schemas;
  random texts validate and hand-picked instances agree with jsonschema."""
  patterns = {"^a": {"type": "integer"}, "^b": {"type": "string"}, "^c": {"type": "boolean"},
              "^d": {"type": "null"}, "x$": {"type": "integer", "minimum": 3},
              "^e": {}, "^f": {"type": "integer"}, "^g": {"enum": [1, "g"]}}
  schema = {"type": "object", "patternProperties": patterns, "additionalProperties": False}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  rng = random.Random(8)
  for _ in range(40):
    _validate(json.loads(random_accepted_bytes(dfa, rng, soft_limit=60)), schema)
  for instance in [{"ax": 5}, {"ax": 1}, {"ax": "s"}, {"bx": 4}, {"b": "s"}, {"zx": 4},
                   {"zx": 2}, {"g": "g"}, {"gx": 3}, {"gx": 1}, {"q": 1}, {"e": [1]}]:
    text = json.dumps(instance, separators=(",", ":")).encode()
    assert dfa.accepts(text) == jsonschema.Draft202012Validator(schema).is_valid(instance), text

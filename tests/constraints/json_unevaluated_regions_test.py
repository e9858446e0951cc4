"""`unevaluatedProperties` next to `anyOf`/`oneOf` whose alternatives may overlap
(`_json_boolean._evaluated_regions`: the regions of the alternatives that match
together, each knowing what it evaluates), and next to `not` and `if`/`then`/`else`
(`_json_boolean._conditions_with_unevaluated`: their branches, each carrying it).

Oracle: `jsonschema` (draft 2020-12) on hand-written and random objects, each checked
through the byte DFA of the whole `cd.JsonSchema`, in every member order (a union of
objects keeps schema order: a documented narrowing).
"""

import itertools
import json
import random

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa

_CASES = [  # (schema, keys random objects draw from)
    ({"properties": {"foo": {"type": "string"}},
      "anyOf": [{"properties": {"bar": {"const": "bar"}}, "required": ["bar"]},
                {"properties": {"baz": {"const": "baz"}}, "required": ["baz"]},
                {"properties": {"quux": {"const": "quux"}}, "required": ["quux"]}],
      "unevaluatedProperties": False},
     ["foo", "bar", "baz", "quux", "x"]),
    ({"properties": {"foo": {"type": "string"}},
      "oneOf": [{"properties": {"bar": {"const": "bar"}}, "required": ["bar"]},
                {"properties": {"baz": {"const": "baz"}}, "required": ["baz"]}],
      "unevaluatedProperties": False},
     ["foo", "bar", "baz", "x"]),
    ({"type": "object",
      "anyOf": [{"properties": {"a": {"type": "integer"}}},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}],
      "unevaluatedProperties": {"type": "boolean"}},
     ["a", "b", "c"]),
    ({"anyOf": [{"properties": {"a": {"const": 1}}}, {"properties": {"b": {"const": 2}}}],
      "unevaluatedProperties": False},
     ["a", "b", "c"]),
    ({"patternProperties": {"^x-": True},
      "anyOf": [{"required": ["paths"]}, {"required": ["hooks"]},
                {"properties": {"ab": {"type": "integer"}}, "required": ["hooks"]}],
      "properties": {"paths": {"type": "integer"}, "hooks": {}},
      "unevaluatedProperties": False},
     ["paths", "hooks", "x-a", "ab", "c"]),
    ({"if": {"properties": {"foo": {"const": "then"}}, "required": ["foo"]},
      "then": {"properties": {"bar": {"type": "string"}}, "required": ["bar"]},
      "else": {"properties": {"baz": {"type": "string"}}, "required": ["baz"]},
      "unevaluatedProperties": False},
     ["foo", "bar", "baz", "x"]),
    ({"if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
      "unevaluatedProperties": False},
     ["a", "b"]),
    ({"properties": {"a": {}},
      "not": {"properties": {"b": {"const": 1}}, "required": ["b"]},
      "unevaluatedProperties": {"type": "string"}},
     ["a", "b", "c"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "not": {"required": ["b"]}, "unevaluatedProperties": {"type": "string"}},
     ["a", "b", "c"]),
    ({"not": {"required": ["a"]}, "if": {"properties": {"b": {}}},
      "unevaluatedProperties": {"type": "integer"}},
     ["a", "b", "c"]),
    ({"properties": {"name": {"type": "string"}, "identifier": {"type": "string"},
                     "url": {"type": "string"}},
      "required": ["name"], "patternProperties": {"^x-": True},
      "dependentSchemas": {"identifier": {"not": {"required": ["url"]}}},
      "unevaluatedProperties": False},  # OpenAPI 3.1's `license`.
     ["name", "identifier", "url", "x-a", "z"]),
    ({"anyOf": [{"not": {"required": ["x"]}}, {"properties": {"a": True}}],
      "unevaluatedProperties": False},
     ["a", "x", "c"]),
    ({"properties": {"foo2": {}},
      "dependentSchemas": {"foo": {}, "foo2": {"properties": {"bar": {}}}},
      "unevaluatedProperties": False},
     ["foo", "foo2", "bar", "x"]),
    ({"$defs": {"one": {"properties": {"a": True}},
                "two": {"required": ["x"], "properties": {"x": True}}},
      "allOf": [{"$ref": "#/$defs/one"}, {"properties": {"b": True}},
                {"oneOf": [{"$ref": "#/$defs/two"},
                           {"required": ["y"], "properties": {"y": True}}]}],
      "unevaluatedProperties": False},
     ["a", "b", "x", "y", "z"]),
]
_VALUES = ["bar", "baz", "quux", "s", 1, 2, True, None, [], {}]


def _orders(value: dict) -> list[dict]:
  return [dict(p) for p in itertools.permutations(value.items())]


@pytest.mark.parametrize("schema, keys", _CASES)
def test_unevaluated_properties_next_to_overlapping_alternatives(schema, keys):
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  rng = random.Random(json.dumps(schema))
  instances = [{}, {k: "bar" for k in keys[:2]}, {"bar": "bar", "baz": "baz"},
               {"foo": "f", "bar": "bar", "baz": "baz", "quux": "quux"}]
  instances += [{rng.choice(keys): rng.choice(_VALUES) for _ in range(rng.randrange(5))}
                for _ in range(150)]
  seen = set()
  for instance in instances:
    valid = validator.is_valid(instance)
    texts = [json.dumps(v, separators=(",", ":")).encode() for v in _orders(instance)]
    accepted = [dfa.accepts(t) for t in texts]
    if valid:
      assert any(accepted), (schema, instance)
    else:
      assert not any(accepted), (schema, instance)
    seen.add(valid)
  assert seen == {True, False}


def test_all_of_merges_pattern_properties_with_properties_beside_free_keys():
  schema = {"allOf": [{"patternProperties": {"^x": {"type": "integer"}}},
                      {"properties": {"xa": {"minimum": 3}, "b": {"type": "string"}}}]}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  for instance in [{"xa": 3}, {"xa": 2}, {"xa": 3.5}, {"xb": 1}, {"xb": "s"}, {"b": "s"},
                   {"b": 1}, {"xa": 4, "b": "t", "xc": 0}]:  # Keys matching no pattern
    # are not generated (a documented narrowing): none here.
    text = json.dumps(instance, separators=(",", ":")).encode()
    assert dfa.accepts(text) == validator.is_valid(instance), instance


def test_alternatives_evaluating_dynamically_stay_refused():
  schema = {"anyOf": [{"anyOf": [{"properties": {"x": {}}}, {"required": ["y"]}]},
                      {"properties": {"a": True}}],
            "unevaluatedProperties": False}
  with pytest.raises(errors.UnsupportedSchemaError, match="unevaluatedProperties"):
    cd.JsonSchema(schema).to_ir()

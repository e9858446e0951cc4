"""`unevaluatedItems` next to `anyOf`/`oneOf`, `not`, `if`/`then`/`else` and `contains`
(`_json_unevaluated_items.rewrite`: branches that each know the items they evaluate),
nested `if`s and `oneOf` alternatives with `if` included; `contains` next to
`prefixItems` (`_json_array_schemas._lower_contains`).

Oracle: `jsonschema` (draft 2020-12) on hand-written and random arrays of small values,
each checked through the byte DFA of the whole `cd.JsonSchema`.
"""

import json
import random

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa

_CASES = [
    {"unevaluatedItems": {"type": "boolean"},
     "anyOf": [{"items": {"type": "string"}}, True]},
    {"prefixItems": [{"const": "foo"}],
     "anyOf": [{"prefixItems": [True, {"const": "bar"}]},
               {"prefixItems": [True, True, {"const": "baz"}]}],
     "unevaluatedItems": False},
    {"prefixItems": [{"const": "foo"}],
     "oneOf": [{"prefixItems": [True, {"const": "bar"}]},
               {"prefixItems": [True, {"type": "string"}]}],
     "unevaluatedItems": False},
    {"prefixItems": [{"const": "foo"}],
     "not": {"not": {"prefixItems": [True, {"const": "bar"}]}},
     "unevaluatedItems": False},
    {"prefixItems": [{"const": "foo"}],
     "if": {"prefixItems": [True, {"const": "bar"}]},
     "then": {"prefixItems": [True, True, {"const": "then"}]},
     "else": {"prefixItems": [True, True, True, {"const": "else"}]},
     "unevaluatedItems": False},
    {"if": {"prefixItems": [{"const": "a"}]}, "unevaluatedItems": False},
    {"prefixItems": [True], "contains": {"type": "string"}, "unevaluatedItems": False},
    {"contains": {"type": "string"}, "minContains": 0, "unevaluatedItems": False},
    {"contains": {"type": "string"}, "unevaluatedItems": {"type": "integer"}},
    {"contains": {"const": 1}, "maxContains": 2, "unevaluatedItems": {"type": "string"}},
    {"anyOf": [{"contains": {"const": "a"}}, {"prefixItems": [True, {"const": 1}]},
               {"prefixItems": [{"type": "string"}]}],
     "unevaluatedItems": {"type": "boolean"}},
    {"oneOf": [{"contains": {"const": "a"}}, {"prefixItems": [{"type": "integer"}]}],
     "unevaluatedItems": False},
    {"not": {"prefixItems": [{"const": 1}]}, "if": {"prefixItems": [True, {"const": 2}]},
     "then": {"maxItems": 3}, "unevaluatedItems": {"type": "string"}},
    {"$defs": {"two": {"prefixItems": [True, {"type": "integer"}]}},
     "anyOf": [{"$ref": "#/$defs/two"}, {"allOf": [{"prefixItems": [{"const": "a"}]}]}],
     "unevaluatedItems": {"const": None}},
    {"if": {"prefixItems": [{"const": "a"}]},
     "then": {"if": {"prefixItems": [True, {"const": 1}]},
              "then": {"prefixItems": [True, True, {"const": "foo"}]},
              "else": {"maxItems": 3}},
     "unevaluatedItems": {"type": "integer"}},
    {"oneOf": [{"if": {"prefixItems": [{"const": 1}]}, "then": {"minItems": 2}},
               {"prefixItems": [True, {"type": "string"}]}],
     "not": {"minItems": 4, "prefixItems": [True, True, {"const": 2}]},
     "unevaluatedItems": {"const": "bar"}},
    {"allOf": [{"contains": {"const": 1}}], "unevaluatedItems": False},
    {"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}],
     "unevaluatedItems": {"const": "a"}},
    {"if": {"contains": {"const": "a"}},
     "then": {"if": {"contains": {"const": 1}}, "then": {"if": {"contains": {"const": 2}}}},
     "unevaluatedItems": False},
    {"prefixItems": [{"type": "string"}],
     "if": {"contains": {"const": 2}}, "else": {"items": {"type": "integer"}},
     "unevaluatedItems": {"const": True}},
]
_VALUES = ["foo", "bar", "baz", "then", "else", "a", 1, 2, True, None]


@pytest.mark.parametrize("schema", _CASES)
def test_unevaluated_items_next_to_applicators_matches_jsonschema(schema):
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  rng = random.Random(json.dumps(schema))
  instances = [[], ["foo"], ["foo", "bar"], ["foo", "bar", "then"],
               ["foo", "baz", 1, "else"], ["a", 1, True]]
  instances += [[rng.choice(_VALUES) for _ in range(rng.randrange(6))]
                for _ in range(300)]
  seen = set()
  for instance in instances:
    valid = validator.is_valid(instance)
    text = json.dumps(instance, separators=(",", ":")).encode()
    assert dfa.accepts(text) == valid, (schema, instance, valid)
    seen.add(valid)
  assert seen == {True, False}


@pytest.mark.parametrize("schema", [
    {"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}]},
    {"allOf": [{"contains": {"const": 1}}, {"contains": {"type": "integer"}},
               {"contains": {"const": "a"}}], "items": {"enum": [1, 2, "a", None]}},
])
def test_different_contains_merged_from_all_of_match_jsonschema(schema):
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  rng = random.Random(json.dumps(schema))
  for _ in range(400):
    instance = [rng.choice([1, 2, "a", None]) for _ in range(rng.randrange(6))]
    text = json.dumps(instance, separators=(",", ":")).encode()
    assert dfa.accepts(text) == validator.is_valid(instance), (schema, instance)


def test_four_different_contains_are_refused():
  schema = {"allOf": [{"contains": {"const": i}} for i in range(4)]}
  with pytest.raises(errors.UnsupportedSchemaError, match="different contains"):
    cd.JsonSchema(schema).to_ir()


def test_contains_merged_next_to_dynamic_evaluation_is_refused():
  schema = {"allOf": [{"contains": {"const": 1}},
                      {"anyOf": [{"anyOf": [{"prefixItems": [True]}, {"minItems": 2}]},
                                 {"prefixItems": [True, True]}]}],
            "unevaluatedItems": False}
  with pytest.raises(errors.UnsupportedSchemaError, match="unevaluatedItems"):
    cd.JsonSchema(schema).to_ir()


def test_alternatives_evaluating_dynamically_stay_refused():
  schema = {"anyOf": [{"anyOf": [{"prefixItems": [True]}, {"minItems": 2}]},
                      {"prefixItems": [True, True]}],
            "unevaluatedItems": False}
  with pytest.raises(errors.UnsupportedSchemaError, match="unevaluatedItems"):
    cd.JsonSchema(schema).to_ir()

"""`unevaluatedProperties` beside `not` and `if`: `not` of a schema with
`unevaluatedProperties` whose evaluated properties do not depend on the instance
(`_json_negation._static_unevaluated`), and `if` without `then`/`else` beside
`unevaluatedProperties` (its annotations count where it matches; no negation needed,
`_json_boolean._conditions_with_unevaluated`): exact, against `jsonschema` on every
small object (in some order of its members); refused where inexact."""

import itertools
import json

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa

NEGATED = {
    # The suite's case: annotations of every matching anyOf alternative count.
    "any_of_true": {"anyOf": [True, {"properties": {"foo": True}}],
                    "unevaluatedProperties": False},
    "all_of": {"allOf": [{"properties": {"a": {"type": "integer"}}}],
               "unevaluatedProperties": {"type": "string"}},
    "evaluates_nothing": {"anyOf": [{"required": ["a"]}, {"properties": {"b": True}}],
                          "properties": {"foo": {"type": "integer"}},
                          "unevaluatedProperties": False},
    "beside_additional": {"properties": {"a": True}, "additionalProperties": False,
                          "unevaluatedProperties": {"type": "string"}},
}
VALUES = [1, "s"]


def _instances():
  yield from (1, "s", None, [])
  for n in range(3):
    for keys in itertools.combinations(["foo", "a", "b", "bar"], n):
      for values in itertools.product(VALUES, repeat=n):
        yield dict(zip(keys, values))


# `if` alone next to unevaluatedProperties.
CONDITIONS = {
    "patterns": {"if": {"patternProperties": {"^a": {"type": "string"}}},
                 "unevaluatedProperties": False},
    "properties": {"if": {"properties": {"foo": {"const": 1}}, "required": ["foo"]},
                   "properties": {"bar": True}, "unevaluatedProperties": {"type": "string"}},
}
SCHEMAS = {**{f"not_{k}": {"not": v} for k, v in NEGATED.items()}, **CONDITIONS}


@pytest.mark.parametrize("name", SCHEMAS)
def test_agrees_with_jsonschema(name):
  schema = SCHEMAS[name]
  dfa = compile_byte_dfa(cd.JsonSchema(schema, implied_types=False).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  for instance in _instances():
    # Some order of the members is written when valid (objects may keep a member order),
    # none when invalid.
    orders = (itertools.permutations(instance.items()) if isinstance(instance, dict)
              else [None])
    texts = [json.dumps(instance if o is None else dict(o), separators=(",", ":")).encode()
             for o in orders]
    assert any(map(dfa.accepts, texts)) == validator.is_valid(instance), (name, instance)


@pytest.mark.parametrize("inner", [
    {"anyOf": [{"properties": {"a": {"type": "integer"}}}], "unevaluatedProperties": False},
    {"$ref": "#/$defs/a", "unevaluatedProperties": False},
])
def test_negated_dynamic_evaluation_is_refused(inner):
  schema = {"not": inner, "$defs": {"a": {"properties": {"a": True}}}}
  with pytest.raises(cd.UnsupportedSchemaError,
                     match=r"not at #/not/unevaluatedProperties cannot be enforced exactly"):
    cd.JsonSchema(schema).to_ir()

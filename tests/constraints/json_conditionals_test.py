"""`allOf` chains of `if`/`then`/`else` selecting on one property (`_json_conditionals`):
split by the property's value, checked against `jsonschema` on enumerated objects."""

import itertools
import json

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _json_conditionals
from constrained_decoding.testing import reference_accepts


def _when(value, then, *, required=True, other=None, otherwise=None, key="kind"):
  condition = {"properties": {key: {"const": value} if not isinstance(value, list)
                              else {"enum": value}}}
  if required:
    condition["required"] = [key]
  if other is not None:
    condition["properties"]["size"] = other
  part = {"if": condition, "then": then}
  if otherwise is not None:
    part["else"] = otherwise
  return part


_NEEDS_SIZE = {"required": ["size"]}
_SMALL = {"properties": {"size": {"maximum": 1}}}
_CASES = {
    # Eight conditionals with `required`: 3^8 branches if multiplied out.
    "eight-required": [_when(v, {"properties": {"size": {"minimum": i}}})
                       for i, v in enumerate("abcdefgh")],
    "enum-and-else": [_when(["a", "b"], _NEEDS_SIZE, otherwise=_SMALL),
                      _when("b", _SMALL), _when("c", {"properties": {"size": False}})],
    "not-required": [_when("a", _NEEDS_SIZE, required=False), _when("b", _SMALL),
                     _when(None, {"properties": {"size": {"const": 0}}})],
    "typed-selectors": [{"if": {"properties": {"kind": {"const": "a", "type": "string"}},
                                "required": ["kind"]}, "then": _NEEDS_SIZE},
                        {"if": {"properties": {"kind": {"enum": ["b", None],
                                                        "type": ["string", "null"]}}},
                         "then": _SMALL, "else": {"properties": {"size": {"type": "integer"}}}}],
    "other-conditions": [_when("a", _NEEDS_SIZE, other={"type": "integer"},
                               otherwise={"properties": {"size": {"type": "string"}}}),
                         _when("a", _SMALL), _when(True, _NEEDS_SIZE)],
}
_KINDS = [None, "a", "b", "c", "h", "z", True, 0]
_SIZES = [None, 0, 1, 2, 5, "s"]


def _objects():
  for kind, size in itertools.product([*_KINDS, "absent"], [*_SIZES, "absent"]):
    value = {}
    if kind != "absent":
      value["kind"] = kind
    if size != "absent":
      value["size"] = size
    yield value


@pytest.mark.parametrize("name", sorted(_CASES))
def test_split_conditionals_match_jsonschema(name):
  schema = {"type": "object", "properties": {"kind": {}, "size": {}},
            "additionalProperties": False, "allOf": _CASES[name]}
  split = _json_conditionals.split_conditionals(schema, objects_only=True)
  assert split is not schema and "anyOf" in json.dumps(split)  # The rewrite applied.
  dfa = compile_byte_dfa(cd.JsonSchema(schema, property_order="schema", implied_types=False).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  for value in _objects():
    text = json.dumps(value, separators=(",", ":")).encode()
    assert dfa.accepts(text) == validator.is_valid(value), (name, value)


def test_own_conditional_joins_the_chain():
  schema = {"type": "object", "properties": {"kind": {}, "size": {}},
            **_when("a", _NEEDS_SIZE), "allOf": [_when("b", _SMALL)]}
  split = _json_conditionals.split_conditionals(schema, objects_only=True)
  assert "if" not in split
  dfa = compile_byte_dfa(cd.JsonSchema(schema, property_order="schema", implied_types=False).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  for value in _objects():
    text = json.dumps(value, separators=(",", ":")).encode()
    assert dfa.accepts(text) == validator.is_valid(value), value


@pytest.mark.parametrize("name", sorted(_CASES))
def test_other_types_pass_the_conditions_vacuously(name):
  schema = {"allOf": _CASES[name]}  # No type: strings, arrays, ... are valid too.
  assert "anyOf" in json.dumps(_json_conditionals.split_conditionals(schema, False))
  dfa = compile_byte_dfa(cd.JsonSchema(schema, property_order="schema",
                                       implied_types=False).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  for value in [*_objects(), None, 0, "a", [], [1], True]:
    text = json.dumps(value, separators=(",", ":")).encode()
    assert dfa.accepts(text) == validator.is_valid(value), (name, value)


@pytest.mark.parametrize("schema, objects_only", [
    ({"allOf": [_when(1, _SMALL), _when(2, _SMALL)]}, True),  # Numbers: 1 == 1.0.
    ({"allOf": [_when("a", _SMALL), {"if": {"properties": {"kind": {
        "const": "b", "type": "integer"}}}, "then": _SMALL}]}, True),  # Type excludes it.
    ({"allOf": [_when("a", _SMALL), {"if": {"properties": {"kind": {"minLength": 1}}},
                                     "then": _SMALL}]}, True),  # One selector only.
    ({"allOf": [_when("a", _SMALL), _when("b", _SMALL)],
      "unevaluatedProperties": False}, True),
])
def test_left_alone_where_the_split_would_not_be_exact(schema, objects_only):
  assert _json_conditionals.split_conditionals(schema, objects_only) is schema


def test_sixteen_conditionals_compile_for_a_vocabulary(byte_compiler):
  # CloudFormation's engine/version rules: was "allOf ... cannot be merged" (product > 64).
  schema = {"type": "object", "required": ["Engine"],
            "properties": {"Engine": {"type": "string"}, "Version": {"type": "string"}},
            "allOf": [_when(f"e{i}", {"properties": {"Version": {"enum": [f"{i}.0", f"{i}.1"]}}},
                            key="Engine")
                      for i in range(16)]}
  tables = byte_compiler.compile(cd.JsonSchema(schema))
  for text, valid in (('{"Engine":"e3","Version":"3.1"}', True), ('{"Engine":"e3"}', True),
                      ('{"Engine":"e3","Version":"4.0"}', False),
                      ('{"Engine":"x","Version":"anything"}', True)):
    assert reference_accepts(tables, list(text.encode())) == valid, text

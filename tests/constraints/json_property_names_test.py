"""`propertyNames` with any string schema (`_json_scalar_schemas.name_language`):
`$ref`, allOf/anyOf/oneOf/not/if-then-else over key languages, boolean subschemas,
keywords for other types and unknown keywords ignored.

Oracle: `jsonschema` (draft 2020-12). Objects with keys over a small alphabet,
written canonically, are accepted exactly when valid.
"""

import json

import hypothesis
import jsonschema
import pytest
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa

_DEFS = {"short": {"maxLength": 1}, "ab": {"enum": ["a", "b", "ab"]},
         "loop": {"anyOf": [{"$ref": "#/$defs/loop"}, {"const": "a"}]}}

# (name, propertyNames schema, extra object keywords).
CASES = [
    ("not-const", {"not": {"const": "x"}}, {}),
    ("not-pattern-enum", {"not": {"anyOf": [{"pattern": "^a"}, {"enum": ["b", "xx"]}]}}, {}),
    ("any-of-unknown-format", {"anyOf": [{"format": "python-module-name"}, {"const": ""}]},
     {}),
    ("any-of", {"anyOf": [{"pattern": "^a+$"}, {"const": ""}, {"maxLength": 1,
                                                              "minLength": 1}]}, {}),
    ("unknown-keyword", {"cfnLint": ["E3012"], "pattern": "^[ab]+$"}, {}),
    ("all-of", {"allOf": [{"pattern": "a"}, {"pattern": "b"}, {"maxLength": 2}]}, {}),
    ("one-of", {"oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]}, {}),
    ("one-of-three", {"oneOf": [{"minLength": 2}, {"pattern": "x"}, {"const": "a"}]}, {}),
    ("if-then-else", {"if": {"minLength": 2}, "then": {"pattern": "^a"},
                      "else": {"enum": ["b", ""]}}, {}),
    ("if-then", {"if": {"pattern": "x"}, "then": {"maxLength": 1}}, {}),
    ("if-else", {"if": {"pattern": "x"}, "else": {"const": "ab"}}, {}),
    ("then-alone", {"then": False, "maxLength": 2}, {}),
    ("ref", {"$ref": "#/$defs/ab"}, {}),
    ("ref-siblings", {"$ref": "#/$defs/short", "not": {"const": "b"}}, {}),
    ("ref-in-not", {"not": {"$ref": "#/$defs/short"}}, {}),
    ("booleans", {"anyOf": [False, {"allOf": [True, {"const": "bx"}]}]}, {}),
    ("not-true", {"not": True}, {}),
    ("not-false", {"not": False, "minLength": 3}, {}),
    ("other-types", {"minimum": 3, "items": {"type": "integer"}, "required": ["a"],
                     "maxLength": 2, "minItems": 9}, {}),
    ("type-not-string", {"anyOf": [{"type": "integer"}, {"const": "a"}]}, {}),
    ("type-list", {"type": ["string", "null"], "not": {"maxLength": 1}}, {}),
    ("annotations", {"title": "t", "description": "d", "not": {"const": "a"}}, {}),
    ("with-properties", {"not": {"pattern": "^b"}},
     {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),
    ("with-additional", {"oneOf": [{"pattern": "a"}, {"pattern": "x"}]},
     {"properties": {"ax": {"type": "integer"}}, "additionalProperties": {"const": 1}}),
    ("with-patterns", {"not": {"enum": ["ab", "x"]}},
     {"patternProperties": {"^a": {"const": 0}}, "additionalProperties": False}),
]

_KEYS = st.text(alphabet="abx", max_size=3)
_OBJECTS = st.dictionaries(_KEYS, st.integers(0, 1), max_size=3)
_DFAS = {}


def _schema(names, extra) -> dict:
  return {"type": "object", "propertyNames": names, "$defs": _DEFS, **extra}


def _dfa(schema):
  key = json.dumps(schema)
  if key not in _DFAS:
    _DFAS[key] = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  return _DFAS[key]


@pytest.mark.parametrize("name, names, extra", CASES, ids=[c[0] for c in CASES])
@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(value=_OBJECTS)
def test_objects_are_accepted_exactly_when_valid(name, names, extra, value):
  schema = _schema(names, extra)
  valid = jsonschema.Draft202012Validator(schema).is_valid(value)
  text = json.dumps(value, separators=(",", ":"))
  assert _dfa(schema).accepts(text.encode()) == valid, (text, valid)


@pytest.mark.parametrize("name, names, extra", CASES, ids=[c[0] for c in CASES])
def test_every_one_key_object_is_accepted_exactly_when_valid(name, names, extra):
  schema = _schema(names, extra)
  validator = jsonschema.Draft202012Validator(schema)
  keys = [""] + [a + b + c for a in "abx" for b in ("", *"abx") for c in ("", *"abx")
                 if b or not c]
  for key in keys:
    for value in (0, 1):
      obj = {key: value}
      text = json.dumps(obj, separators=(",", ":"))
      assert _dfa(schema).accepts(text.encode()) == validator.is_valid(obj), text


def test_unknown_keywords_and_formats_are_recorded_as_annotations():
  spec = cd.JsonSchema({"type": "object", "propertyNames": {
      "cfnLint": ["E3012"], "pattern": "^[a-z]+$",
      "anyOf": [{"format": "python-module-name"}, {"const": ""}]}})
  assert spec.ignored_keywords() == ("#/propertyNames/cfnLint",
                                     "#/propertyNames/anyOf/0/format")
  quiet = cd.JsonSchema({"type": "object", "propertyNames": {
      "description": "d", "minimum": 1, "items": {}, "pattern": "^a"}})
  assert quiet.ignored_keywords() == ()


def test_ref_cycle_is_refused_typed():
  schema = {"type": "object", "propertyNames": {"$ref": "#/$defs/loop"}, "$defs": _DEFS}
  with pytest.raises(cd.UnsupportedSchemaError, match=r"propertyNames.*#/\$defs/loop"):
    cd.JsonSchema(schema).to_ir()


def test_bad_applicator_values_are_schema_errors():
  with pytest.raises(cd.SchemaError, match="anyOf at #/propertyNames/anyOf"):
    cd.JsonSchema({"type": "object", "propertyNames": {"anyOf": []}}).to_ir()
  with pytest.raises(cd.SchemaError, match="not a string"):
    cd.JsonSchema({"type": "object", "propertyNames": {"$ref": 3}}).to_ir()

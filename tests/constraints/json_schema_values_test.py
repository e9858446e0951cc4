"""JSON Schema values: `multipleOf` (exact fractions), `enum` filtered by string and
number keywords, `uniqueItems` over a few values, and `implied_types=False`; oracles
`jsonschema`, `fractions` and random walks.
"""

import fractions
import json
import random
import re

import hypothesis
import jsonschema
import pytest

from constrained_decoding.testing import random_accepted_bytes
from hypothesis import strategies as st

import constrained_decoding as cd

from json_schema_cases import (  # pylint: disable=import-error  (same directory)
    _dfa, _validate)


@pytest.mark.parametrize("schema", [
    {"type": "integer", "multipleOf": 5},
    {"type": "integer", "multipleOf": 2.5, "minimum": -20, "maximum": 20},
    {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": -1, "maximum": 2.5},
    {"type": "number", "multipleOf": 0.01},
    {"type": "number", "multipleOf": 1.5, "minimum": 0.5},
    {"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]},
], ids=["int-5", "int-2.5-bounded", "quarter-bounded", "cents", "1.5-min", "allOf-lcm"])
def test_multiple_of_against_jsonschema(schema):
  """Every decimal text in a grid of candidates: accepted exactly when it is in the
  generated number format, jsonschema validates the rest of the schema, and the value
  is a multiple of every step (exact fractions: float `%` is not)."""
  dfa = _dfa(cd.JsonSchema(schema))
  parts = [schema, *schema.get("allOf", [])]
  steps = [fractions.Fraction(str(p["multipleOf"])) for p in parts if "multipleOf" in p]
  strip = lambda p: {k: v for k, v in p.items() if k != "multipleOf"}  # pylint: disable=unnecessary-lambda-assignment
  rest = strip(schema) | ({"allOf": [strip(p) for p in schema["allOf"]]}
                          if "allOf" in schema else {})
  validator = jsonschema.Draft202012Validator(rest)
  integer = any(p.get("type") == "integer" for p in parts)
  candidates = set()
  for whole in range(-25, 26):
    for fraction in ("", ".0", ".00", ".01", ".1", ".25", ".5", ".50", ".75", ".125", ".3"):
      candidates.add(f"{whole}{fraction}")
  candidates |= {"-0", "-0.0", "1e2", "007", "0.250", "-0.25", "-0.5"}
  accepted = 0
  for text in sorted(candidates):
    canonical = bool(re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?", text)) and not re.fullmatch(
        r"-0(\.0*)?", text) and not (integer and "." in text)  # Integers: no fraction.
    expected = canonical and validator.is_valid(int(text) if integer else float(text)) and all(
        (fractions.Fraction(text) / step).denominator == 1 for step in steps)
    assert dfa.accepts(text.encode()) == expected, text
    accepted += expected
  assert accepted >= 5


def test_multiple_of_errors():
  with pytest.raises(cd.SchemaError, match=r"multipleOf 0 at #/multipleOf is not positive"):
    cd.JsonSchema({"type": "number", "multipleOf": 0}).to_ir()
  with pytest.raises(cd.UnsupportedSchemaError, match=r"multipleOf 123457 at #/multipleOf"):
    cd.JsonSchema({"type": "integer", "multipleOf": 123457}).to_ir()


_ENUM_VALUES = st.one_of(st.integers(-20, 20),
                         st.sampled_from([0.5, 2.5, 1.25, -0.75, 3.0, 0.3, 1.1]),
                         st.text(alphabet="ab\u00e9-", max_size=4), st.booleans(), st.none())


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(values=st.lists(_ENUM_VALUES, min_size=1, max_size=6, unique_by=json.dumps),
                  keywords=st.sampled_from([
                      {"minLength": 2, "pattern": "a"}, {"maxLength": 1, "format": "date"},
                      {"minimum": 0, "exclusiveMaximum": 2.5},
                      {"multipleOf": 0.25, "maximum": 3}, {"type": "number", "minimum": 1},
                      {"exclusiveMinimum": -1, "maxLength": 3, "pattern": "^[ab]"}]))
def test_enum_is_filtered_by_string_and_number_keywords(values, keywords):
  schema = {"enum": values, **keywords}
  validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
  valid = [v for v in values if validator.is_valid(v)]
  if not valid:
    with pytest.raises(cd.SchemaError, match="accepts no JSON value"):
      cd.JsonSchema(schema).to_ir()
    return
  dfa = _dfa(cd.JsonSchema(schema))
  valid_texts = {json.dumps(v) for v in valid}  # Not `in`: True == 1 in Python.
  for v in values:
    text = json.dumps(v, ensure_ascii=False).encode()
    assert dfa.accepts(text) == (json.dumps(v) in valid_texts), (schema, v)



_UNIQUE_ITEMS = [
    {"enum": ["red", "green", "blue"]},
    {"type": "boolean"},
    {"type": "integer", "minimum": 1, "maximum": 3},
    {"enum": [1, 1.5, None, "1", [1, 2], {"a": [True]}]},
]


@pytest.mark.parametrize("policy", ["compact", "single"])
@pytest.mark.parametrize("bounds", [{}, {"minItems": 1, "maxItems": 2}], ids=["any", "1-2"])
@pytest.mark.parametrize("items", _UNIQUE_ITEMS, ids=range(len(_UNIQUE_ITEMS)))
def test_unique_items_walks_validate(items, bounds, policy):
  schema = {"type": "array", "items": items, "uniqueItems": True, **bounds}
  dfa = _dfa(cd.JsonSchema(schema, policy))
  rng = random.Random(f"{policy}{bounds}")
  seen = set()
  for _ in range(40):
    text = random_accepted_bytes(dfa, rng, soft_limit=80)
    _validate(json.loads(text), schema)
    seen.add(len(json.loads(text)))
  assert len(seen) > 1  # Arrays of several sizes: not vacuous.


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(data=st.data())
def test_unique_items_agree_with_jsonschema(data):
  items = data.draw(st.sampled_from(_UNIQUE_ITEMS))
  values = [json.loads(t) for t in ('"red"', '"green"', '"blue"', "true", "false", "1",
                                    "2", "3", "1.5", "null", '"1"', "[1,2]", '{"a":[true]}')]
  array = data.draw(st.lists(st.sampled_from(values), max_size=5))
  schema = {"type": "array", "items": items, "uniqueItems": True, "maxItems": 4}
  text = json.dumps(array, ensure_ascii=False, separators=(",", ":")).encode()
  valid = jsonschema.Draft202012Validator(schema).is_valid(array)
  assert _dfa(cd.JsonSchema(schema)).accepts(text) == valid, (items, array)


def test_unique_items_merge_under_all_of_and_lenient():
  schema = {"allOf": [{"type": "array", "items": {"type": "boolean"}},
                      {"uniqueItems": True}, {"uniqueItems": False}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b"[true,false]") and not dfa.accepts(b"[true,true]")
  lenient = cd.JsonSchema(
      {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True}, lenient=True)
  assert lenient.ignored_keywords() == ("#/uniqueItems",)
  assert _dfa(lenient).accepts(b'["a","a"]')  # Ignored: wider, as documented.


@pytest.mark.parametrize("schema", [
    {"minLength": 2}, {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"minimum": 3, "maxItems": 1}, {"not": {"type": "string"}, "maxLength": 1},
])
def test_implied_types_off_follows_the_specification(schema):
  validator = jsonschema.Draft202012Validator(schema)
  exact = _dfa(cd.JsonSchema(schema, implied_types=False))
  implied = _dfa(cd.JsonSchema(schema))
  for value in [12, -1, 3.5, "x", "xyz", None, True, [], [1, 2], {}, {"a": 1}, {"a": "1"}]:
    text = json.dumps(value, separators=(",", ":")).encode()
    assert exact.accepts(text) == validator.is_valid(value), text
    assert not implied.accepts(text) or validator.is_valid(value), text

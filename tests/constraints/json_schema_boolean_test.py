"""Boolean structure of JSON Schema: not, if/then/else, exact oneOf, contains,
dependentSchemas (`constraints/_json_negation.py`, `constraints/_difference.py`).

Oracle: `jsonschema` (draft 2020-12). Every text a random walk through the automaton
produces must validate (soundness); on small random JSON values, written canonically
(one spelling per value, as the lowering writes them), the automaton accepts exactly the
valid ones (no narrowing applies to these schemas: the test would catch one).
"""

import json
import random

import hypothesis
import jsonschema
import pytest
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _difference
from constrained_decoding.constraints import _json_negation
from constrained_decoding.testing import random_accepted_bytes

_FORMATS = jsonschema.FormatChecker()
OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "additionalProperties": False}

# (name, schema): every value in `_values()` is accepted exactly when it is valid.
EXACT = [
    ("not-type", {"not": {"type": "string"}}),
    ("not-integer", {"type": "number", "not": {"type": "integer"}}),
    ("not-enum", {"type": "integer", "not": {"enum": [1, 2, 3]}}),
    ("not-const-string", {"type": "string", "not": {"const": "ab"}, "maxLength": 3}),
    ("not-const-number", {"type": "number", "not": {"const": 2.5}}),
    ("not-multiple", {"type": "number", "not": {"multipleOf": 2}, "minimum": -10,
                      "maximum": 10}),
    ("not-bounds", {"not": {"minimum": 0, "exclusiveMaximum": 5}}),
    ("not-lengths", {"type": "string", "not": {"minLength": 1, "maxLength": 2}}),
    ("not-required", {**OBJECT, "not": {"required": ["a"]}}),
    ("not-property", {**OBJECT, "not": {"properties": {"a": {"minimum": 3}}}}),
    ("not-any-of", {"not": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}),
    ("not-all-of", {"type": "integer", "not": {"allOf": [{"minimum": 2}, {"maximum": 4}]}}),
    ("not-not", {"not": {"not": {"type": "boolean"}}}),
    ("not-items", {"type": "array", "items": {"type": "integer"},
                   "not": {"items": {"minimum": 0}}}),
    ("not-min-items", {"type": "array", "not": {"minItems": 2}}),
    ("not-one-of", {"type": "integer", "not": {"oneOf": [{"minimum": 3}, {"maximum": 5}]}}),
    ("one-of-overlap", {"oneOf": [{"type": "integer"}, {"minimum": 2}]}),
    ("one-of-three", {"type": "integer", "oneOf": [{"multipleOf": 2}, {"multipleOf": 3},
                                                   {"maximum": 0}]}),
    ("one-of-disjoint", {"oneOf": [{"type": "string"}, {"type": "boolean"}]}),
    ("if-then-else", {**OBJECT, "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
                      "then": {"required": ["b"]}, "else": {"not": {"required": ["b"]}}}),
    ("if-then", {"type": "integer", "if": {"minimum": 10}, "then": {"multipleOf": 5}}),
    ("if-else", {"type": "integer", "if": {"minimum": 10}, "else": {"maximum": 0}}),
    ("dependent-schemas", {**OBJECT, "dependentSchemas": {"a": {"required": ["b"]}}}),
    ("contains", {"type": "array", "contains": {"type": "string"}}),
    ("min-contains", {"type": "array", "items": {"type": "integer"},
                      "contains": {"minimum": 5}, "minContains": 2}),
    ("max-contains", {"type": "array", "items": {"type": "integer"},
                      "contains": {"minimum": 5}, "maxContains": 1}),
    ("contains-zero", {"type": "array", "contains": {"type": "null"}, "minContains": 0,
                       "maxContains": 1}),
    ("not-contains", {"type": "array", "not": {"contains": {"type": "null"}}}),
    ("not-dependent-required", {**OBJECT, "not": {"dependentRequired": {"a": ["b"]}}}),
    ("not-prefix", {"type": "array", "items": {"type": "integer"},
                    "not": {"prefixItems": [{"maximum": 0}]}}),
    ("ref", {"$defs": {"small": {"type": "integer", "maximum": 3}},
             "type": "integer", "not": {"$ref": "#/$defs/small"}}),
    ("not-pattern", {"type": "string", "not": {"pattern": "^a"}}),
    ("one-of-patterns", {"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]}),
    ("not-format", {"type": "string", "not": {"format": "date"}}),
    ("not-unknown-format", {"type": "string", "not": {"minLength": 2, "format": "color"}}),
]

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-12, 12),
    st.sampled_from([2.5, -0.5, 7.25, 0.1, 1e3]),
    st.sampled_from(["", "a", "ab", "abc", "x", "ba", "b", "2024-02-29", "2023-02-29"]))
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2)),
    max_leaves=4)


def _canonical(value) -> str:
  """The spelling the lowering writes: compact, decimal numbers without exponent."""
  if isinstance(value, float) and not isinstance(value, bool):
    return _difference.canonical_number(value)
  if isinstance(value, list):
    return "[" + ",".join(_canonical(v) for v in value) + "]"
  if isinstance(value, dict):
    return "{" + ",".join(f"{json.dumps(k)}:{_canonical(v)}" for k, v in value.items()) + "}"
  return json.dumps(value, ensure_ascii=False)


_DFAS = {}


def _dfa(schema):
  key = json.dumps(schema)
  if key not in _DFAS:
    _DFAS[key] = compile_byte_dfa(cd.JsonSchema(schema, free_form_depth=3).to_ir())
  return _DFAS[key]


@pytest.mark.parametrize("name, schema", EXACT, ids=[n for n, _ in EXACT])
def test_random_walks_validate(name, schema):
  validator = jsonschema.Draft202012Validator(schema, format_checker=_FORMATS)
  dfa = _dfa(schema)
  rng = random.Random(name)
  for _ in range(60):
    text = random_accepted_bytes(dfa, rng, soft_limit=60).decode()
    assert validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize("name, schema", EXACT, ids=[n for n, _ in EXACT])
@hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
@hypothesis.given(value=_VALUES)
def test_canonical_values_are_accepted_exactly_when_valid(name, schema, value):
  valid = jsonschema.Draft202012Validator(schema, format_checker=_FORMATS).is_valid(value)
  text = _canonical(value)
  assert _dfa(schema).accepts(text.encode()) == valid, (text, valid)


def test_not_excludes_every_spelling_it_writes():
  # Only canonical numbers are written under `not`: 2.50, 25e-1 or 2.5e0 (all 2.5) never.
  dfa = _dfa({"type": "number", "not": {"const": 2.5}})
  assert dfa.accepts(b"2.51") and dfa.accepts(b"2") and not dfa.accepts(b"2.5")
  assert not any(dfa.accepts(t) for t in (b"2.50", b"25e-1", b"2.5e0", b"-0", b"1.0"))
  strings = _dfa({"type": "string", "not": {"const": "a"}})
  assert not strings.accepts(b'"\\u0061"') and strings.accepts(b'"b"')


def test_overlapping_one_of_rejects_values_of_two_branches():
  dfa = _dfa({"oneOf": [{"type": "integer"}, {"minimum": 2}]})
  assert dfa.accepts(b"1") and dfa.accepts(b"2.5") and not dfa.accepts(b"3")


def test_canonical_number_spelling():
  cases = {0: "0", -0.0: "0", 10: "10", 2.5: "2.5", 1e20: "100000000000000000000",
           -0.125: "-0.125", 0.1: "0.1", 1.0: "1"}
  for value, text in cases.items():
    assert _difference.canonical_number(value) == text


@pytest.mark.parametrize("schema", [{"minimum": 1}, {"enum": [4, "a", None]},
                                    {"type": "integer"}, {"required": ["a"]},
                                    {"not": {"multipleOf": 3}}])
def test_negation_is_an_involution_on_values(schema):
  # negate(negate(S)) accepts only values S accepts, and all that S's own lowering does
  # (which may be narrower: `{"minimum": 1}` alone is lowered as numbers only).
  no_refs = lambda ref: pytest.fail(f"unexpected $ref {ref}")  # noqa: E731
  twice = _json_negation.negate(_json_negation.negate(schema, no_refs), no_refs)
  once, again = _dfa(schema), _dfa(twice)
  validator = jsonschema.Draft202012Validator(schema, format_checker=_FORMATS)
  for value in [*range(-3, 9), 2.5, "a", "b", None, True, [], {}, {"a": 1}]:
    text = _canonical(value).encode()
    assert not once.accepts(text) or again.accepts(text), text
    assert not again.accepts(text) or validator.is_valid(value), text


def test_annotations_inside_not_are_ignored():
  dfa = _dfa({"type": "string", "not": {"const": "a", "nullable": True, "x-kind": 1,
                                        "description": "no a"}})
  assert dfa.accepts(b'"b"') and not dfa.accepts(b'"a"')

"""`contains` (with `minContains`/`maxContains`) next to `minItems`/`maxItems`
(`_json_array_schemas._lower_contains`: an automaton over items and matches written).

Oracle: `jsonschema` (draft 2020-12) on every array of up to 5 items over a few values,
written canonically: accepted exactly when valid.
"""

import itertools
import json

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _json_array_schemas

_POSITIVE = {"type": "integer", "minimum": 1}

# (name, schema): every small array is accepted exactly when it is valid.
CASES = [
    ("min-items", {"type": "array", "minItems": 1, "contains": _POSITIVE}),
    ("min-items-3", {"type": "array", "minItems": 3, "contains": _POSITIVE}),
    ("max-items", {"type": "array", "maxItems": 2, "contains": _POSITIVE}),
    ("min-max-items", {"type": "array", "minItems": 2, "maxItems": 4,
                       "contains": _POSITIVE}),
    ("min-contains", {"type": "array", "minItems": 3, "contains": _POSITIVE,
                      "minContains": 2}),
    ("min-contains-over-min-items", {"type": "array", "minItems": 1, "maxItems": 4,
                                     "contains": _POSITIVE, "minContains": 3}),
    ("max-contains", {"type": "array", "minItems": 2, "contains": _POSITIVE,
                      "maxContains": 1}),
    ("max-contains-max-items", {"type": "array", "maxItems": 4, "contains": _POSITIVE,
                                "minContains": 1, "maxContains": 2}),
    ("max-contains-at-max-items", {"type": "array", "maxItems": 3, "contains": _POSITIVE,
                                   "maxContains": 3}),
    ("zero-min-contains", {"type": "array", "minItems": 2, "maxItems": 3,
                           "contains": _POSITIVE, "minContains": 0, "maxContains": 1}),
    ("zero-min-contains-free", {"type": "array", "maxItems": 2, "contains": _POSITIVE,
                                "minContains": 0, "maxContains": 5}),
    ("items", {"type": "array", "items": {"type": "integer"}, "minItems": 2,
               "maxItems": 4, "contains": {"minimum": 1}, "maxContains": 2}),
    ("items-contains-null", {"type": "array", "items": {"type": ["integer", "null"]},
                             "minItems": 1, "contains": {"type": "null"},
                             "minContains": 1, "maxContains": 1}),
    ("contradiction-min", {"type": "array", "maxItems": 1, "contains": _POSITIVE,
                           "minContains": 2}),
    ("contradiction-items", {"type": "array", "minItems": 3, "maxItems": 2,
                             "contains": _POSITIVE}),
    ("contains-false", {"type": "array", "minItems": 1, "contains": False,
                        "minContains": 0, "maxContains": 0}),
    ("contains-true", {"type": "array", "minItems": 1, "maxItems": 3, "contains": True,
                       "minContains": 2}),
    ("aws-like", {"type": "array", "minItems": 1, "items": {"type": "object"},
                  "contains": {"type": "object", "required": ["a"]}}),
]

_VALUES = [0, 1, None, {"a": 0}]
_DFAS = {}


def _dfa(schema):
  key = json.dumps(schema)
  if key not in _DFAS:
    _DFAS[key] = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  return _DFAS[key]


def _arrays(max_len: int = 5):
  for n in range(max_len + 1):
    yield from (list(a) for a in itertools.product(_VALUES, repeat=n))


@pytest.mark.parametrize("name, schema", CASES, ids=[n for n, _ in CASES])
def test_small_arrays_are_accepted_exactly_when_valid(name, schema):
  validator = jsonschema.Draft202012Validator(schema)
  try:
    dfa = _dfa(schema)
  except cd.SchemaError:  # Accepts nothing: then no array may be valid.
    assert not any(validator.is_valid(a) for a in _arrays())
    return
  for array in _arrays():
    text = json.dumps(array, separators=(",", ":"))
    assert dfa.accepts(text.encode()) == validator.is_valid(array), text


def test_aws_shape_compiles_without_lenient():
  schema = {"type": "array", "minItems": 1, "items": {"type": "string"},
            "contains": {"const": "sts:AssumeRole"}}
  spec = cd.JsonSchema(schema)
  dfa = compile_byte_dfa(spec.to_ir())
  assert spec.ignored_keywords() == ()
  assert dfa.accepts(b'["x","sts:AssumeRole"]') and not dfa.accepts(b'["x"]')
  assert not dfa.accepts(b"[]")


def test_large_product_is_a_budget_error_naming_the_keywords():
  schema = {"type": "array", "maxItems": 200, "contains": _POSITIVE, "maxContains": 100}
  with pytest.raises(cd.CompileBudgetError,
                     match=r"contains at #/contains with maxContains 100 next to maxItems"
                           r" 200 at #/maxItems"):
    cd.JsonSchema(schema).to_ir()
  assert 201 * 101 > _json_array_schemas.MAX_CONTAINS_STATES


def test_min_contains_alone_stays_linear():
  # Without a second count the automaton is a chain: large minContains still compiles.
  schema = {"type": "array", "contains": {"const": 1}, "minContains": 5000}
  cd.JsonSchema(schema).to_ir()


@pytest.mark.parametrize("schema", [
    {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 1,
     "contains": {"const": 1}},
    {"type": "array", "prefixItems": [{"const": 1}, {"type": "string"}],
     "items": {"type": "integer"}, "contains": {"const": 1}, "minContains": 2,
     "maxContains": 3},
    {"type": "array", "prefixItems": [True, True, True], "maxItems": 2,
     "contains": {"const": 1}, "maxContains": 1},
])
def test_prefix_items_next_to_contains_matches_jsonschema(schema):
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  validator = jsonschema.Draft202012Validator(schema)
  for n in range(6):
    for instance in itertools.product([1, 2, "s"], repeat=n):
      text = json.dumps(list(instance), separators=(",", ":")).encode()
      assert dfa.accepts(text) == validator.is_valid(list(instance)), (schema, instance)


def test_contains_next_to_unique_items_is_still_refused():
  schema = {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True,
            "contains": {"const": 1}}
  with pytest.raises(cd.UnsupportedSchemaError, match="next to uniqueItems"):
    cd.JsonSchema(schema).to_ir()
  assert cd.JsonSchema(schema, lenient=True).ignored_keywords() == ("#/contains",)

"""`uniqueItems: true` against `jsonschema`, by exact enumeration of short arrays.

Arrays whose positions (`prefixItems`, then `items`) take a few values in all are an
automaton over the set of values used so far (`_json_array_schemas._lower_unique_array`):
every array over a small alphabet of values is checked both ways, and every text the
automaton accepts is listed and validated.
"""

import itertools
import json

import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata._byte_dfa import NO_STATE
from constrained_decoding.automata._fsa import compile_byte_dfa

_DRAFT7 = "http://json-schema.org/draft-07/schema#"
# Values the enumerated arrays are made of: those the schemas below allow, and others.
_VALUES = [True, False, None, 1, 2, 1.5, "a", "b", [1], {"k": 1}]

_PREFIXED = [
    # The suite's "uniqueItems with an array of items and additionalItems=false".
    {"prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "items": False},
    {"$schema": _DRAFT7, "items": [{"type": "boolean"}, {"type": "boolean"}],
     "additionalItems": False},
    # Prefix positions and the rest share values.
    {"prefixItems": [{"const": 1}], "items": {"enum": [1, 2, "a"]}},
    {"prefixItems": [{"enum": [True, None]}, {"type": "boolean"}],
     "items": {"enum": [None, "a", [1]]}},
    # maxItems ends the array inside or right after the prefix: the rest never counts.
    {"prefixItems": [{"type": "boolean"}, {"enum": [1, 2]}], "items": {"type": "string"},
     "maxItems": 2},
    {"prefixItems": [{"type": "boolean"}, {"type": "boolean"}, {"type": "boolean"}],
     "minItems": 1},
    # A prefix position no value meets ends every array before it.
    {"prefixItems": [{"enum": ["a", "b"]}, False], "items": {"const": 1}},
    {"prefixItems": [{"type": "boolean"}], "items": {"enum": [1, {"k": 1}]},
     "minItems": 2, "maxItems": 3},
    {"items": {"enum": [True, 1, "a", None]}, "minItems": 2},
]


def _schema(extra: dict) -> dict:
  return {"type": "array", "uniqueItems": True, **extra}


def _validator(schema: dict):
  draft = jsonschema.Draft7Validator if schema.get("$schema") == _DRAFT7 else (
      jsonschema.Draft202012Validator)
  return draft(schema)


def _accepted_texts(dfa, limit: int = 10_000) -> list[bytes]:
  """Every text of a DFA with a finite language (depth-first; fails past `limit`)."""
  out, stack = [], [(dfa.start, b"")]
  while stack:
    state, text = stack.pop()
    if dfa.accepting[state]:
      out.append(text)
    row = dfa.transitions[state]
    stack += [(int(row[b]), text + bytes([b])) for b in np.flatnonzero(row != NO_STATE)]
    assert len(out) + len(stack) < limit and len(text) < 200, "not a finite language"
  return out


@pytest.mark.parametrize("extra", _PREFIXED, ids=range(len(_PREFIXED)))
def test_prefixed_unique_arrays_agree_with_jsonschema(extra):
  schema = _schema(extra)
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  validator = _validator(schema)
  checked = valid = 0
  for n in range(5):
    for array in itertools.product(_VALUES, repeat=n):
      text = json.dumps(list(array), separators=(",", ":")).encode()
      expected = validator.is_valid(list(array))
      assert dfa.accepts(text) == expected, (schema, text)
      checked, valid = checked + 1, valid + expected
  assert valid > 1 and checked - valid > 1  # Both answers met: not vacuous.
  texts = _accepted_texts(dfa)
  assert texts
  for text in texts:  # Every text written is valid, whatever its size.
    assert validator.is_valid(json.loads(text)), (schema, text)


def test_whitespace_policies_keep_the_values_apart():
  schema = _schema({"prefixItems": [{"type": "boolean"}], "items": {"enum": [True, None]}})
  dfa = compile_byte_dfa(cd.JsonSchema(schema, "single").to_ir())
  assert dfa.accepts(b"[true, null]") and dfa.accepts(b"[false, true, null]")
  assert not dfa.accepts(b"[true, true]") and not dfa.accepts(b"[null, true]")
  validator = _validator(schema)
  for text in _accepted_texts(dfa):
    assert validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize("extra, where", [
    ({"prefixItems": [{"type": "boolean"}]}, "#/uniqueItems"),  # items: anything.
    ({"prefixItems": [{"type": "boolean"}], "items": {"type": "string"}}, "#/uniqueItems"),
    ({"prefixItems": [{"enum": [1, 2, 3, 4, 5]}], "items": {"enum": [6, 7, 8, 9]}},
     "#/uniqueItems"),  # Nine values in all.
])
def test_too_many_values_are_refused_by_place(extra, where):
  with pytest.raises(cd.UnsupportedSchemaError,
                     match=rf"uniqueItems at {where} needs items with at most 8 possible"
                           r" values, all positions together"):
    cd.JsonSchema(_schema(extra)).to_ir()

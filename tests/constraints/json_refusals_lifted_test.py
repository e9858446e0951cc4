"""Constructs of real schemas that used to be refused and now compile exactly.

* `enum`/`const` next to array or object keywords when no value of the enum is an array
  or object (cfn-lint's IAM `Booleans`: `{"enum": [...], "items": ...}` after `if`).
* `not` of `additionalProperties` (`_json_negation`: "an object with an undeclared key
  whose value violates it"), from `oneOf` made exact and from `not` itself.

Oracle: `jsonschema` on hand-written instances and on random JSON values, each checked
through the byte DFA of the whole `cd.JsonSchema` in its compact serialization.
"""

import itertools
import json
import random

import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa


def _dfa(schema):
  return compile_byte_dfa(cd.JsonSchema(schema).to_ir())


def _text(value) -> bytes:
  return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _orders(value) -> list:
  """`value`, and an object with its members in every order."""
  if not isinstance(value, dict):
    return [value]
  return [dict(p) for p in itertools.permutations(value.items())]


def _random_object(rng: random.Random, keys: list[str]) -> dict:
  values = [0, 1, 2.5, "x", "", True, None, [], [1], {}, {"a": 1}]
  return {rng.choice(keys): rng.choice(values) for _ in range(rng.randrange(4))}


def _check(schema, instances, *, accepted_valid_too: bool = True):
  """No invalid instance accepted; valid ones accepted (when `accepted_valid_too`)."""
  dfa = _dfa(schema)
  validator = jsonschema.Draft202012Validator(schema)
  seen = set()
  for instance in instances:
    valid = validator.is_valid(instance)
    if not valid:
      assert not any(dfa.accepts(_text(v)) for v in _orders(instance)), (schema, instance)
    elif accepted_valid_too:  # In some order: unions of objects keep schema order.
      assert any(dfa.accepts(_text(v)) for v in _orders(instance)), (schema, instance)
    seen.add(valid)
  return seen


def test_enum_next_to_items_when_no_value_is_an_array():
  schema = {"type": ["string", "boolean", "array"],
            "if": {"type": ["string", "boolean"]},
            "then": {"enum": ["true", "false", True, False]},
            "items": {"enum": ["true", "false", True, False], "type": ["string", "boolean"]}}
  seen = _check(schema, ["true", "false", True, False, "yes", 1, [], ["true", False],
                         ["no"], [1], None, {}])
  assert seen == {True, False}


def test_enum_next_to_items_with_an_array_value_is_still_refused():
  with pytest.raises(errors.UnsupportedSchemaError, match="items"):
    _dfa({"enum": [[1], "a"], "items": {"type": "string"}})


# (schema, keys random objects draw from).
_NOT_ADDITIONAL = [
    ({"type": "object", "not": {"properties": {"a": {}}, "additionalProperties": False}},
     ["a", "b", "c"]),
    ({"type": "object", "not": {"properties": {"a": {"type": "integer"}},
                                "additionalProperties": {"type": "string"}}},
     ["a", "b", "c"]),
    ({"not": {"type": "object", "additionalProperties": {"type": "integer"}}},
     ["a", "b"]),
    ({"oneOf": [
        {"properties": {"type": {"const": "disk"}, "device": {"type": "string"}},
         "required": ["type", "device"], "additionalProperties": False},
        {"properties": {"type": {"const": "disk"}, "label": {"type": "string"}},
         "required": ["type", "label"], "additionalProperties": False}]},
     ["type", "device", "label"]),
    ({"oneOf": [
        {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
         "additionalProperties": False},
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": False}]},
     ["a", "b", "c"]),
    ({"type": "object", "properties": {"v": {"not": {
        "type": "object", "properties": {"major": {"type": "integer"}},
        "additionalProperties": False}}}},
     ["v"]),
]


@pytest.mark.parametrize("schema, keys", _NOT_ADDITIONAL)
def test_not_additional_properties_against_jsonschema(schema, keys):
  rng = random.Random(json.dumps(schema))
  instances = [{}, {keys[0]: 1}, {keys[-1]: "x"}, {k: 1 for k in keys}, 3, "s", [],
               {"type": "disk", "device": "d"}, {"type": "disk", "label": "l"},
               {"type": "disk", "device": "d", "label": "l"}, {"a": 1, "b": 2},
               {"v": {"major": 1}}, {"v": {"major": 1, "minor": 2}}, {"v": 3}, {"v": {}}]
  instances += [_random_object(rng, keys) for _ in range(150)]
  instances += [{"v": _random_object(rng, ["major", "minor"])} for _ in range(30)]
  seen = _check(schema, instances)
  assert seen == {True, False}


def test_not_additional_properties_with_a_witness_before_other_members():
  # The undeclared key whose value violates may come first; a later member with the
  # same key would override it (`json.loads` keeps the last), so only declared keys
  # follow the witness in the language.
  dfa = _dfa({"not": {"type": "object", "properties": {"a": {}},
                      "additionalProperties": {"type": "integer"}}})
  assert dfa.accepts(b'{"b":"x","a":1}')
  assert dfa.accepts(b'{"c":1,"b":"x"}')
  assert not dfa.accepts(b'{"b":"x","b":1}')
  assert not dfa.accepts(b'{"a":"x"}')


def test_not_additional_properties_next_to_open_keys_is_refused_by_name():
  schema = {"oneOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                      {"properties": {"b": {}}, "additionalProperties": {"type": "string"}}]}
  with pytest.raises(errors.UnsupportedSchemaError, match="additionalProperties"):
    _dfa(schema)


@pytest.mark.parametrize("schema, keys", [
    ({"type": "object", "not": {"propertyNames": {"pattern": "^[a-c]+$"}}},
     ["a", "ab", "d", "a1", ""]),
    ({"oneOf": [{"type": "object", "propertyNames": {"maxLength": 2}},
                {"type": "object", "propertyNames": {"minLength": 2}}]},
     ["a", "ab", "abc", ""]),
    ({"oneOf": [  # Same members, so the negated side's extra keys cannot violate.
        {"type": "object", "propertyNames": {"pattern": "^.+$"},
         "additionalProperties": {"type": ["string", "null"]}, "required": ["v"]},
        {"type": "object", "propertyNames": {"pattern": "^.+$"},
         "additionalProperties": {"type": ["string", "null"]}}]},
     ["v", "w", ""]),
])
def test_not_property_names_against_jsonschema(schema, keys):
  rng = random.Random(json.dumps(schema))
  instances = [{}, {k: 1 for k in keys}, {keys[0]: "x"}, {keys[-1]: None}, 3]
  instances += [_random_object(rng, keys) for _ in range(120)]
  seen = _check(schema, instances)
  assert seen == {True, False}

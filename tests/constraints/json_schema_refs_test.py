"""JSON Schema references and combinators: `$ref` recursion bounds (`max_ref_depth`),
`allOf` merging, `anyOf` with sibling keywords, anchors, embedded resources, drafts and
`$recursiveRef`; against `jsonschema` and exact depth counts.
"""

import json
import random

import jsonschema
import pytest

from constrained_decoding.testing import random_accepted_bytes
from constrained_decoding.testing import reference_accepts

import constrained_decoding as cd

from json_schema_cases import (  # pylint: disable=import-error  (same directory)
    TREE, _dfa, _validate)


def _tree_depth(node) -> int:
  return 1 + max((_tree_depth(c) for c in node.get("children", [])), default=0)


def _tree(depth: int):
  return {"value": depth, "children": [_tree(depth - 1)] if depth > 1 else []}


@pytest.mark.parametrize("max_ref_depth", [1, 2, 3])
def test_recursive_ref_depth_bound(max_ref_depth):
  dfa = _dfa(cd.JsonSchema(TREE, max_ref_depth=max_ref_depth))
  for depth in range(1, 5):
    text = json.dumps(_tree(depth), separators=(",", ":"))
    assert dfa.accepts(text.encode()) == (depth <= max_ref_depth), (depth, text)
  rng = random.Random(max_ref_depth)
  for _ in range(20):
    assert _tree_depth(json.loads(random_accepted_bytes(dfa, rng, soft_limit=120))) <= max_ref_depth


def test_recursive_ref_in_any_of_keeps_the_base_case():
  schema = {"$defs": {"list": {"anyOf": [{"type": "null"}, {
      "type": "object",
      "properties": {"head": {"type": "integer"}, "tail": {"$ref": "#/$defs/list"}},
      "required": ["head", "tail"], "additionalProperties": False}]}}, "$ref": "#/$defs/list"}
  dfa = _dfa(cd.JsonSchema(schema, max_ref_depth=3))  # The final `null` is an expansion too.
  assert dfa.accepts(b"null") and dfa.accepts(b'{"head":1,"tail":{"head":2,"tail":null}}')
  assert not dfa.accepts(b'{"head":1,"tail":{"head":2,"tail":{"head":3,"tail":null}}}')


def test_all_of_with_ref_base_and_extension():
  schema = {"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}},
                               "required": ["id"]}},
            "allOf": [{"$ref": "#/$defs/base"},
                      {"properties": {"tag": {"enum": ["a", "b"]}}, "required": ["tag"]}]}
  dfa = _dfa(cd.JsonSchema(schema, strict_properties=True))
  assert dfa.accepts(b'{"id":1,"tag":"a"}') and dfa.accepts(b'{"tag":"a","id":1}')
  assert not dfa.accepts(b'{"id":1}') and not dfa.accepts(b'{"tag":"a"}')
  in_order = _dfa(cd.JsonSchema(schema, strict_properties=True, property_order="schema"))
  assert in_order.accepts(b'{"id":1,"tag":"a"}') and not in_order.accepts(b'{"tag":"a","id":1}')


def test_all_of_respects_each_sides_additional_properties():
  schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                       "additionalProperties": False},
                      {"properties": {"b": {"type": "integer"}}}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"a":1}') and dfa.accepts(b"{}")
  assert not dfa.accepts(b'{"a":1,"b":2}') and not dfa.accepts(b'{"b":2}')
  for text in (b'{"a":1}', b"{}"):
    _validate(json.loads(text), schema)


def test_all_of_intersects_types_and_bounds():
  schema = {"allOf": [{"type": ["integer", "string"], "minimum": 0},
                      {"type": "number", "maximum": 5}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert [dfa.accepts(str(n).encode()) for n in range(-2, 8)] == [0 <= n <= 5 for n in range(-2, 8)]
  assert not dfa.accepts(b'"a"') and not dfa.accepts(b"2.5")


def test_any_of_with_sibling_keywords_distributes():
  schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "additionalProperties": False, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
  dfa = _dfa(cd.JsonSchema(schema))
  assert dfa.accepts(b'{"a":1}') and dfa.accepts(b'{"b":1}') and dfa.accepts(b'{"a":1,"b":2}')
  assert not dfa.accepts(b"{}")


REF_CASES = [
    # (schema, accepted, rejected)
    ({"$defs": {"x": {"$anchor": "pos", "type": "integer", "minimum": 1}}, "$ref": "#pos"},
     ["5"], ["0", '"a"']),
    ({"$id": "http://example.com/root.json", "$defs": {"x": {"type": "integer"}},
      "$ref": "http://example.com/root.json#/$defs/x"}, ["5"], ['"a"']),
    ({"$id": "http://example.com/a/root.json",
      "$defs": {"int": {"$id": "int.json", "type": "integer"},
                "deep": {"$id": "sub/deep.json", "$defs": {"s": {"type": "string"}},
                         "$ref": "#/$defs/s"}},
      "properties": {"i": {"$ref": "int.json"}, "d": {"$ref": "sub/deep.json"},
                     "e": {"$ref": "http://example.com/a/sub/deep.json#/$defs/s"}},
      "type": "object"},
     ['{"i":1,"d":"x","e":"y"}'], ['{"i":"1"}', '{"d":1}', '{"e":1}']),
    ({"$schema": "http://json-schema.org/draft-07/schema#",
      "definitions": {"x": {"type": "integer"}}, "$ref": "#/definitions/x", "maximum": 3},
     ["5", "2"], ['"a"']),  # Draft 7: $ref overrides its siblings.
    ({"definitions": {"x": {"type": "integer"}}, "$ref": "#/definitions/x", "maximum": 3},
     ["2"], ["5"]),  # 2020-12: siblings apply too.
]


@pytest.mark.parametrize("schema, accepted, rejected", REF_CASES)
def test_references_resolve_as_the_specification_says(schema, accepted, rejected):
  draft = (jsonschema.Draft7Validator if "draft-07" in schema.get("$schema", "")
           else jsonschema.Draft202012Validator)
  validator = draft(schema)
  dfa = _dfa(cd.JsonSchema(schema))
  for text in accepted:
    assert validator.is_valid(json.loads(text)) and dfa.accepts(text.encode()), text
  for text in rejected:
    assert not validator.is_valid(json.loads(text)) and not dfa.accepts(text.encode()), text


def test_recursive_ref_resolves_statically_in_one_resource():
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  schema = {"$recursiveAnchor": True, "type": "object",
            "properties": {"k": {"$recursiveRef": "#"}}, "additionalProperties": False}
  tables = cd.Compiler(vocab).compile(cd.JsonSchema(schema))
  assert reference_accepts(tables, list(b'{"k":{"k":{}}}'))
  assert not reference_accepts(tables, list(b'{"k":{"j":{}}}'))
  # Another resource with the anchor, never entered: lowered per dynamic scope, where
  # the root (without $id) is the target on every path, for jsonschema too.
  other = {**schema, "$defs": {"o": {"$id": "other.json", "$recursiveAnchor": True}}}
  tables = cd.Compiler(vocab).compile(cd.JsonSchema(other))
  assert reference_accepts(tables, list(b'{"k":{"k":{}}}'))
  assert not reference_accepts(tables, list(b'{"k":{"j":{}}}'))
  assert jsonschema.Draft201909Validator(other).is_valid({"k": {"k": {}}})
  assert not jsonschema.Draft201909Validator(other).is_valid({"k": {"j": {}}})

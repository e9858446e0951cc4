"""`cd.JsonSchema(resources=...)`: `$ref`s to other documents, checked against `jsonschema`."""

import json

import jsonschema
import pytest
import referencing
import referencing.jsonschema

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex
from constrained_decoding.testing import reference_accepts

ROOT = {
    "$id": "https://example.com/root.json",
    "type": "object",
    "properties": {
        "x": {"$ref": "other.json#/$defs/x"},          # Relative, to a pointer.
        "whole": {"$ref": "https://example.com/other.json"},  # The whole resource.
        "tag": {"$ref": "other.json#tag"},              # An anchor in the resource.
        "alias": {"$ref": "https://example.com/alias.json#/$defs/x"},  # Its own $id.
    },
    "required": ["x"],
}
OTHER = {
    "$defs": {
        "x": {"type": "integer", "minimum": 3},
        "t": {"$anchor": "tag", "enum": ["a", "b"]},
        "local": {"type": "boolean"},
    },
    "type": "array",
    "items": {"$ref": "#/$defs/local"},  # Local to other.json, not to the root.
}
ALIASED = {"$id": "https://example.com/alias.json", "$defs": {"x": {"const": "aliased"}}}
RESOURCES = {"https://example.com/other.json": OTHER,
             "https://example.com/aliased-key.json": ALIASED}

# A cycle through two documents: a list of a.json nodes, each holding a b.json object.
CYCLE_A = {"$id": "https://example.com/a.json",
           "anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "b.json"}}]}
CYCLE_B = {"type": "object", "properties": {"next": {"$ref": "a.json"}},
           "required": ["next"], "additionalProperties": False}
CYCLE_RESOURCES = {"https://example.com/b.json": CYCLE_B}


def _vocab():
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                        eos_ids=[256])


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
  return cd.Compiler(_vocab(), cd.CompileOptions(
      cache_dir=str(tmp_path_factory.mktemp("resources_cache"))))


def _registry(resources):
  return referencing.Registry().with_resources(
      (uri, referencing.Resource.from_contents(
          schema, default_specification=referencing.jsonschema.DRAFT202012))
      for uri, schema in resources.items())


def _accepts(compiler, spec, text: str) -> bool:
  tables = compiler.compile(spec)
  return reference_accepts(tables, TokenIndex(_vocab()).longest_tokenization(text.encode()))


INSTANCES = [
    {"x": 3},
    {"x": 7, "whole": [True, False]},
    {"x": 4, "tag": "a", "alias": "aliased"},
    {"x": 2},                       # Below other.json's minimum.
    {"x": 3, "whole": [1]},         # other.json's items are its own #/$defs/local.
    {"x": 3, "whole": {"a": 1}},
    {"x": 3, "tag": "c"},
    {"x": 3, "alias": "other"},
    {"whole": []},                  # x is required.
]


@pytest.mark.parametrize("data", INSTANCES, ids=[json.dumps(d) for d in INSTANCES])
def test_two_documents_agree_with_jsonschema(compiler, data):
  expected = jsonschema.Draft202012Validator(
      ROOT, registry=_registry(RESOURCES)).is_valid(data)
  spec = cd.JsonSchema(ROOT, resources=RESOURCES)
  text = json.dumps(data, separators=(",", ":"))
  assert _accepts(compiler, spec, text) == expected


CYCLE_INSTANCES = [None, [], [{"next": None}], [{"next": [{"next": None}, {"next": []}]}],
                   [{"next": 1}], [{}], [{"next": None, "x": 1}], [[]], {"next": None}]


@pytest.mark.parametrize("data", CYCLE_INSTANCES, ids=[json.dumps(d) for d in CYCLE_INSTANCES])
def test_cycle_across_documents_agrees_with_jsonschema(compiler, data):
  expected = jsonschema.Draft202012Validator(
      CYCLE_A, registry=_registry(CYCLE_RESOURCES)).is_valid(data)
  spec = cd.JsonSchema(CYCLE_A, resources=CYCLE_RESOURCES)
  assert _accepts(compiler, spec, json.dumps(data, separators=(",", ":"))) == expected


def test_cycle_across_documents_is_pushdown():
  spec = cd.JsonSchema(CYCLE_A, resources=CYCLE_RESOURCES)
  grammar = spec.pushdown_grammar()
  assert grammar is not None
  assert grammar.names  # The cycle is a rule (here the root, a.json, itself).
  with pytest.raises(cd.UnsupportedSchemaError, match="not regular"):
    spec.to_ir()
  assert cd.JsonSchema(CYCLE_A, resources=CYCLE_RESOURCES, max_ref_depth=3).to_ir()


def test_same_pointer_in_two_documents_is_two_rules(compiler):
  # Both documents define #/definitions/x, recursively, with different content at the
  # leaves: the rules must not be shared.
  a = {"$id": "https://example.com/a.json", "type": "object",
       "properties": {"a": {"$ref": "#/definitions/x"}, "b": {"$ref": "b.json#/definitions/x"}},
       "definitions": {"x": {"anyOf": [{"type": "integer"},
                                       {"type": "array", "items": {"$ref": "#/definitions/x"}}]}}}
  b = {"definitions": {"x": {"anyOf": [{"type": "string"},
                                       {"type": "array", "items": {"$ref": "#/definitions/x"}}]}}}
  resources = {"https://example.com/b.json": b}
  spec = cd.JsonSchema(a, resources=resources)
  names = spec.pushdown_grammar().names
  assert "#/definitions/x" in names and "https://example.com/b.json#/definitions/x" in names
  validator = jsonschema.Draft202012Validator(a, registry=_registry(resources))
  for data in ({"a": [[1]], "b": [["s"]]}, {"a": [["s"]]}, {"b": [[1]]}, {"a": 1, "b": "s"}):
    text = json.dumps(data, separators=(",", ":"))
    assert _accepts(compiler, spec, text) == validator.is_valid(data), text


def test_unknown_document_names_its_uri():
  with pytest.raises(cd.UnsupportedSchemaError,
                     match=r"'https://example\.com/other\.json'.*resources="):
    cd.JsonSchema(ROOT).to_ir()
  with pytest.raises(cd.UnsupportedSchemaError, match=r"https://example\.com/missing\.json"):
    cd.JsonSchema({"$id": "https://example.com/r.json", "$ref": "missing.json#/a"},
                  resources=RESOURCES).to_ir()


def test_resources_are_canonical_and_keyed():
  one = cd.JsonSchema(ROOT, resources=RESOURCES)
  two = cd.JsonSchema(ROOT, resources=dict(reversed(list(RESOURCES.items()))))
  text = cd.JsonSchema(ROOT, resources={k: json.dumps(v) for k, v in RESOURCES.items()})
  assert one == two == text and hash(one) == hash(two) == hash(text)
  assert one.resources == tuple(sorted(
      (k, json.dumps(v, ensure_ascii=False, separators=(",", ":"))) for k, v in RESOURCES.items()))
  assert one != cd.JsonSchema(ROOT, resources={**RESOURCES, "https://example.com/z": True})
  assert cd.JsonSchema(ROOT).resources == ()
  import dataclasses  # pylint: disable=g-import-not-at-top
  assert dataclasses.replace(one, whitespace="single").resources == one.resources
  assert "resources=" in one.describe()


def test_compiler_memo_tells_resources_apart(compiler):
  narrow = {"https://example.com/n.json": {"type": "integer"}}
  wide = {"https://example.com/n.json": {"type": ["integer", "string"]}}
  root = {"$ref": "https://example.com/n.json"}
  assert not _accepts(compiler, cd.JsonSchema(root, resources=narrow), '"s"')
  assert _accepts(compiler, cd.JsonSchema(root, resources=wide), '"s"')


@pytest.mark.parametrize("resources, message", [
    ({3: {}}, r"resources key 3 is a int"),
    ({"relative.json": {}}, r"resources key 'relative\.json' is not an absolute URI"),
    ({"https://example.com/a.json#/x": {}}, r"'https://example\.com/a\.json#/x' is not an"),
    ({"https://example.com/a.json": [1]}, r"resources\['https://example\.com/a\.json'\]"),
    ({"https://example.com/a.json": "{"}, r"resources\['https://example\.com/a\.json'\]"),
    ("https://example.com/a.json", r"resources is a str"),
])
def test_bad_resources_are_refused(resources, message):
  with pytest.raises(cd.SchemaError, match=message):
    cd.JsonSchema({}, resources=resources)


def test_not_and_one_of_through_another_document(compiler):
  # Negation reads the target out of its document: its own $refs keep their meaning.
  resources = {"https://example.com/n.json": {
      "$defs": {"int": {"type": "integer"}}, "anyOf": [{"$ref": "#/$defs/int"},
                                                      {"type": "null"}]}}
  root = {"$id": "https://example.com/r.json", "not": {"$ref": "n.json"}}
  validator = jsonschema.Draft202012Validator(root, registry=_registry(resources))
  spec = cd.JsonSchema(root, resources=resources)
  for data in (1, None, "s", True, [1]):
    text = json.dumps(data)
    assert _accepts(compiler, spec, text) == validator.is_valid(data), text

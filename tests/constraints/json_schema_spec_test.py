"""The `cd.JsonSchema` spec: lenient mode and the keywords it ignores, annotations and
unknown keywords or formats, whitespace policies, canonical form and hashing, the
compiler and pydantic models.
"""

import json
import random

import numpy as np
import pytest

from constrained_decoding.testing import random_accepted_bytes

import constrained_decoding as cd

from json_schema_cases import (  # pylint: disable=import-error  (same directory)
    GPQA, POLICIES, _dfa)


def test_lenient_mode_records_what_it_ignored():
  schema = {"type": "object", "properties": {
      "tags": {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True},
      "p": {"type": "number", "minimum": 0.5, "maximum": 2.5},
      "s": {"type": "string", "format": "color"},
      "x": {"x-custom": 1, "type": "integer"}}, "required": ["tags", "p"]}
  spec = cd.JsonSchema(schema, lenient=True, strict_properties=True)
  assert spec.ignored_keywords() == (
      "#/properties/tags/uniqueItems", "#/properties/s/format", "#/properties/x/x-custom")
  # Unknown keywords and formats are annotations: recorded in strict mode too.
  strict = cd.JsonSchema({**schema, "properties": {**schema["properties"], "tags": {}}},
                         strict_properties=True)
  assert strict.ignored_keywords() == ("#/properties/s/format", "#/properties/x/x-custom")
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"tags":["a","a"],"p":1.5}')  # uniqueItems ignored: wider.
  assert dfa.accepts(b'{"tags":[],"p":0.5}') and not dfa.accepts(b'{"tags":[],"p":0.49}')
  assert dfa.accepts(b'{"tags":[],"p":2,"s":"anything"}')
  no_op = schema["properties"]["tags"] | {"uniqueItems": False}
  assert cd.JsonSchema(no_op).ignored_keywords() == ()


def test_annotations_are_ignored_silently():
  schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "T",
            "description": "d", "examples": [1], "default": 1, "$comment": "c",
            "deprecated": False, "readOnly": True, "writeOnly": False, "type": "integer"}
  spec = cd.JsonSchema(schema)
  assert spec.ignored_keywords() == ()
  assert _dfa(spec).accepts(b"-12")
  content = {"type": "string", "contentEncoding": "base64",  # Annotations since 2019-09.
             "contentMediaType": "application/json", "contentSchema": {"type": "integer"}}
  assert cd.JsonSchema(content).ignored_keywords() == ()
  assert _dfa(cd.JsonSchema(content)).accepts(b'"not base64!"')


def test_whitespace_policies_on_gpqa():
  text = {"compact": '{"Final Answer":"B","Solution":"x"}',
          "single": '{"Final Answer": "B", "Solution": "x"}',
          "flexible": '{\n "Final Answer" : "B",\n "Solution":"x" }'}
  for policy in POLICIES:
    dfa = _dfa(cd.JsonSchema(GPQA, policy, strict_properties=True))
    for other, t in text.items():
      assert dfa.accepts(t.encode()) == (other == policy or policy == "flexible"), (policy, other)
  capped = _dfa(cd.JsonSchema(GPQA, "flexible", max_whitespace=1, strict_properties=True))
  assert not capped.accepts(b'{  "Final Answer":"B","Solution":"x"}')


def test_spec_is_canonical_hashable_and_parses():
  a = cd.JsonSchema(GPQA)
  b = cd.JsonSchema(json.dumps(GPQA, indent=2))
  assert a == b and hash(a) == hash(b) and a.schema == json.dumps(GPQA, separators=(",", ":"))
  assert a != cd.JsonSchema(GPQA, "single")
  assert a.schema_value == GPQA
  assert a.parse('{"Final Answer":"A","Solution":"s"}') == {"Final Answer": "A", "Solution": "s"}
  assert a.describe().startswith('JsonSchema({"type":"object","properties":')
  assert a.to_ir() is a.to_ir()  # Lowered once.


def test_compiles_through_the_compiler(byte_compiler):
  tables = byte_compiler.compile(cd.JsonSchema({"type": "array", "items": {"type": "boolean"},
                                                "maxItems": 2}))
  assert int(np.asarray(tables.accepting).sum()) >= 1


def test_pydantic_model_through_its_json_schema():
  pydantic = pytest.importorskip("pydantic")
  import enum  # pylint: disable=g-import-not-at-top
  import typing  # pylint: disable=g-import-not-at-top

  class Quality(enum.Enum):
    NORMAL = "Normal"
    MAGIC = "Magic"

  class Item(pydantic.BaseModel):
    name: str
    durability: int = pydantic.Field(ge=0, le=100)
    quality: Quality
    note: typing.Optional[str] = None

  class Character(pydantic.BaseModel):
    name: str
    items: list[Item]

  spec = cd.JsonSchema(Character, strict_properties=True)
  dfa = _dfa(spec)
  rng = random.Random(0)
  for _ in range(20):
    text = random_accepted_bytes(dfa, rng, soft_limit=120).decode()
    Character.model_validate_json(text)
  example = Character(name="A", items=[Item(name="x", durability=3, quality=Quality.MAGIC)])
  assert dfa.accepts(example.model_dump_json().encode())


# Keywords seen in real schemas that assert nothing here (draft-04 `id`, OpenAPI and
# Kubernetes extensions, hyper-schema links, misspellings): the spec makes them annotations.
UNKNOWN_KEYWORDS = ["name", "self", "links", "readonly", "example", "javaType",
                    "x-kubernetes-int-or-string", "x-nullable", "decsription", "nullable"]


@pytest.mark.parametrize("keyword", UNKNOWN_KEYWORDS)
def test_unknown_keywords_are_ignored_and_listed(keyword):
  schema = {"type": "object", "id": "http://example.com/a",
            "properties": {"n": {"type": "integer", keyword: {"any": ["thing"]}}},
            "required": ["n"], "additionalProperties": False}
  spec = cd.JsonSchema(schema)
  assert spec.ignored_keywords() == (f"#/properties/n/{keyword}",)
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"n":12}') and not dfa.accepts(b'{"n":"x"}')


def test_unknown_formats_are_annotations_and_known_ones_stay_enforced():
  spec = cd.JsonSchema({"type": "object", "properties": {
      "c": {"type": "string", "format": "color"}, "d": {"type": "string", "format": "date"}},
      "additionalProperties": False})
  assert spec.ignored_keywords() == ("#/properties/c/format",)
  dfa = _dfa(spec)
  assert dfa.accepts(b'{"c":"anything at all","d":"2024-02-29"}')
  assert not dfa.accepts(b'{"d":"2023-02-29"}')


@pytest.mark.parametrize("schema", [
    {"type": "integer", "if": {"minimum": 3}},  # `if` alone asserts nothing.
    {"type": "integer", "then": {"minimum": 3}, "else": {"maximum": 0}},  # No `if`.
    {"type": "array", "minContains": 2, "maxContains": 3},  # No `contains`.
])
def test_keywords_without_their_partner_have_no_effect(schema):
  spec = cd.JsonSchema(schema)
  language = (b"[]", b"[1,2]") if schema["type"] == "array" else (b"1", b"7", b"-2")
  dfa = _dfa(spec)
  assert all(dfa.accepts(text) for text in language)


def test_lenient_names_the_keywords_it_ignores():
  schema = {"type": "object", "properties": {
      "tags": {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True},
      "n": {"type": "integer", "not": {"patternProperties": {"^a": {"type": "string"}}}}}}
  with pytest.raises(cd.UnsupportedSchemaError, match=r'lenient=\("uniqueItems",\)'):
    cd.JsonSchema({"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True}).to_ir()
  only_unique = cd.JsonSchema(schema, lenient=["uniqueItems"])
  assert only_unique.lenient == ("uniqueItems",)
  with pytest.raises(cd.UnsupportedSchemaError, match=r"not at #/properties/n/not"):
    only_unique.to_ir()  # `not` of patternProperties is still refused.
  both = cd.JsonSchema(schema, lenient=("uniqueItems", "not"))
  assert set(both.ignored_keywords()) == {"#/properties/tags/uniqueItems",
                                          "#/properties/n/not"}
  assert "lenient=('not', 'uniqueItems')" in both.describe()
  dfa = _dfa(cd.JsonSchema({"type": "array", "items": {"enum": ["a", "b"]},
                            "uniqueItems": True, "maxItems": 3}, lenient=("uniqueItems",)))
  assert not dfa.accepts(b'["a","a"]')  # Enforced where it can be: nothing ignored.
  for bad in ("uniqueItems", [1], [""]):
    with pytest.raises(cd.SchemaError, match="Expected True, False, or a collection"):
      cd.JsonSchema(schema, lenient=bad)

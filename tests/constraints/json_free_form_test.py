"""Free-form values nested without bound (`JsonSchema(free_form_depth=None)`).

`{}`, `true`, absent `items` and additional property values then call one grammar rule
of schema-free JSON, so they nest up to the device stack instead of `free_form_depth`
containers. Oracles: `json.loads` and `jsonschema` for texts the tables accept and for
random walks of the tables (soundness), random JSON values 30 levels deep fed byte by
byte and under random Gemma 3 tokenizations (completeness), the default bounded
version, which must agree where it is defined.
"""

import json
import random

import hypothesis
import hypothesis.strategies as st
import json_schema_recursive_test as recursive  # pylint: disable=import-error  (same directory)
import json_schema_test  # pylint: disable=import-error  (same directory)
import jsonschema
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex, reference_accepts

POLICIES = ("compact", "single", "flexible")
SCHEMAS = {
    "member": {"type": "object", "properties": {"id": {"type": "integer"}, "data": {}},
               "required": ["id", "data"], "additionalProperties": False},
    "extras": {"type": "object", "properties": {"id": {"type": "integer"}},
               "required": ["id"]},  # Additional properties: free-form values.
    "items": {"type": "array", "minItems": 1},  # Absent `items`.
    "root": True,
    "tree": {**recursive.TREE, "$defs": {"node": {**recursive.TREE["$defs"]["node"],
                                                  "properties": {
        **recursive.TREE["$defs"]["node"]["properties"], "meta": {}}}}},
}
_COMPILED: dict = {}


def _tables(compiler, name: str, policy: str, depth: int | None = None):
  key = (compiler.vocab.fingerprint, name, policy, depth)
  if key not in _COMPILED:
    _COMPILED[key] = compiler.compile(cd.JsonSchema(SCHEMAS[name], policy,
                                                    free_form_depth=depth))
  return _COMPILED[key]


def _nested(depth: int, rng: random.Random):
  """A JSON value `depth` containers deep, arrays and objects mixed at random."""
  value = rng.choice([None, True, 1.5, -7, "x\u00e9\\\"", []])
  for _ in range(depth):
    value = [value, rng.randint(0, 9)] if rng.random() < 0.5 else {"k\n": value, "": {}}
  return value


def _document(name: str, value):
  return {"member": {"id": 1, "data": value}, "extras": {"id": 1, "more": value},
          "items": [value, 2], "root": value,
          "tree": {"value": 1, "children": [{"meta": value}]}}[name]


def _depth(value) -> int:
  if isinstance(value, list):
    return 1 + max(map(_depth, value), default=0)
  if isinstance(value, dict):
    return 1 + max(map(_depth, value.values()), default=0)
  return 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", SCHEMAS)
def test_values_thirty_levels_deep_are_accepted_byte_by_byte(name, policy, byte_compiler):
  tables = _tables(byte_compiler, name, policy)
  assert tables.is_pushdown
  rng = random.Random(f"{name}-{policy}")
  for depth in (0, 1, 5, 30):
    document = _document(name, _nested(depth, rng))
    jsonschema.validate(document, SCHEMAS[name])
    text = json_schema_test.dump(document, policy, rng).encode()
    assert reference_accepts(tables, list(text)), text
    assert not reference_accepts(tables, list(text[:-1])), text  # Unclosed.


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner,
                                                              max_size=3),
    max_leaves=12))
def test_random_json_values_agree_with_the_bounded_version(value, byte_compiler):
  """Every value is accepted unbounded; the default (2 containers) accepts it exactly
  when it is at most 2 deep."""
  text = json.dumps(_document("member", value), separators=(",", ":"),
                    ensure_ascii=False).encode()  # (surrogate-pair escapes: not written)
  assert reference_accepts(_tables(byte_compiler, "member", "compact"), list(text))
  bounded = _tables(byte_compiler, "member", "compact", depth=2)
  assert reference_accepts(bounded, list(text)) == (_depth(value) <= 2)


@pytest.mark.parametrize("name, text", [
    ("member", b'{"id":1,"data":[1,2}'),  # Mismatched brackets.
    ("member", b'{"id":1,"data":{"a":1,}}'),  # Trailing comma.
    ("member", b'{"id":1,"data":{1:2}}'),  # Key not a string.
    ("member", b'{"id":1,"data":[[[[[[[[[[]]]]]]]]]],"x":1}'),  # No additional properties.
    ("items", b"[]"),  # minItems 1.
    ("root", b"[1]]"),
])
def test_invalid_texts_are_rejected(name, text, byte_compiler):
  with pytest.raises((ValueError, jsonschema.ValidationError)):
    jsonschema.validate(json.loads(text), SCHEMAS[name])
  assert not reference_accepts(_tables(byte_compiler, name, "compact"), list(text))


@pytest.mark.parametrize("name", ["member", "tree"])
def test_random_byte_walks_validate(name, byte_compiler, byte_vocab):
  rng = random.Random(f"walk-{name}")
  tables = _tables(byte_compiler, name, "single")
  for text in recursive._walks(tables, rng, byte_vocab, 6):  # pylint: disable=protected-access
    jsonschema.validate(json.loads(text.decode()), SCHEMAS[name])


def test_gemma_random_tokenizations_and_walks(gemma_compiler, gemma_vocab):
  schema = SCHEMAS["member"]
  tables = _tables(gemma_compiler, "member", "flexible")
  index, rng = TokenIndex(gemma_vocab), random.Random("gemma")
  for depth in (3, 12, 30):
    data = json_schema_test.dump(_document("member", _nested(depth, rng)), "flexible",
                                 rng).encode()
    for tokens in (index.random_tokenization(data, rng), index.longest_tokenization(data)):
      assert reference_accepts(tables, tokens), data
  for text in recursive._walks(tables, rng, gemma_vocab, 4, max_tokens=40):  # pylint: disable=protected-access
    jsonschema.validate(json.loads(text.decode()), schema)


def test_unbounded_free_form_values_need_unbounded_refs():
  with pytest.raises(ValueError, match=r"free_form_depth=None .* needs max_ref_depth=None"):
    cd.JsonSchema({}, free_form_depth=None, max_ref_depth=3)
  with pytest.raises(ValueError, match="free_form_depth"):
    cd.JsonSchema({}, free_form_depth=-1)


def test_schemas_without_free_form_values_stay_regular(byte_compiler):
  schema = {"type": "object", "properties": {"n": {"type": "integer"}},
            "additionalProperties": False}
  tables = byte_compiler.compile(cd.JsonSchema(schema, free_form_depth=None))
  assert not tables.is_pushdown

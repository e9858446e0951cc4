"""`_json_object_schemas._rule_refs` skips its walk while the lowering has made no
`RuleRef` (`_Lowerer.may_hold_rule_refs`): every answer checked against the walk, over
the corpus, the JSON-Schema-Test-Suite schemas (when present) and recursive schemas,
with free-form values bounded and as a rule, in any and schema property order."""

import glob
import json
import os

import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.constraints import _json_object_schemas as objects
from constrained_decoding.constraints import _json_schema

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SUITE = os.path.join(_REPO, "..", "shared", "data", "json-schema-test-suite", "tests",
                      "draft2020-12")

# The suite's files about objects, references and combinators (the shortcut's cases).
_SUITE_FILES = ("additionalProperties.json", "allOf.json", "anyOf.json", "defs.json",
                "dependentRequired.json", "dynamicRef.json", "properties.json",
                "ref.json", "refRemote.json", "unevaluatedProperties.json")

_RECURSIVE = [
    {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"]}}, "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"name": {"type": "string"},
                                      "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
     "additionalProperties": True},
]


def _schemas(corpus: bool) -> list:
  """The recursive schemas, the suite's files when present and the corpus when asked or
  when the suite is absent (a clone not beside shared/: the answers still need cases)."""
  out = list(_RECURSIVE)
  corpus = corpus or not os.path.isdir(_SUITE)
  for path in sorted(glob.glob(os.path.join(_REPO, "benchmarks", "schemas", "*.json"))
                     if corpus else []):
    with open(path) as f:
      entry = json.load(f)
    out.append(entry.get("schema", entry))
  for name in _SUITE_FILES:
    path = os.path.join(_SUITE, name)
    if not os.path.exists(path):
      continue
    with open(path) as f:
      out.extend(group["schema"] for group in json.load(f))
  return out


@pytest.fixture
def checked(monkeypatch):
  """Counts `_rule_refs` answers, each compared with the full walk's."""
  counts = {"skipped": 0, "walked": 0}
  fast = objects._rule_refs  # pylint: disable=protected-access

  def both(lw, node):
    answer = fast(lw, node)
    assert answer == objects._rule_refs_walk(lw, node), node  # pylint: disable=protected-access
    counts["walked" if lw.may_hold_rule_refs() else "skipped"] += 1
    return answer

  monkeypatch.setattr(objects, "_rule_refs", both)
  return counts


@pytest.mark.parametrize("options, corpus", [
    ({}, True), ({"free_form_depth": None}, False), ({"property_order": "schema"}, False),
    ({"lenient": True}, False)])
def test_skipped_walks_agree_with_the_walk(checked, options, corpus):
  for schema in _schemas(corpus):
    try:  # Not through the spec's cache: every schema is lowered here.
      _json_schema.lower_json_schema(schema, cd.JsonSchema(schema, **options).options())
    except (errors.ConstraintError, ValueError, TypeError):
      pass  # Refused schemas still check the answers given before the refusal.
  if "free_form_depth" not in options:  # Bounded free-form values: no rule of its own.
    assert checked["skipped"] > (100 if corpus else 0)  # The shortcut is taken...
  if options.get("property_order") != "schema":
    assert checked["walked"] > 10  # ... and so is the walk (recursion, free-form rules).

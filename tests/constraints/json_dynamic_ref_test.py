"""`$dynamicRef` (2020-12) and `$recursiveRef` (2019-09), checked against `jsonschema`.

Resolved statically where the target does not depend on the path that reaches the
reference (`_json_refs._dynamic_verdict`): only the static target declares the anchor,
or the root resource (with an `$id`) does. Elsewhere the schema is lowered per dynamic
scope ("Dynamic scopes" in `_json_refs.py`), refused where the specification and
`jsonschema` disagree on the target. Checked on fixed instances both ways and on random
walks of the compiled tables.
"""

import json
import random

import jsonschema
import numpy as np
import pytest
import referencing
import referencing.jsonschema

import constrained_decoding as cd
from constrained_decoding.constraints import _json_refs
from constrained_decoding.testing import TokenIndex
from constrained_decoding.testing import reference_accepts
from constrained_decoding.testing import reference_allowed
from constrained_decoding.testing import reference_end_allowed
from constrained_decoding.testing import reference_step_stack

D2020 = "https://json-schema.org/draft/2020-12/schema"
D2019 = "https://json-schema.org/draft/2019-09/schema"
BASE = "https://example.com/"

# A generic list whose item type its users choose (the bookend anchor accepts anything).
LIST = {"$id": "list", "type": "array", "items": {"$dynamicRef": "#item"},
        "$defs": {"any": {"$dynamicAnchor": "item"}}}
# A tree whose nodes are whatever schema starts the evaluation declares `node`.
TREE = {"$schema": D2020, "$id": BASE + "tree", "$dynamicAnchor": "node", "type": "object",
        "properties": {"data": True, "children": {"type": "array",
                                                  "items": {"$dynamicRef": "#node"}}}}
TREE_2019 = {"$schema": D2019, "$id": BASE + "tree2019", "$recursiveAnchor": True,
             "type": "object",
             "properties": {"data": True, "children": {"type": "array",
                                                       "items": {"$recursiveRef": "#"}}}}

# Strict trees: every node needs `data` (the root declares `node` and refers to TREE).
STRICT_2019 = {"$schema": D2019, "$id": BASE + "strict2019", "$recursiveAnchor": True,
               "$ref": "tree2019", "required": ["data"]}

# A 2019-09 document using the 2020-12 keyword.
OLD = {"$schema": D2019, "items": {"$dynamicRef": "#/$defs/a"}, "$defs": {"a": {}}}

# Targets that depend on the path: (name, schema, resources, instances).
PATHS = [
    # Two paths, two item types (the test suite's "multiple dynamic paths").
    ("paths", {"$schema": D2020, "$id": BASE + "paths",
               "anyOf": [{"$ref": "numbers"}, {"$ref": "strings"}],
               "$defs": {"list": LIST,
                         "numbers": {"$id": "numbers", "$ref": "list",
                                     "$defs": {"i": {"$dynamicAnchor": "item",
                                                     "type": "number"}}},
                         "strings": {"$id": "strings", "$ref": "list",
                                     "$defs": {"i": {"$dynamicAnchor": "item",
                                                     "type": "string"}}}}},
     {}, [[1, 2.5], ["a"], [], [1, "a"], [None], "a"]),
    # Recursive, two scopes: loose trees take any node, strict ones need `data` at
    # every depth (one rule per (target, scope)).
    ("forest", {"$schema": D2020, "$id": BASE + "forest", "type": "object",
                "properties": {"loose": {"$ref": "tree"}, "strict": {"$ref": "strict"}},
                "$defs": {"strict": {"$id": "strict", "$dynamicAnchor": "node",
                                     "$ref": "tree", "required": ["data"]}}},
     {BASE + "tree": TREE},
     [{"loose": {"children": [{"children": [{}]}]}, "strict": {"data": 1}},
      {"strict": {"data": 1, "children": [{"data": 2, "children": [{"data": 3}]}]}},
      {"strict": {"data": 1, "children": [{"data": 2, "children": [{}]}]}},
      {"strict": {"data": 1, "children": [{}]}}, {"loose": {"children": 1}}]),
    # A scope left behind: `if` entered `first` (a number), `then` reaches the
    # reference through `second` (null): only `then`'s path counts (the suite's
    # "after leaving a dynamic scope").
    ("left", {"$schema": D2020, "$id": BASE + "left",
              "if": {"$id": "first", "$defs": {"t": {"$dynamicAnchor": "t",
                                                     "type": "number"}}},
              "then": {"$id": "second", "$ref": "start",
                       "$defs": {"t": {"$dynamicAnchor": "t", "type": "null"}}},
              "$defs": {"start": {"$id": "start", "$dynamicRef": "inner#t"},
                        "inner": {"$id": "inner", "$dynamicAnchor": "t",
                                  "type": "string"}}},
     {}, [None, 1, "a", [], {}]),
    # The resource enclosing the static target is not entered by a $ref to the
    # target: its anchor does not count.
    ("skip", {"$schema": D2020, "$id": BASE + "skip", "type": "object",
              "properties": {"x": {"$ref": "item"}},
              "$defs": {"bar": {"$id": "bar", "type": "array", "items": {"$ref": "item"},
                                "$defs": {"item": {"$id": "item", "type": "object",
                                                   "properties": {"c": {"$dynamicRef": "#c"}},
                                                   "$defs": {"d": {"$dynamicAnchor": "c",
                                                                   "type": "integer"}}},
                                          "c": {"$dynamicAnchor": "c", "type": "string"}}}}},
     {}, [{"x": {"c": 1}}, {"x": {"c": "a"}}, {"x": {}}]),
    # A chain of $refs through four resources: the outermost declaring one wins.
    ("chain", {"$schema": D2020, "$id": BASE + "chain", "$ref": "c1#/$defs/s",
               "$defs": {"c1": {"$id": "c1", "$defs": {"s": {"$ref": "c2#/$defs/s"}}},
                         "c2": {"$id": "c2", "$defs": {"s": {"$ref": "c3#/$defs/s"},
                                                       "n": {"$dynamicAnchor": "n",
                                                             "maxLength": 2}}},
                         "c3": {"$id": "c3", "$defs": {"s": {"$dynamicRef": "#n"},
                                                       "n": {"$dynamicAnchor": "n",
                                                             "maxLength": 3}}}}},
     {}, ["hi", "hey", "", "x"]),
    # 2019-09: strict trees under `b` (through a $recursiveAnchor resource), trees
    # of any node under `a` (the root has none).
    ("recursive", {"$schema": D2019, "$id": BASE + "pair2019", "type": "object",
                   "properties": {"a": {"$ref": "tree2019"}, "b": {"$ref": "strict2019"}}},
     {BASE + "tree2019": TREE_2019, BASE + "strict2019": STRICT_2019},
     [{"a": {"children": [{}]}, "b": {"data": 1, "children": [{"data": 2}]}},
      {"b": {"data": 1, "children": [{}]}}, {"a": {"children": [{"children": [{}]}]}},
      {"b": {"data": 1, "children": [{"data": 2, "children": [{}]}]}}]),
]

# (schema, resources, instances): every instance judged by `jsonschema` and by the tables.
CASES = [
    # The root resource declares the anchor (in its $defs): every item is a string.
    ({"$schema": D2020, "$id": BASE + "strings", "$ref": "list",
      "$defs": {"s": {"$dynamicAnchor": "item", "type": "string"}, "list": LIST}},
     {}, [["a", "b"], [], [1], ["a", None]]),
    # The root object itself declares it, in another document: a tree whose nodes all
    # need `data` (the root's `required` reaches every child).
    ({"$schema": D2020, "$id": BASE + "strict", "$dynamicAnchor": "node",
      "$ref": "tree", "required": ["data"]},
     {BASE + "tree": TREE},
     [{"data": 1}, {"data": 1, "children": [{"data": 2, "children": []}]},
      {"data": 1, "children": [{}]}, {"children": []},
      {"data": 1, "children": [{"data": 2, "children": [{"children": []}]}]}]),
    # Only the static target declares it dynamically (the root's is an $anchor).
    ({"$schema": D2020, "$id": BASE + "plain", "$ref": "list",
      "$defs": {"s": {"$anchor": "item", "type": "string"}, "list": LIST}},
     {}, [["a"], [1, None], [[]], "a", {}]),
    # The static target's anchor is an $anchor: a plain $ref.
    ({"$schema": D2020, "$id": BASE + "anchor", "type": "array",
      "items": {"$dynamicRef": "#n"},
      "$defs": {"n": {"$anchor": "n", "type": "integer"},
                "o": {"$id": "o", "$dynamicAnchor": "n", "type": "string"}}},
     {}, [[1, 2], ["a"]]),
    # A JSON pointer fragment: a plain $ref.
    ({"$schema": D2020, "type": "object",
      "properties": {"a": {"$dynamicRef": "#/$defs/i"}},
      "$defs": {"i": {"$dynamicAnchor": "i", "type": "integer"}}},
     {}, [{"a": 1}, {"a": "1"}]),
    # 2019-09: the root has $recursiveAnchor, so does every resource with a reference.
    ({"$schema": D2019, "$id": BASE + "strict2019", "$recursiveAnchor": True,
      "$ref": "tree2019", "required": ["data"]},
     {BASE + "tree2019": TREE_2019},
     [{"data": 1, "children": [{"data": 2}]}, {"data": 1, "children": [{}]},
      {"data": 1, "children": [{"data": [], "children": [{"children": []}]}]}]),
    # 2019-09: the enclosing resource has no $recursiveAnchor: "#" of that resource.
    ({"$schema": D2019, "$id": BASE + "outer", "$recursiveAnchor": True,
      "type": "object", "properties": {"inner": {"$ref": "inner"}},
      "$defs": {"inner": {"$id": "inner", "type": "object",
                          "properties": {"next": {"$recursiveRef": "#"}},
                          "additionalProperties": False}}},
     {}, [{"inner": {"next": {}}}, {"inner": {"next": {"next": {}}}},
          {"inner": {"next": {"other": 1}}}, {"inner": {"next": 1}}]),
    # The keyword of another draft than every document declares: an unknown keyword.
    ({"$schema": D2019, "type": "array", "items": {"$dynamicRef": "#/$defs/s"},
      "$defs": {"s": {"type": "string"}}},
     {}, [[1], ["a"], "a"]),
    ({"$schema": D2020, "$recursiveAnchor": True, "type": "array",
      "items": {"$recursiveRef": "#"}},
     {}, [[1], [[1]], "a"]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
      "items": {"$dynamicRef": "#/definitions/s"}, "definitions": {"s": {"type": "string"}}},
     {}, [[1], "a"]),
] + [(schema, resources, instances) for _, schema, resources, instances in PATHS]


def _vocab():
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                        eos_ids=[256])


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
  return cd.Compiler(_vocab(), cd.CompileOptions(
      cache_dir=str(tmp_path_factory.mktemp("dynamic_ref_cache"))))


def _validator(schema, resources):
  registry = referencing.Registry().with_resources(
      (uri, referencing.Resource.from_contents(document)) for uri, document in
      resources.items())
  return jsonschema.validators.validator_for(schema)(schema, registry=registry)


@pytest.mark.parametrize("schema, resources, instances", CASES)
def test_agrees_with_jsonschema(compiler, schema, resources, instances):
  validator = _validator(schema, resources)
  tables = compiler.compile(cd.JsonSchema(schema, resources=resources or None))
  index = TokenIndex(_vocab())
  verdicts = [validator.is_valid(v) for v in instances]
  assert any(verdicts) and not all(verdicts)  # Both ways tested.
  for value, valid in zip(instances, verdicts):
    text = json.dumps(value, separators=(",", ":"))
    assert reference_accepts(tables, index.longest_tokenization(text.encode())) == valid, text


REFUSED = [
    # The root declares it but has no $id: `jsonschema` then leaves it out of the scope.
    ({"$schema": D2020, "$ref": BASE + "list",
      "$defs": {"s": {"$dynamicAnchor": "item", "type": "string"},
                "list": {**LIST, "$id": BASE + "list"}}},
     r"\$dynamicRef '#item' at #/\$defs/list/items/\$dynamicRef resolves"
     r" through the dynamic scope, and on a path that reaches it the specification and"
     r" jsonschema resolve it to different resources: '\(the root\)' against"
     r" 'https://example.com/list'"),
    # The root declares it but enters the list without $ref (by `properties`).
    ({"$schema": D2020, "$id": BASE + "entered", "properties": {"l": LIST},
      "$defs": {"s": {"$dynamicAnchor": "item", "type": "string"}}},
     r"\$dynamicRef '#item' at #/properties/l/items/\$dynamicRef .* different resources:"
     r" 'https://example.com/entered' against 'https://example.com/list'"),
    # 2019-09: a resource holding a $ref has no $recursiveAnchor (`jsonschema` stops there).
    ({"$schema": D2019, "$id": BASE + "gap", "$recursiveAnchor": True, "$ref": "middle",
      "$defs": {"middle": {"$id": "middle", "$ref": "tree2019"}}},
     r"\$recursiveRef '#' .* 'https://example.com/gap' against"
     r" 'https://example.com/tree2019' .* stops at the first one without"),
    # The anchor reached dynamically sits below its resource's root and holds a $ref,
    # which `jsonschema` would read against the static target's base URI.
    ({"$schema": D2020, "$id": BASE + "deep", "$ref": "numbers",
      "$defs": {"list": LIST,
                "numbers": {"$id": "numbers", "$ref": "list",
                            "$defs": {"i": {"$dynamicAnchor": "item",
                                            "$ref": "#/$defs/n"},
                                      "n": {"type": "number"}}},
                "strings": {"$id": "strings", "$ref": "list",
                            "$defs": {"i": {"$dynamicAnchor": "item",
                                            "type": "string"}}}}},
     r"\$dynamicRef '#item' at #/\$defs/list/items/\$dynamicRef resolves, on some path"
     r" that reaches it, to '#/\$defs/numbers/\$defs/i', which holds references"
     r" of its own that jsonschema would read against the base URI"
     r" 'https://example.com/list' instead of 'https://example.com/numbers'"),
    # Documents of two drafts, one of which has the keyword.
    ({"$schema": D2020, "$ref": BASE + "old"},
     r"\$dynamicRef at https://example\.com/old#/items/\$dynamicRef is a keyword of"
     r" draft 2020-12, but the documents involved declare \$schema 2019-09"),
    ({"$schema": D2020, "items": {"$dynamicRef": "#/$defs/a", "$ref": "#/$defs/a"},
      "$defs": {"a": {}}},
     r"\$dynamicRef at #/items/\$dynamicRef sits beside \$ref"),
]


@pytest.mark.parametrize("schema, message", REFUSED)
def test_path_dependent_targets_are_refused(schema, message):
  spec = cd.JsonSchema(schema, resources={BASE + "tree2019": TREE_2019, BASE + "old": OLD})
  with pytest.raises(cd.UnsupportedSchemaError, match=message):
    spec.pushdown_grammar()


def test_lenient_ignores_a_refused_dynamic_ref():
  schema = REFUSED[1][0]
  spec = cd.JsonSchema(schema, lenient=True)
  spec.pushdown_grammar()
  assert "#/properties/l/items/$dynamicRef" in spec.ignored_keywords()


def _random_walk(tables, rng, token_bytes, eos, max_tokens=60):
  """Random allowed tokens until the end is allowed and chosen (after `max_tokens`,
  closing tokens first); the text, or None if it has not ended by 10 x `max_tokens`."""
  state, stack, data = int(tables.start[0]), (), b""
  for step in range(10 * max_tokens):
    allowed = np.nonzero(reference_allowed(tables, state, stack))[0]
    choices = [t for t in allowed.tolist() if t not in eos]
    end = reference_end_allowed(tables, state, stack)
    assert choices or end, (state, stack, data)
    if end and (not choices or step >= max_tokens or rng.random() < 0.1):
      return data
    if step >= max_tokens:
      closing = [t for t in choices if (token_bytes[t] or b"")[-1:] in (b"]", b"}", b'"')]
      choices = closing or choices
    token = rng.choice(choices)
    state, stack = reference_step_stack(tables, state, stack, token)
    data += token_bytes[token]
  return None


@pytest.mark.parametrize("name, schema, resources, instances", PATHS,
                         ids=[p[0] for p in PATHS])
def test_random_walks_of_path_dependent_targets_validate(compiler, name, schema, resources,
                                                          instances):
  """Soundness where the target depends on the path: every walk is valid for
  `jsonschema` (the fixed instances in CASES test both ways)."""
  del instances
  validator = _validator(schema, resources)
  tables = compiler.compile(cd.JsonSchema(schema, resources=resources or None))
  vocab = _vocab()
  rng = random.Random(f"dynamic-{name}")
  texts = [_random_walk(tables, rng, vocab.token_bytes, set(vocab.eos_ids))
           for _ in range(12)]
  texts = [t for t in texts if t is not None]
  assert len(texts) >= 6
  for text in texts:
    assert validator.is_valid(json.loads(text)), text


def test_recursive_targets_become_one_rule_per_scope():
  """The forest's tree is lowered twice, once per scope: loose nodes (the tree's rule)
  and strict ones (the strict tree's, the tree merged with `required`)."""
  name, schema, resources, _ = PATHS[1]
  assert name == "forest"
  grammar = cd.JsonSchema(schema, resources=resources).pushdown_grammar()
  assert sorted(grammar.names) == ["#", "#/$defs/strict", BASE + "tree#"]


def test_too_many_dynamic_scopes_is_a_budget_error(monkeypatch):
  monkeypatch.setattr(_json_refs, "MAX_DYNAMIC_SCOPES", 2)
  with pytest.raises(cd.CompileBudgetError, match=r"\$dynamicRef/\$recursiveRef targets"
                     r" depend on the path in more than 2 ways .* anchor names \['item'\]"):
    # (A schema of its own: lowerings are cached by schema.)
    cd.JsonSchema({**PATHS[0][1], "$comment": "budget"}).pushdown_grammar()


def test_recursive_ref_other_than_hash_is_a_schema_error():
  with pytest.raises(cd.SchemaError, match=r"\$recursiveRef 'tree' at #/items/\$recursiveRef"
                     r" is not '#'"):
    cd.JsonSchema({"$schema": D2019, "items": {"$recursiveRef": "tree"}}).pushdown_grammar()


def test_one_name_as_anchor_and_dynamic_anchor_is_a_schema_error():
  schema = {"$schema": D2020, "$id": BASE + "both", "items": {"$dynamicRef": "#n"},
            "$defs": {"a": {"$anchor": "n"}, "b": {"$dynamicAnchor": "n"}}}
  with pytest.raises(cd.SchemaError, match=r"\$dynamicRef '#n' at #/items/\$dynamicRef"
                     r" names 'n', which 'https://example.com/both' declares both as"
                     r" \$anchor and as \$dynamicAnchor"):
    cd.JsonSchema(schema).pushdown_grammar()


def test_ref_hash_slash_is_the_empty_member_as_in_jsonschema(compiler):
  """`#/` names the root's member "" (RFC 6901), not the root, for `referencing` too."""
  missing = {"type": "array", "items": {"$ref": "#/"}}
  with pytest.raises(jsonschema.exceptions._WrappedReferencingError):  # pylint: disable=protected-access
    jsonschema.Draft202012Validator(missing).is_valid([1])
  with pytest.raises(cd.SchemaError, match=r"\$ref '#/' at #/items/\$ref does not resolve:"
                     r" no '' there \('#/' names the member \"\" of the root, not the root"):
    cd.JsonSchema(missing).pushdown_grammar()
  present = {**missing, "": {"type": "integer"}}
  validator = jsonschema.Draft202012Validator(present)
  tables = compiler.compile(cd.JsonSchema(present))
  for value in ([1, 2], [[]], ["a"]):
    text = json.dumps(value, separators=(",", ":")).encode()
    assert reference_accepts(tables, list(text)) == validator.is_valid(value), value


@pytest.mark.parametrize("schema, instance", [
    (REFUSED[0][0], [1]),          # Root without $id: not in `jsonschema`'s scope.
    (REFUSED[1][0], {"l": [1]}),   # List entered by `properties`: the root neither.
])
def test_root_rule_would_be_wrong_where_refused(schema, instance):
  """Why those two are refused: the root declares a string `item`, yet `jsonschema`
  accepts a non-string item there (the specification's root rule would reject it)."""
  assert jsonschema.Draft202012Validator(schema).is_valid(instance)


def test_keyword_of_another_draft_is_listed_as_ignored():
  spec = cd.JsonSchema({"$schema": D2019, "items": {"$dynamicRef": "#/$defs/s"},
                        "$defs": {"s": {"type": "string"}}})
  spec.pushdown_grammar()
  assert list(spec.ignored_keywords()) == ["#/items/$dynamicRef"]

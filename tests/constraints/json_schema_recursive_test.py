"""Recursive JSON Schemas compiled to push-down automata (`_json_schema.py`, `JsonSchema`).

Oracles: `jsonschema.validate` and `json.loads` for random walks through the allowed
tokens of the compiled tables (soundness, numpy reference walker with stacks); our own
random instance generator, nesting deeper than the old `max_ref_depth=3`, serialized
under each whitespace policy and fed byte by byte (byte vocabulary) and under random
Gemma 3 tokenizations (completeness); the bounded regular version (`max_ref_depth=3`),
which must agree up to depth 3; and a table of every new error path.
"""

import json
import random

import json_schema_test  # pylint: disable=import-error  (same directory)
import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _grammar
from constrained_decoding.testing import (TokenIndex, reference_accepts, reference_allowed,
                                          reference_end_allowed, reference_step_stack)

POLICIES = ("compact", "single", "flexible")
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "value": {"type": "integer"},
    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
LIST = {"$defs": {"list": {"anyOf": [{"type": "null"}, {
    "type": "object", "properties": {"head": {"type": "integer"},
                                     "tail": {"$ref": "#/$defs/list"}},
    "required": ["head", "tail"], "additionalProperties": False}]}}, "$ref": "#/$defs/list"}
MUTUAL = {"$defs": {
    "section": {"type": "object", "properties": {"title": {"type": "string", "maxLength": 3},
                                                 "parts": {"$ref": "#/$defs/parts"}},
                "required": ["title"]},
    "parts": {"type": "array", "items": {"$ref": "#/$defs/section"}, "maxItems": 2}},
          "$ref": "#/$defs/section"}
VALUE = {"$defs": {"v": {"anyOf": [  # Recursion through anyOf and additionalProperties.
    {"type": "null"}, {"type": "boolean"}, {"type": "integer"},
    {"type": "array", "items": {"$ref": "#/$defs/v"}},
    {"type": "object", "additionalProperties": {"$ref": "#/$defs/v"}}]}}, "$ref": "#/$defs/v"}
PAIR = {"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#"}],  # `$ref: #`.
        "items": False}
KIDS = {"$defs": {"n": {"type": "object", "properties": {  # `$ref` with sibling keywords.
    "v": {"type": "integer"},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/n", "required": ["v"]}}}}},
        "$ref": "#/$defs/n"}
EXPR = {"$defs": {  # What pydantic writes for `Expr = Union[Add, Num]`.
    "Add": {"type": "object", "properties": {
        "kind": {"const": "add"},
        "left": {"anyOf": [{"$ref": "#/$defs/Add"}, {"$ref": "#/$defs/Num"}]},
        "right": {"anyOf": [{"$ref": "#/$defs/Add"}, {"$ref": "#/$defs/Num"}]}},
            "required": ["kind", "left", "right"]},
    "Num": {"type": "object", "properties": {"kind": {"const": "num"},
                                             "value": {"type": "integer"}},
            "required": ["kind", "value"]}},
        "type": "object", "properties": {"expr": {"anyOf": [{"$ref": "#/$defs/Add"},
                                                            {"$ref": "#/$defs/Num"}]}},
        "required": ["expr"]}
SCHEMAS = {"tree": TREE, "list": LIST, "mutual": MUTUAL, "value": VALUE, "pair": PAIR,
           "kids": KIDS, "expr": EXPR}
DEEP = 6  # Nesting of generated instances: deeper than the old max_ref_depth=3.


# ---- A random instance generator for the keywords above (an oracle of our own). ----


def _resolve(root, ref: str):
  node = root
  for token in ref[2:].split("/") if len(ref) > 1 else ():
    node = node[token]
  return node


def _recursive(schema, root) -> bool:
  """Whether `schema` (a `$ref` looked through once) mentions a `$ref`."""
  if isinstance(schema, dict) and "$ref" in schema:
    siblings = {k: v for k, v in schema.items() if k != "$ref"}
    schema = [_resolve(root, schema["$ref"]), siblings]
  return "$ref" in json.dumps(schema)


def _free(rng, depth: int = 1):
  choice = rng.randrange(4 if depth else 3)
  if choice == 0:
    return rng.choice([None, True, -7, 0.5, "é\""])
  if choice == 1:
    return rng.randint(-5, 99)
  if choice == 2:
    return "".join(rng.choice('ab"\\\n') for _ in range(rng.randint(0, 3)))
  return [_free(rng, depth - 1) for _ in range(rng.randint(0, 2))]


def instance(schema, root, rng, budget: int, *, extras: bool):
  """A random instance, in our property order, whose `$ref` nesting reaches `budget` when
  the schema allows (recursive branches preferred while budget is left, avoided after)."""
  if schema is True or schema == {}:
    return _free(rng)
  if "$ref" in schema:
    target = _resolve(root, schema["$ref"])
    siblings = {k: v for k, v in schema.items() if k != "$ref"}
    merged = {**target, **siblings}
    if "required" in target and "required" in siblings:
      merged["required"] = target["required"] + siblings["required"]
    return instance(merged, root, rng, budget - 1, extras=extras)
  if "anyOf" in schema:
    options = schema["anyOf"]
    deep = [o for o in options if _recursive(o, root)]
    shallow = [o for o in options if not _recursive(o, root)] or options
    pick = deep if budget > 0 and deep and rng.random() < 0.9 else shallow
    return instance(rng.choice(pick), root, rng, budget, extras=extras)
  if "const" in schema:
    return schema["const"]
  kind = schema.get("type")
  if kind == "null":
    return None
  if kind == "boolean":
    return rng.random() < 0.5
  if kind == "integer":
    return rng.randint(-10**6, 10**6)
  if kind == "string":
    length = rng.randint(0, schema.get("maxLength", 4))
    return "".join(rng.choice("xy\"\\é\n") for _ in range(length))
  if kind == "array":
    return _array(schema, root, rng, budget, extras=extras)
  return _object(schema, root, rng, budget, extras=extras)


def _array(schema, root, rng, budget, *, extras):
  prefix = schema.get("prefixItems", [])
  items = schema.get("items", True)
  if prefix:
    n = len(prefix) if budget > 0 else rng.randint(0, len(prefix) - 1)
    return [instance(s, root, rng, budget, extras=extras) for s in prefix[:n]]
  if _recursive(items, root) and budget <= 0:
    return []
  n = rng.randint(1, min(2, schema.get("maxItems", 2))) if budget > 0 else rng.randint(0, 2)
  return [instance(items, root, rng, budget, extras=extras) for _ in range(n)]


def _object(schema, root, rng, budget, *, extras):
  out = {}
  required = schema.get("required", [])
  for key, sub in schema.get("properties", {}).items():
    if key in required or (rng.random() < (0.9 if budget > 0 else 0.5)
                           and (budget > 0 or not _recursive(sub, root))):
      out[key] = instance(sub, root, rng, budget, extras=extras)
  additional = schema.get("additionalProperties", True)
  if additional is not False and (extras or additional is not True):
    deep = budget > 0 and additional is not True and _recursive(additional, root)
    for i in range(rng.randint(1 if deep else 0, 2)):
      if additional is not True and _recursive(additional, root) and budget <= 0:
        break
      out[f"x{i}\""] = instance(additional, root, rng, budget, extras=extras)
  return out


def _depth(value) -> int:
  if isinstance(value, dict):
    return 1 + max(map(_depth, value.values()), default=0)
  if isinstance(value, list):
    return 1 + max(map(_depth, value), default=0)
  return 0


# ---- Lowering: recursive schemas become grammars, the others stay as they were. ----


@pytest.mark.parametrize("name", SCHEMAS)
def test_recursive_schemas_lower_to_normalized_grammars(name):
  spec = cd.JsonSchema(SCHEMAS[name])
  grammar = spec.pushdown_grammar()
  assert grammar is not None and _grammar.recursive_rules(grammar)
  assert grammar == _grammar.normalize(grammar)
  with pytest.raises(cd.UnsupportedSchemaError, match=r"recursive \$ref targets .* Compile"):
    spec.to_ir()
  bounded = cd.JsonSchema(SCHEMAS[name], max_ref_depth=3)
  assert bounded.pushdown_grammar() is None and bounded.to_ir() is not None
  assert "max_ref_depth=3" in bounded.describe() and "max_ref_depth" not in spec.describe()


def test_rules_are_the_merged_ref_targets():
  assert cd.JsonSchema(TREE).pushdown_grammar().names == ("#/$defs/node",)
  assert cd.JsonSchema(PAIR).pushdown_grammar().names == ("#",)
  # `{"$ref": n, "required": ["v"]}` is its own rule; the root (plain n) is not recursive.
  assert cd.JsonSchema(KIDS).pushdown_grammar().names == ("#", "#/$defs/n")
  # The union `Add | Num` became the rule, so `{` does not decide between call and bytes.
  assert cd.JsonSchema(EXPR).pushdown_grammar().names == ("#", "#/$defs/Add | ...")


@pytest.mark.parametrize("name", [c[0] for c in json_schema_test.CASES if c[0] != "tree"])
def test_schemas_without_recursion_lower_exactly_as_before(name):
  schema = dict((c[0], c[1]) for c in json_schema_test.CASES)[name]
  for policy in POLICIES:
    for strict in (False, True):
      new = cd.JsonSchema(schema, policy, strict_properties=strict)
      old = cd.JsonSchema(schema, policy, strict_properties=strict, max_ref_depth=3)
      assert new.pushdown_grammar() is None
      assert new.to_ir() == old.to_ir(), (policy, strict)


def test_recursion_that_normalizes_away_is_regular():
  spec = cd.JsonSchema({"anyOf": [{"$ref": "#"}, {"type": "null"}]})
  assert spec.pushdown_grammar() is None and spec.to_ir() == cd.JsonSchema({"type": "null"}).to_ir()


# ---- Byte vocabulary: every schema, every policy, deep instances. ----


_COMPILED = {}  # (vocabulary fingerprint, schema name, policy, strict) -> (tables, info)
_bounded_dfa = json_schema_test._dfa  # pylint: disable=protected-access  (byte DFA of to_ir)


def _compiled(compiler, name, policy, strict, order="any"):
  """(tables, info) of SCHEMAS[name], compiled once per vocabulary and options."""
  key = (compiler.vocab.fingerprint, name, policy, strict, order)
  if key not in _COMPILED:
    spec = cd.JsonSchema(SCHEMAS[name], policy, strict_properties=strict,
                         property_order=order)
    _COMPILED[key] = compiler.compile_with_info(spec)
  return _COMPILED[key]


def _byte_tables(compiler, name, policy, strict, order="any"):
  return _compiled(compiler, name, policy, strict, order)[0]


@pytest.mark.parametrize("strict", [False, True], ids=["extras", "strict"])
@pytest.mark.parametrize("name", SCHEMAS)
def test_deep_instances_are_accepted_byte_by_byte(name, strict, byte_compiler):
  schema = SCHEMAS[name]
  rng = random.Random(f"{name}-{strict}")
  bounded = _bounded_dfa(cd.JsonSchema(schema, strict_properties=strict, max_ref_depth=3))
  deepest = 0
  for i in range(12):
    value = instance(schema, schema, rng, DEEP if i % 3 else 1, extras=not strict)
    jsonschema.validate(value, schema)
    deepest = max(deepest, _depth(value))
    for policy in POLICIES:
      text = json_schema_test.dump(value, policy, rng).encode()
      tables = _byte_tables(byte_compiler, name, policy, strict)
      assert reference_accepts(tables, list(text)), (policy, text)
      if text[-1:] in (b"]", b"}"):  # Unclosed.
        assert not reference_accepts(tables, list(text[:-1])), (policy, text)
    compact = json_schema_test.dump(value, "compact", rng).encode()
    if _depth(value) <= 2:  # The bounded version agrees where it is defined ...
      assert bounded.accepts(compact), compact
  assert deepest > 4  # ... and the unbounded one goes deeper.


def test_bounded_version_rejects_what_only_the_pushdown_accepts(byte_compiler):
  deep = {"head": 1, "tail": {"head": 2, "tail": {"head": 3, "tail": {"head": 4, "tail": None}}}}
  text = json.dumps(deep, separators=(",", ":")).encode()
  assert reference_accepts(_byte_tables(byte_compiler, "list", "compact", False), list(text))
  assert not _bounded_dfa(cd.JsonSchema(LIST, max_ref_depth=3)).accepts(text)


@pytest.mark.parametrize("name, text", [
    ("tree", b'{"value":1,"children":[{"value":"x"}]}'),
    ("tree", b'{"children":[{"children":[[]]}]}'),
    ("list", b'{"head":1,"tail":{"head":2}}'),
    ("expr", b'{"expr":{"kind":"add","left":{"kind":"num","value":1}}}'),
    ("expr", b'{"expr":{"kind":"mul","left":{"kind":"num","value":1}}}'),
    ("pair", b"[1,[2,[3,4]]]"),
    ("mutual", b'{"title":"a","parts":[{"title":"b"},{"title":"c"},{"title":"d"}]}'),
])
def test_invalid_documents_are_rejected(name, text, byte_compiler):
  with pytest.raises(jsonschema.ValidationError):
    jsonschema.validate(json.loads(text), SCHEMAS[name])
  assert not reference_accepts(_byte_tables(byte_compiler, name, "compact", False), list(text))


def _random_walk(tables, rng, token_bytes, eos, max_tokens=80):
  """Random allowed tokens until the end is allowed and chosen (always after
  `max_tokens`, by when closing tokens are preferred); the text, or None if the walk
  has not ended after 10 x `max_tokens` tokens (recursion may keep branching)."""
  state, stack, data = int(tables.start[0]), (), b""
  registers = (0,) * tables.register_init.shape[0]  # Objects checked in registers.
  for step in range(10 * max_tokens):
    allowed = np.nonzero(reference_allowed(tables, state, stack, registers))[0]
    choices = [t for t in allowed.tolist() if t not in eos]
    end = reference_end_allowed(tables, state, stack)
    assert choices or end, (state, stack, data)
    if end and (not choices or step >= max_tokens or rng.random() < 0.1):
      return data
    if step >= max_tokens:
      closing = [t for t in choices if (token_bytes[t] or b"")[-1:] in (b"]", b"}", b'"')]
      choices = closing or choices
    token = rng.choice(choices)
    state, stack, registers = reference_step_stack(tables, state, stack, token, registers)
    data += token_bytes[token]
  return None


def _walks(tables, rng, vocab, count: int, **kwargs) -> list[bytes]:
  """`count` ended walks (at most 3 x `count` tries)."""
  texts = []
  for _ in range(3 * count):
    text = _random_walk(tables, rng, vocab.token_bytes, set(vocab.eos_ids), **kwargs)
    if text is not None:
      texts.append(text)
      if len(texts) == count:
        break
  assert len(texts) == count
  return texts


@pytest.mark.parametrize("strict", [False, True], ids=["extras", "strict"])
@pytest.mark.parametrize("name", SCHEMAS)
def test_random_byte_walks_validate(name, strict, byte_compiler, byte_vocab):
  rng = random.Random(f"walk-{name}-{strict}")
  # With extras, schema order: a byte walk in an object whose required keys may come
  # after any number of random extra keys (any order) almost never writes them all.
  order = "any" if strict else "schema"
  for policy in POLICIES:
    tables = _byte_tables(byte_compiler, name, policy, strict, order)
    for text in _walks(tables, rng, byte_vocab, 4):
      jsonschema.validate(json.loads(text.decode()), SCHEMAS[name])


# ---- Gemma 3 vocabulary: random tokenizations and token walks. ----

GEMMA_CASES = [("tree", "compact", False), ("tree", "flexible", True), ("list", "single", True),
               ("expr", "compact", True), ("value", "single", True)]


@pytest.fixture(scope="module", name="index")
def fixture_index(gemma_vocab):
  return TokenIndex(gemma_vocab)


@pytest.mark.parametrize("name, policy, strict", GEMMA_CASES)
def test_gemma_random_tokenizations_and_walks(name, policy, strict, gemma_compiler, gemma_vocab,
                                              index):
  schema = SCHEMAS[name]
  tables, info = _compiled(gemma_compiler, name, policy, strict)
  assert tables.is_pushdown and info.num_groups is not None
  rng = random.Random(f"gemma-{name}-{policy}")
  for _ in range(6):  # Completeness.
    value = instance(schema, schema, rng, DEEP, extras=not strict)
    data = json_schema_test.dump(value, policy, rng).encode()
    for tokens in (index.random_tokenization(data, rng), index.longest_tokenization(data)):
      assert reference_accepts(tables, tokens), data
    assert not reference_accepts(tables, index.longest_tokenization(data + b"}"))
  spec = cd.JsonSchema(schema, policy, strict_properties=strict)
  for text in _walks(tables, rng, gemma_vocab, 5, max_tokens=40):  # Soundness.
    jsonschema.validate(spec.parse(text.decode()), schema)


# ---- Errors. ----


@pytest.mark.parametrize("schema, error, message", [
    ({"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
                      "required": ["n"]}}, "$ref": "#/$defs/n"},
     cd.SchemaError, r"Recursive \$ref '#/\$defs/n' never ends: every alternative of its"
     r" target refers to \['#/\$defs/n'\] again"),
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1},
     cd.SchemaError, r"Recursive \$ref '#' never ends"),
    ({"$ref": "#"}, cd.SchemaError,
     r"\$ref '#' at #/\$ref refers back to itself \(# -> #\) with no JSON value in between"),
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
      "$ref": "#/$defs/a"}, cd.SchemaError,
     r"refers back to itself \(#/\$defs/a -> #/\$defs/b -> #/\$defs/a\)"),
])
def test_error_messages(schema, error, message):
  with pytest.raises(error, match=message):
    cd.JsonSchema(schema).pushdown_grammar()


@pytest.mark.parametrize("value", [0, -1, True])
def test_max_ref_depth_must_be_none_or_positive(value):
  with pytest.raises(ValueError, match=rf"JsonSchema max_ref_depth {value!r} is not an int >= 1"):
    cd.JsonSchema(TREE, max_ref_depth=value)


def test_ambiguous_recursion_is_rejected_at_compile_time(byte_compiler):
  """After `{"c":{` the text may continue the tree (a call) or a free-form object."""
  schema = {"$defs": {"t": {"type": "object", "properties": {
      "c": {"anyOf": [{"$ref": "#/$defs/t"}, {"type": "object"}]}}}}, "$ref": "#/$defs/t"}
  with pytest.raises(cd.NondeterministicGrammarError, match=r"two ways"):
    byte_compiler.compile(cd.JsonSchema(schema))
  byte_compiler.compile(cd.JsonSchema(schema, max_ref_depth=2))  # Bounded: any schema.


def test_recursive_pydantic_model_compiles_and_its_walks_validate(byte_compiler, byte_vocab):
  """A real pydantic model tree (its own `model_json_schema()`); its validator is the
  oracle for random walks, and its dumps of deep instances are accepted."""
  pydantic = pytest.importorskip("pydantic")

  class Node(pydantic.BaseModel):
    value: int
    children: list["Node"] = []

  tables = byte_compiler.compile(cd.JsonSchema(Node))
  assert tables.is_pushdown
  rng = random.Random("pydantic")
  for text in _walks(tables, rng, byte_vocab, 6):
    Node.model_validate_json(text)
  deep = Node(value=0)
  for i in range(1, 8):
    deep = Node(value=i, children=[deep, Node(value=-i)])
  assert reference_accepts(tables, list(deep.model_dump_json().encode()))

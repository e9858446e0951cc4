"""Registers beside the stack: register constructs inside recursive schemas (issue 14).

A register block used only by a construct that calls no rule (an array of distinct
strings, an any-order object whose member values call nothing) is never live across a
push or a pop, so push-down tables carry guards like flat ones (`_packing.pack_pda_tables`,
`automata/_pda.py`). Nor is one whose calls go to the free-form value rule
(`free_form_depth=None`), which touches no register: the words are the same after it
returns (`_rtn._check_calls` refuses any other call where words are live). Oracles: `jsonschema` on the texts; the Python-integer reference
(`testing.reference_allowed`, `reference_step_stack`: guards and hashes evaluated by
`tables.apply_guard`, stacks as tuples) against the jitted device step on random walks;
random Gemma 3 tokenizations of valid and invalid documents.
"""

import copy
import json
import random

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex, reference_accepts, reference_allowed

# A tree whose nodes hold distinct tags, at every depth.
TREE = {"$defs": {"node": {
    "type": "object", "required": ["value", "tags"], "additionalProperties": False,
    "properties": {"value": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                            "maxItems": 4},
                   "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}
# A tree node whose `value` is a large any-order object with required keys (past the
# any-order budget: its keys are register bits), and recursion beside it.
KEYS = [f"k{i:02d}" for i in range(14)]
RECORD = {"type": "object", "additionalProperties": False, "required": ["k00", "k05", "k13"],
          "properties": {k: {"type": "integer"} for k in KEYS}}
ORDER = {"$defs": {"node": {
    "type": "object", "required": ["value"], "additionalProperties": False,
    "properties": {"value": RECORD,
                   "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}
# Under free_form_depth=None: a large any-order object whose values include free-form
# ones (a declared `{}` member and additional properties), each a call on the stack.
FREE = {"type": "object", "required": ["k00", "k13"], "additionalProperties": True,
        "properties": {**{k: {"type": "integer"} for k in KEYS}, "any": {}}}
SCHEMAS = {"tree": TREE, "order": ORDER, "free": FREE}
_OPTIONS = {"free": {"free_form_depth": None}}
WORDS = ["a", "b", "ab", "é", "\n", '"', ",", "x y"]


def _text(value) -> bytes:
  return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _valid(name, value) -> bool:
  return jsonschema.Draft202012Validator(SCHEMAS[name]).is_valid(value)


def _tree(rng: random.Random, depth: int):
  """A random tree node, its tags sometimes repeated (invalid) at a random depth."""
  tags = rng.sample(WORDS, rng.randint(0, 3))
  if tags and rng.random() < 0.2:
    tags.append(rng.choice(tags))
  node = {"value": rng.randint(-5, 50), "tags": tags}
  if depth and rng.random() < 0.7:
    node["children"] = [_tree(rng, depth - 1) for _ in range(rng.randint(0, 2))]
  return node  # Schema order: a member calls a rule, so the node keeps its automaton.


def _record_tree(rng: random.Random, depth: int):
  """A random `ORDER` node: records with keys in random order, sometimes missing a
  required key (invalid)."""
  keys = rng.sample(KEYS, rng.randint(0, len(KEYS)))
  if rng.random() < 0.7:
    keys = sorted(set(keys) | {"k00", "k05", "k13"}, key=lambda _: rng.random())
  node = {"value": {k: rng.randint(0, 9) for k in keys}}
  if depth and rng.random() < 0.7:
    node["children"] = [_record_tree(rng, depth - 1) for _ in range(rng.randint(0, 2))]
  return node


def _free_value(rng: random.Random, depth: int):
  kind = rng.randrange(4 if depth else 2)
  if kind == 0:
    return rng.choice([1, -2.5, "s", True, None])
  if kind == 1:
    return rng.choice(["", "x", "a\"b"])
  if kind == 2:
    return [_free_value(rng, depth - 1) for _ in range(rng.randint(0, 2))]
  return {rng.choice(["a", "k00", "b"]): _free_value(rng, depth - 1)
          for _ in range(rng.randint(0, 2))}


def _free_object(rng: random.Random, _depth: int):
  """A random `FREE` object: declared keys, `any` and extra keys with free-form values
  (nested), in random order; sometimes a required key missing (invalid)."""
  keys = rng.sample(KEYS, rng.randint(0, 5))
  if rng.random() < 0.7:
    keys = sorted(set(keys) | {"k00", "k13"})
  value = {k: rng.randint(0, 9) for k in keys}
  for extra in rng.sample(["any", "x", "y z"], rng.randint(0, 3)):
    value[extra] = _free_value(rng, 3)
  items = list(value.items())
  rng.shuffle(items)
  return dict(items)


def _documents(name: str, count: int, seed: int) -> list:
  rng = random.Random(seed)
  make = {"tree": _tree, "order": _record_tree, "free": _free_object}[name]
  return [make(rng, 3) for _ in range(count)]


@pytest.fixture(scope="module")
def byte_tables(byte_compiler):
  return {name: byte_compiler.compile(cd.JsonSchema(schema, **_OPTIONS.get(name, {})))
          for name, schema in SCHEMAS.items()}


@jax.jit
def _device_walk(tables, tokens, lengths, eos, ids=None):
  """Feeds each row its tokens (`[B, L]`, the first `lengths`), then end of sequence:
  whether each row ends `done` without `error`. With `ids`, row r follows stacked
  constraint `ids[r]`."""
  state = (cd.init_state(tables, tokens.shape[0]) if ids is None
           else cd.init_state(tables, constraint_ids=ids))

  def step(state, i):
    moved = cd.advance(tables, state, tokens[:, i])
    active = i < lengths
    return jax.tree.map(lambda a, b: jnp.where(
        active.reshape(active.shape + (1,) * (a.ndim - 1)), a, b), moved, state), None

  state, _ = jax.lax.scan(step, state, jnp.arange(tokens.shape[1]))
  state = cd.advance(tables, state, jnp.full(tokens.shape[0], eos, jnp.int32))
  return state.done & ~state.error


def _walk_many(tables, token_lists, eos) -> np.ndarray:
  width = 128 * -(-max(map(len, token_lists)) // 128)  # Few shapes: few compilations.
  tokens = np.zeros((len(token_lists), width), np.int32)
  for row, ids in enumerate(token_lists):
    tokens[row, :len(ids)] = ids
  lengths = np.array([len(ids) for ids in token_lists], np.int32)
  return np.asarray(_device_walk(tables, tokens, lengths, eos))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_recursive_register_schemas_compile_to_pushdown_tables_with_guards(name, byte_tables):
  tables = byte_tables[name]
  assert tables.is_pushdown and tables.has_registers
  assert tables.has_hashes == (name == "tree")
  if name == "free":  # Its words are live across calls of the free-form rule.
    assert cd.JsonSchema(FREE, free_form_depth=None).pushdown_grammar() is not None


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_device_and_reference_agree_with_jsonschema_byte_by_byte(name, byte_tables,
                                                                 byte_vocab):
  tables = byte_tables[name]
  values = _documents(name, 24, seed=1)
  valid = [_valid(name, v) for v in values]
  assert 4 <= sum(valid) <= 20  # Both kinds, often.
  texts = [list(_text(v)) for v in values]
  assert _walk_many(tables, texts, byte_vocab.eos_ids[0]).tolist() == valid
  assert [reference_accepts(tables, t) for t in texts] == valid


def test_repeated_tags_are_refused_at_every_depth(byte_tables, byte_vocab):
  tables = byte_tables["tree"]
  leaf = {"value": 0, "tags": ["a", "b"]}
  texts, expected = [], []
  for depth in range(4):
    for tags in (["a", "b"], ["a", "b", "a"], ["x y", "é", "x y"]):
      node = copy.deepcopy(leaf)
      inner = node
      for _ in range(depth):
        child = copy.deepcopy(leaf)
        inner["children"] = [{"value": 1, "tags": ["a"]}, child]
        inner = child
      inner["tags"] = tags
      texts.append(list(_text(node)))
      expected.append(len(set(tags)) == len(tags))
      assert _valid("tree", node) == expected[-1]
  assert _walk_many(tables, texts, byte_vocab.eos_ids[0]).tolist() == expected


_STRUCTURE = np.frombuffer(b'{}[]",:0123456789abchiklnrtuvy', np.uint8).astype(np.int64)


def _device_masks(tables, rng: np.random.Generator, eos: int, steps: int,
                  prefix: bytes = b""):
  """Random walks (one per row) drawn from the device's own masks after `prefix` (fed
  to every row); yields each step's (state, allowed bits, token) per row, read back to
  compare with the reference."""
  batch = 4
  state = cd.init_state(tables, batch)
  allowed_fn = jax.jit(cd.allowed_tokens)
  advance_fn = jax.jit(cd.advance)
  for step in range(steps):
    allowed = np.asarray(allowed_fn(tables, state))
    tokens = []
    for row in range(batch):
      if step < len(prefix):
        tokens.append(prefix[step])
        continue
      choices = np.flatnonzero(allowed[row])
      non_eos = choices[choices != eos]
      # Mostly structure (a uniform byte would rarely leave a string body).
      structure = np.intersect1d(non_eos, _STRUCTURE)
      if len(structure) and rng.random() < 0.8:
        non_eos = structure
      tokens.append(int(rng.choice(non_eos if len(non_eos) else choices)))
    yield state, allowed, tokens
    state = advance_fn(tables, state, jnp.asarray(tokens, jnp.int32))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_device_masks_equal_the_reference_on_random_walks(name, byte_tables, byte_vocab):
  tables = byte_tables[name]
  eos = byte_vocab.eos_ids[0]
  rng = np.random.default_rng(3)
  guarded_steps = 0
  prefix = b'{"k05":1,"any":{"k00":[' if name == "free" else b""
  for state, allowed, _ in _device_masks(tables, rng, eos, steps=40, prefix=prefix):
    for row in range(allowed.shape[0]):
      if bool(state.error[row]) or bool(state.done[row]):
        continue
      depth = int(state.depth[row])
      stack = tuple(int(x) for x in np.asarray(state.stack[row, :depth]))
      registers = tuple(int(x) for x in np.asarray(state.registers[row]))
      guarded_steps += any(registers)
      expected = reference_allowed(tables, int(state.state[row]), stack, registers)
      np.testing.assert_array_equal(allowed[row], expected)
  assert guarded_steps > 10


def test_guarded_tokens_respect_the_stack_bound(byte_vocab, tmp_path):
  """With a shallow stack the stack-aware mask rows apply to guarded tokens too (the
  device ORs them in before the exclusion row): device masks equal the reference's."""
  compiler = cd.Compiler(byte_vocab, cd.CompileOptions(stack_depth=2,
                                                       cache_dir=str(tmp_path)))
  tables = compiler.compile(cd.JsonSchema(TREE))
  rng = np.random.default_rng(5)
  deep = 0
  prefix = b'{"value":1,"tags":["a"],"children":[{"value":2,"tags":["b"'
  for state, allowed, _ in _device_masks(tables, rng, byte_vocab.eos_ids[0], steps=80,
                                         prefix=prefix):
    assert not np.asarray(state.error).any()
    for row in range(allowed.shape[0]):
      if bool(state.done[row]):
        continue
      depth = int(state.depth[row])
      deep += depth >= 1
      stack = tuple(int(x) for x in np.asarray(state.stack[row, :depth]))
      registers = tuple(int(x) for x in np.asarray(state.registers[row]))
      np.testing.assert_array_equal(
          allowed[row], reference_allowed(tables, int(state.state[row]), stack, registers))
  assert deep > 5


def test_objects_with_recursive_members_keep_their_automaton(byte_compiler):
  """A register object whose member calls a rule that uses registers (itself) would lose
  its words to the callee: it keeps schema order (`_json_object_schemas._calls`)."""
  node = {"type": "object", "additionalProperties": False, "required": ["k00"],
          "properties": {**{k: {"type": "integer"} for k in KEYS},
                         "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}
  tables = byte_compiler.compile(cd.JsonSchema({"$defs": {"n": node}, "$ref": "#/$defs/n"}))
  assert tables.is_pushdown and not tables.has_registers
  assert reference_accepts(tables, list(b'{"k00":1,"k01":2,"kids":[{"k00":3}]}'))
  assert not reference_accepts(tables, list(b'{"k01":2,"k00":1}'))


def test_a_call_where_words_are_live_is_refused():
  """The compile-time check behind the front end: a rule whose register word is live
  across a call of a rule touching it raises `RegisterError` (the compiler's fallback)."""
  from constrained_decoding.automata import _pda, _registers  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _grammar, _ir as ir  # pylint: disable=g-import-not-at-top

  def rule(callee):
    return ir.concat(ir.Bytes(b"["), ir.Marker("clear", 0, 0), ir.Bytes(b"x"),
                     ir.Marker("set", 0, 1), ir.Bytes(b":"), ir.repeat(callee, 0, 1),
                     ir.Marker("need", 0, 1), ir.Bytes(b"]"))

  leaf = ir.Bytes(b"0")
  ok = _pda.build_rtn(_grammar.GrammarIR("r", (("r", rule(ir.RuleRef("f"))),
                                               ("f", ir.union(leaf, ir.concat(
                                                   ir.Bytes(b"("), ir.RuleRef("f"),
                                                   ir.Bytes(b")")))))))
  assert ok.contracted is not None
  with pytest.raises(_registers.RegisterError, match="saved on the stack"):
    _pda.build_rtn(_grammar.GrammarIR("r", (("r", rule(ir.RuleRef("r"))),)))


def test_save_and_load_keep_the_guards(byte_tables, byte_vocab, tmp_path):
  tables = byte_tables["tree"]
  path = tmp_path / "tree.cdt"
  tables.save(path, vocab=byte_vocab)
  loaded = cd.load_tables(path, vocab=byte_vocab)
  assert loaded.is_pushdown and loaded.has_hashes
  values = _documents("tree", 6, seed=5)
  texts = [list(_text(v)) for v in values]
  eos = byte_vocab.eos_ids[0]
  assert (_walk_many(loaded, texts, eos).tolist() == _walk_many(tables, texts, eos).tolist()
          == [_valid("tree", v) for v in values])


def test_stacked_with_other_tables(byte_tables, byte_compiler, byte_vocab):
  """Stacked after a flat register table (its words and hash rows first), the tree's
  guards and hashes still decide."""
  flat = byte_compiler.compile(cd.JsonSchema(RECORD))
  stacked = cd.stack_tables([flat, byte_tables["tree"]])
  assert stacked.is_pushdown and stacked.has_hashes
  values = _documents("tree", 8, seed=9)
  texts = [list(_text(v)) for v in values] + [list(b'{"k00":1,"k13":2,"k05":3}')] * 2
  ids = [1] * len(values) + [0, 1]
  width = 128 * -(-max(map(len, texts)) // 128)
  tokens = np.zeros((len(texts), width), np.int32)
  for row, ids_ in enumerate(texts):
    tokens[row, :len(ids_)] = ids_
  lengths = np.array([len(t) for t in texts], np.int32)
  got = _device_walk(stacked, tokens, lengths, byte_vocab.eos_ids[0],
                     jnp.asarray(ids, jnp.int32))
  assert np.asarray(got).tolist() == [_valid("tree", v) for v in values] + [True, False]


def test_gemma_random_tokenizations(gemma_compiler, gemma_vocab):
  """Random tokenizations (tokens crossing `","`, `"]}`, `},{"` and so calls, returns
  and register operations at once) agree with jsonschema."""
  index = TokenIndex(gemma_vocab)
  # Tokens that may finish two items (three quotes or more) are refused (a narrowing,
  # `docs/unique_items.md`).
  index.by_bytes = {b: ids for b, ids in index.by_bytes.items() if b.count(b'"') < 3}
  rng = random.Random(7)
  eos = gemma_vocab.eos_ids[0]
  for name in ("free", "tree"):
    tables = gemma_compiler.compile(cd.JsonSchema(SCHEMAS[name], **_OPTIONS.get(name, {})))
    assert tables.is_pushdown and tables.has_registers
    values = _documents(name, 10, seed=11)
    token_lists = [index.random_tokenization(_text(v), rng) for v in values]
    expected = [_valid(name, v) for v in values]
    assert 2 <= sum(expected) <= 8
    assert _walk_many(tables, token_lists, eos).tolist() == expected, name

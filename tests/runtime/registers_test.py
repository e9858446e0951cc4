"""Objects whose keys the device checks in register words (`automata/_registers.py`).

Large objects (past the any-order budget) accept their declared keys in any order, each
at most once, `required` checked at `}`, additional keys anywhere. Oracles: `json` (with
an `object_pairs_hook` that sees duplicate keys) and `jsonschema`; the device against
`testing.reference_*` (guards evaluated independently); the byte language against the
register-aware `ByteDfa.accepts`.
"""

import itertools
import json
import random

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _registers
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.testing import TokenIndex, reference_accepts, reference_allowed
from constrained_decoding.testing import reference_step_stack

KEYS = [f"k{i}" for i in range(14)] + ["nam", "name", "names"]
CLOSED = {"type": "object", "additionalProperties": False, "required": ["k3", "name"],
          "properties": {**{k: {"type": "integer"} for k in KEYS}, "s": {"type": "string"}}}
OPEN = {"type": "object", "required": ["k0"],
        "properties": {k: {"type": "boolean"} for k in KEYS}}
# Counted strings (`maxLength`: embedded chains, `automata/_embedded_chains.py`) inside
# an object whose keys are checked in registers.
COUNTED = {"type": "object", "additionalProperties": False, "required": ["k1"],
           "properties": {**{k: {"type": "integer"} for k in KEYS[:12]},
                          "s": {"type": "string", "maxLength": 30},
                          "t": {"type": "string", "minLength": 2, "maxLength": 24}}}
SCHEMAS = {"closed": CLOSED, "open": OPEN, "counted": COUNTED}


def _vocab(seed: int = 0) -> cd.Vocabulary:
  """Every byte, plus short random strings over the schemas' alphabet and a few tokens
  that cross key ends, value ends and `}`."""
  rng = random.Random(seed)
  tokens = [bytes([b]) for b in range(256)]
  alphabet = sorted(set(json.dumps({k: 1 for k in KEYS}) + ' truefalsx'))
  tokens += ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5))).encode()
             for _ in range(500)]
  tokens += [b'"name"', b'"names":', b'"nam', b'e"', b'":1,"', b'1}', b'"k1', b'5":',
             b'"}', b'x"}', b'true}', b'":true,"', b'{"k0":']
  tokens = list(dict.fromkeys(tokens))
  return cd.Vocabulary.from_token_bytes(tokens + [b""], eos_ids=[len(tokens)])


VOCAB = _vocab()
INDEX = TokenIndex(VOCAB)


@pytest.fixture(scope="module")
def compiled():
  compiler = cd.Compiler(VOCAB)
  return {name: compiler.compile(cd.JsonSchema(schema)) for name, schema in SCHEMAS.items()}


def _pairs(text: bytes) -> list:
  return json.loads(text, object_pairs_hook=lambda pairs: pairs)


def _valid(schema, text: bytes) -> bool:
  """Valid JSON for `schema` and no declared key written twice (the language asks both;
  additional keys may repeat, as documented: excluding that is not regular)."""
  try:
    pairs = _pairs(text)
  except ValueError:
    return False
  keys = [k for k, _ in pairs if k in schema["properties"]]
  return len(set(keys)) == len(keys) and jsonschema.Draft202012Validator(schema).is_valid(
      dict(pairs))


def _texts(schema, rng: random.Random, n: int) -> list[bytes]:
  """Objects over the declared keys (and an extra one), in random orders; some with a
  key twice, some without the required keys."""
  out = []
  for _ in range(n):
    keys = rng.sample(list(schema["properties"]), rng.randint(0, 6))
    if rng.random() < 0.7:
      keys = list(dict.fromkeys(schema["required"] + keys))
      rng.shuffle(keys)
    if rng.random() < 0.2:
      keys.insert(rng.randint(0, len(keys)), "extra")
    if keys and rng.random() < 0.2:
      keys.append(rng.choice(keys))
    value = {"integer": "7", "boolean": "true",
             "string": '"' + "x" * rng.choice([0, 1, 2, 23, 24, 25, 29, 30, 31]) + '"'}
    members = [f'"{k}":{value[schema["properties"].get(k, {"type": "integer"})["type"]]}'
               for k in keys]
    out.append(("{" + ",".join(members) + "}").encode())
  return out


def test_large_objects_lower_to_register_markers(compiled):
  for schema in SCHEMAS.values():
    dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
    assert len(dfa.marker_arcs) and {m.kind for m in dfa.markers} == {"clear", "set", "need"}
  # The counted strings are counting terminals, not 30 states of explicit edges each.
  assert compiled["counted"].has_registers and len(compiled["counted"].token_counts)


@pytest.mark.parametrize("name", SCHEMAS)
def test_byte_language_matches_jsonschema_on_permutations(name):
  schema = SCHEMAS[name]
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  rng = random.Random(name)
  texts = _texts(schema, rng, 300)
  verdicts = [(dfa.accepts(t), _valid(schema, t)) for t in texts]
  assert all(got == want for got, want in verdicts), [
      t for t, (got, want) in zip(texts, verdicts) if got != want][:3]
  assert {want for _, want in verdicts} == {True, False}  # Both kinds were drawn.


@pytest.mark.parametrize("name", SCHEMAS)
def test_tokenized_texts_are_accepted_exactly_when_valid(name, compiled):
  schema, tables = SCHEMAS[name], compiled[name]
  assert tables.has_registers
  rng = random.Random(f"tok-{name}")
  for text in _texts(schema, rng, 60):
    want = _valid(schema, text)
    for _ in range(2):
      assert reference_accepts(tables, INDEX.random_tokenization(text, rng)) == want, text


@pytest.mark.parametrize("name", SCHEMAS)
def test_device_walks_validate_and_match_the_reference(name, compiled):
  """Random walks over the device's allowed tokens: the mask equals the reference's
  (with the row's registers), no row errs or dead-ends, finished texts are valid."""
  schema, tables = SCHEMAS[name], compiled[name]
  batch, eos = 6, VOCAB.eos_ids[0]
  rng = random.Random(f"walk-{name}")
  allowed_fn, advance_fn = jax.jit(cd.allowed_tokens), jax.jit(cd.advance)
  state = cd.init_state(tables, batch)
  texts, finished = [b""] * batch, [None] * batch
  positions = [(int(tables.start[0]), ())] * batch
  registers = [(0,) * tables.register_init.shape[0]] * batch
  for step in range(90):
    allowed = np.asarray(allowed_fn(tables, state))
    chosen = []
    for r in range(batch):
      if finished[r] is None and step % 3 == 0:
        want = reference_allowed(tables, *positions[r], registers=registers[r])
        want[eos] = allowed[r, eos]  # End of sequence: checked below by validity.
        np.testing.assert_array_equal(allowed[r], want)
      ids = np.flatnonzero(allowed[r])
      assert len(ids), texts[r]
      if finished[r] is None and allowed[r, eos] and (rng.random() < 0.2 or step > 60
                                                      or len(ids) == 1):
        finished[r] = texts[r]
      if finished[r] is not None:
        chosen.append(eos)
        continue
      ids = [t for t in ids if t != eos]
      closing = [t for t in ids if set(VOCAB.token_bytes[t]) & set(b'",}')]
      token = int(rng.choice(closing if closing and rng.random() < 0.7 else ids))
      chosen.append(token)
      texts[r] += VOCAB.token_bytes[token]
      *positions[r], registers[r] = reference_step_stack(tables, *positions[r], token,
                                                         registers[r])
    state = advance_fn(tables, state, jnp.asarray(chosen, jnp.int32))
    assert not np.asarray(state.error).any()
  assert any(f is not None for f in finished), texts
  for text in finished:
    if text is not None:
      assert _valid(schema, text), text


def test_advance_refuses_a_key_written_twice_and_a_missing_required_key(compiled):
  tables = compiled["closed"]
  advance = jax.jit(cd.advance)
  for text, ok in [(b'{"name":1,"k3":2,"name":3}', False), (b'{"k3":1}', False),
                   (b'{"k3":1,"name":2}', True), (b'{"names":1,"name":2,"k3":3}', True)]:
    state = cd.init_state(tables, 1)
    for token in INDEX.longest_tokenization(text):
      state = advance(tables, state, jnp.asarray([token], jnp.int32))
    state = advance(tables, state, jnp.asarray([VOCAB.eos_ids[0]], jnp.int32))
    assert bool(state.done[0]) == ok and bool(state.error[0]) != ok, text


def test_a_prefix_of_written_keys_only_is_a_dead_end():
  """`"n` after `nam`, `name` and `names` are written leads nowhere: refused; `"na`
  while `names` is not written is fine."""
  schema = {"type": "object", "additionalProperties": False,
            "properties": {k: {"type": "integer"} for k in KEYS}}
  walker = compile_byte_dfa(cd.JsonSchema(schema).to_ir()).register_walker

  def walk(text):
    position = walker.start()
    for byte in text:
      position = position and walker.step(position, byte)
    return position

  assert walk(b'{"nam":1,"name":2,"names":3,"') is not None
  assert walk(b'{"nam":1,"name":2,"names":3,"n') is None
  assert walk(b'{"nam":1,"name":2,"k1":3,"n') is not None
  assert walk(b'{"nam":1,"name":2,"k1":3,"name') is not None  # "names" is still free.
  assert walk(b'{"nam":1,"name":2,"k1":3,"name"') is None


def test_unions_of_objects_keep_schema_order_and_register_errors_fall_back(caplog):
  big = {"type": "object", "properties": {k: {"type": "integer"} for k in KEYS}}
  union = {"anyOf": [big, {"type": "object", "properties": {"k0": {"type": "string"}}}]}
  assert not len(compile_byte_dfa(cd.JsonSchema(union).to_ir()).marker_arcs)
  nullable = {"anyOf": [big, {"type": "null"}]}  # One object: registers are fine.
  assert len(compile_byte_dfa(cd.JsonSchema(nullable).to_ir()).marker_arcs)
  with pytest.raises(_registers.RegisterError, match="property_order='schema'"):
    _registers.contract(compile_byte_dfa(ir.union(
        ir.concat(ir.Bytes(b"a"), ir.Marker("set", 0, 1), ir.Bytes(b"b")), ir.Bytes(b"ab"))))


def test_stacked_and_saved_tables_keep_their_registers(compiled, tmp_path):
  tables = compiled["closed"]
  stacked = cd.stack_tables([compiled["open"], tables])
  text = b'{"names":1,"k3":2,"name":3}'
  tokens = INDEX.longest_tokenization(text)
  assert reference_accepts(stacked, tokens, start=int(stacked.start[1]))
  assert not reference_accepts(stacked, INDEX.longest_tokenization(b'{"k3":2,"k3":3}'),
                               start=int(stacked.start[1]))
  path = tmp_path / "closed.npz"
  tables.save(path, vocab=VOCAB)
  loaded = cd.load_tables(path, vocab=VOCAB)
  for name in ("guard_ops", "group_guarded", "guarded_slots", "guarded_ids", "register_init"):
    np.testing.assert_array_equal(getattr(loaded, name), getattr(tables, name))
  state = cd.init_state(stacked, 2, constraint_ids=[0, 1])
  advance = jax.jit(cd.advance)
  for token in tokens:
    state = advance(stacked, state, jnp.asarray([token, token], jnp.int32))
  assert bool(state.error[0]) and not bool(state.error[1])  # `names` is no boolean key's.


def test_every_permutation_of_three_required_keys_is_accepted(compiled):
  tables = compiled["closed"]
  for order in itertools.permutations(["k3", "name", "s"]):
    text = ("{" + ",".join(f'"{k}":' + ('"x"' if k == "s" else "1") for k in order)
            + "}").encode()
    assert reference_accepts(tables, INDEX.longest_tokenization(text)), text


def test_a_required_key_without_a_valid_value_makes_the_object_unsatisfiable():
  schema = {**CLOSED, "properties": {**CLOSED["properties"], "name": False}}
  with pytest.raises(cd.SchemaError):
    cd.JsonSchema(schema).to_ir()


def test_a_very_long_key_compiles_without_deep_recursion():
  keys = {f"k{i}": {"type": "integer"} for i in range(13)} | {"x" * 3000: {"type": "integer"}}
  schema = {"type": "object", "additionalProperties": False, "properties": keys}
  dfa = compile_byte_dfa(cd.JsonSchema(schema).to_ir())
  assert dfa.accepts(('{"' + "x" * 3000 + '":1,"k0":2}').encode())
  assert not dfa.accepts(('{"' + "x" * 3000 + '":1,"' + "x" * 3000 + '":2}').encode())


def test_the_schema_order_fallback_shares_the_first_attempts_deadline(monkeypatch):
  """`max_seconds` bounds the register attempt and its fallback together (a budget
  refusal after both takes at most max_seconds, not twice that)."""
  compiler = cd.Compiler(VOCAB, cd.CompileOptions(max_seconds=30.0))
  calls = []
  original = cd.Compiler._compile_with_info

  def attempt(self, spec, deadline):
    calls.append((spec.property_order, deadline))
    if spec.property_order == "any":
      raise cd.CompileBudgetError("too many token edges")
    return original(self, spec, deadline)

  monkeypatch.setattr(cd.Compiler, "_compile_with_info", attempt)
  compiler.compile_with_info(cd.JsonSchema(CLOSED))
  assert [order for order, _ in calls] == ["any", "any_bounded"]
  assert calls[0][1] == calls[1][1]

"""Guards evaluated once per row (`runtime/_guards.py`) against independent oracles.

`allowed_bits` evaluates every guard of register tables once per row and reads each
guarded candidate's result from packed words, then ORs the passing tokens into the mask.
Oracles: the host's definition of a guard (`tables.apply_guard`, through
`testing.reference_allowed` / `reference_step_stack`) and the per-candidate evaluation
`_guards.run_guards` that `advance` uses. Two levels:

  * the guard results themselves, on random register words (reachable or not, so both
    outcomes of every kind of operation occur), dense path and per-candidate path;
  * the masks and next states (registers included) on every state of the walks of
    `benchmarks/register_objects_step.py` (corpus schemas, Gemma 3 vocabulary) at batch
    1 against the host reference, and at batch 8 and 64 (rows mixed as the benchmark
    mixes them) row by row against batch 1.
"""

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.runtime import _guards
from constrained_decoding.tables import apply_guard
from constrained_decoding.testing import reference_allowed, reference_step_stack

sys.path.insert(0, os.path.dirname(__file__))  # The small schemas live in registers_test.py.
from registers_test import SCHEMAS, VOCAB  # noqa: E402  pylint: disable=wrong-import-position

_CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "schemas")
# The benchmark's schemas with the most register words and guarded tokens per state.
CORPUS_SCHEMAS = ("config_package_json", "k8s_container", "openapi_paginated_users")


@pytest.fixture(scope="module")
def small_tables():
  compiler = cd.Compiler(VOCAB)
  return {name: compiler.compile(cd.JsonSchema(schema)) for name, schema in SCHEMAS.items()}


def _random_registers(tables, rows: int, rng: np.random.Generator) -> np.ndarray:
  """int32 [rows, NR]: per word, a random subset of the bits the guards name (or of a
  few more), or a small count, so that SET, NEED, LIVE and COUNT both pass and fail."""
  ops = np.asarray(tables.guard_ops)
  num_words = tables.register_init.shape[0]
  named = np.zeros(num_words, np.int64)
  for kind, word, operand in ops.reshape(-1, 3):
    if kind >= 0:
      named[word] |= operand
  out = np.zeros((rows, num_words), np.int64)
  for w in range(num_words):
    bits = rng.integers(0, 1 << 31, rows) & (named[w] | rng.integers(0, 256, rows))
    out[:, w] = np.where(rng.random(rows) < 0.2, rng.integers(0, 6, rows), bits)
  return out.astype(np.int32)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_guard_results_match_the_host_definition_on_random_registers(name, small_tables):
  tables = small_tables[name]
  assert tables.has_registers and not tables.has_hashes
  rng = np.random.default_rng(len(name))
  num_guards = tables.guard_ops.shape[0]
  registers = _random_registers(tables, 64, rng)
  ops = np.asarray(tables.guard_ops)
  want = np.array([[apply_guard(ops[g].tolist(), r.tolist()) is not None
                    for g in range(num_guards)] for r in registers])
  assert want.any() and not want.all()  # Both outcomes occur.
  every = jnp.broadcast_to(jnp.arange(num_guards), (64, num_guards))
  # N >= Gd: every guard once per row, results read from packed words.
  assert _guards._dense(tables, num_guards)  # pylint: disable=protected-access
  dense = jax.jit(_guards.guarded_passes)(tables, jnp.asarray(registers), every)
  np.testing.assert_array_equal(np.asarray(dense), want)
  # Candidates: random ids, -1 (no guard) among them, fewer than Gd per row and more.
  for n in (max(1, num_guards // 3), 3 * num_guards):
    ids = rng.integers(-1, num_guards, (64, n))
    expected = np.where(ids >= 0, want[np.arange(64)[:, None], np.maximum(ids, 0)], True)
    assert _guards._dense(tables, n) == (n >= num_guards)  # pylint: disable=protected-access
    got = jax.jit(_guards.guarded_passes)(tables, jnp.asarray(registers), jnp.asarray(ids))
    np.testing.assert_array_equal(np.asarray(got), expected)
    per_candidate, _ = jax.jit(_guards.run_guards)(tables, jnp.asarray(registers),
                                                   jnp.asarray(ids))
    np.testing.assert_array_equal(np.asarray(per_candidate), expected)


def test_a_guarded_token_the_mask_row_holds_stays_one_bit(small_tables):
  """Guarded tokens are ORed into the mask: with every mask row full, passing guarded
  tokens (their bits already set) change nothing. The compiler leaves guarded tokens out
  of the mask rows, so only edited tables reach this case."""
  tables = small_tables["closed"]
  full = dataclasses.replace(tables, mask_bits=np.full_like(tables.mask_bits, 0xFFFFFFFF))
  allowed_bits, advance = jax.jit(cd.allowed_bits), jax.jit(cd.advance)
  state, passing = cd.init_state(tables, 1), 0
  for byte in b'{"k3":1,"name":2,"k7":3}':
    np.testing.assert_array_equal(np.asarray(allowed_bits(full, state)), 0xFFFFFFFF)
    row = int(np.asarray(tables.group_guarded)[np.asarray(tables.state_groups)[
        int(state.state[0]), 0]])
    passing += row > 0 and bool(np.asarray(jax.jit(_guards.guarded_passes)(
        tables, state.registers, jnp.asarray(tables.guarded_ids[row][None])))[0][
            np.asarray(tables.guarded_slots)[row] >= 0].any())
    state = advance(tables, state, jnp.asarray([byte], jnp.int32))
  assert not bool(state.error[0]) and passing >= 3


def _greedy_tokens(token_bytes, text: str) -> list[int]:
  """The longest token at each position (highest id among equal bytes)."""
  ids = {t: i for i, t in enumerate(token_bytes) if t}
  longest = max(map(len, ids))
  data, out, pos = text.encode(), [], 0
  while pos < len(data):
    n = next(n for n in range(min(longest, len(data) - pos), 0, -1) if data[pos:pos + n] in ids)
    out.append(ids[data[pos:pos + n]])
    pos += n
  return out


def _rows(state: cd.ConstraintState, r: int) -> dict:
  return {f: np.asarray(getattr(state, f))[r] for f in ("state", "done", "error", "registers")}


@pytest.fixture(scope="module")
def corpus_walks(gemma_vocab, gemma_compiler):
  """name -> (tables, [(batch-1 state, token)]) over the corpus's valid instances."""
  advance = jax.jit(cd.advance)
  out = {}
  for name in CORPUS_SCHEMAS:
    with open(os.path.join(_CORPUS, name + ".json"), encoding="utf-8") as f:
      entry = json.load(f)
    tables = jax.device_put(gemma_compiler.compile(cd.JsonSchema(entry["schema"])))
    assert tables.has_registers and tables.guard_ops.shape[0] <= tables.guarded_slots.shape[1]
    steps = []
    for instance in entry["valid"]:
      state = cd.init_state(tables, 1)
      for token in _greedy_tokens(gemma_vocab.token_bytes,
                                  json.dumps(instance, separators=(",", ":"))):
        steps.append((state, token))
        state = advance(tables, state, jnp.asarray([token], jnp.int32))
      assert not bool(state.error[0]), instance
    out[name] = (tables, steps)
  return out


@pytest.mark.parametrize("name", CORPUS_SCHEMAS)
def test_corpus_walks_match_the_reference_at_batch_1_8_and_64(name, corpus_walks):
  tables, steps = corpus_walks[name]
  allowed_bits, advance = jax.jit(cd.allowed_bits), jax.jit(cd.advance)
  single = []
  for state, token in steps:  # Batch 1 against the host's reference.
    q, registers = int(state.state[0]), tuple(np.asarray(state.registers[0]).tolist())
    bits = np.asarray(allowed_bits(tables, state))[0]
    allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:tables.vocab_size]
    np.testing.assert_array_equal(allowed.astype(bool),
                                  reference_allowed(tables, q, (), registers))
    after = advance(tables, state, jnp.asarray([token], jnp.int32))
    q2, _, registers2 = reference_step_stack(tables, q, (), token, registers)
    assert (int(after.state[0]), tuple(np.asarray(after.registers[0]).tolist())) == (
        q2, tuple(registers2))
    single.append((bits, _rows(after, 0)))
  assert sum(not bool(np.all(r["registers"] == 0)) for _, r in single) > len(steps) // 2
  m = len(steps)
  for batch in (8, 64):  # Row r of step j at step (j + r) mod m: rows at mixed positions.
    for j in range(0, m, 3 if batch == 64 else 1):
      rows = [(j + r) % m for r in range(batch)]
      state = jax.tree.map(lambda *x: jnp.concatenate(x), *[steps[i][0] for i in rows])
      tokens = jnp.asarray([steps[i][1] for i in rows], jnp.int32)
      bits, after = np.asarray(allowed_bits(tables, state)), advance(tables, state, tokens)
      for r, i in enumerate(rows):
        np.testing.assert_array_equal(bits[r], single[i][0])
        for field, value in _rows(after, r).items():
          np.testing.assert_array_equal(value, single[i][1][field], err_msg=field)

"""The compiled `advance` does not grow with the tables on CPU: a guard for compile time.

An unrolled binary search over edges (one dependent gather per halving) made jax 0.12's
XLA take minutes to compile `advance` for register tables, so on CPU the search is a
loop (`_runtime.EDGE_SEARCH_UNROLL`; unrolled on accelerators, where a loop iteration
costs more than the gathers). Counting gathers in the program lowered for CPU checks the
structure, not a timing: register tables with 8x more edges lower to as many gathers.
The unrolled search must find the same edges as the loop, tested here on CPU too.
"""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.runtime import _runtime

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # The schemas live in registers_test.py.
from registers_test import CLOSED, KEYS, VOCAB  # noqa: E402


def _lowered(tables: cd.ConstraintTables) -> str:
  """StableHLO of `advance` for `tables` at batch 2, lowered for this machine's CPU."""
  args = (tables, cd.init_state(tables, 2), jnp.zeros((2,), jnp.int32))
  leaves, tree = jax.tree.flatten(args)  # flat: `Lowered` rebuilds pytrees of ArgInfo,
  # which the tests' shape-annotation checks refuse
  return jax.jit(lambda *xs: cd.advance(*jax.tree.unflatten(tree, xs))).lower(
      *leaves).as_text()


def _gathers(tables: cd.ConstraintTables) -> int:
  """Gathers in the lowered `advance` of `tables` (loop bodies count once)."""
  return _lowered(tables).count("stablehlo.gather")


@pytest.fixture
def unroll_on_cpu(monkeypatch):
  """Sets the CPU's unroll factor of the edge search (and drops compiled programs)."""
  def set_unroll(unroll):
    monkeypatch.setitem(_runtime.EDGE_SEARCH_UNROLL, "cpu", unroll)
    jax.clear_caches()
  yield set_unroll
  jax.clear_caches()


def test_advance_gathers_do_not_grow_with_the_edges():
  compiler = cd.Compiler(VOCAB)
  small = compiler.compile(cd.JsonSchema(
      {**CLOSED, "required": [], "properties": {k: {"type": "integer"} for k in KEYS[:8]}}))
  large = compiler.compile(cd.JsonSchema(CLOSED))
  assert small.has_registers and large.has_registers
  assert large.edge_tokens.shape[0] >= 8 * small.edge_tokens.shape[0]
  assert _gathers(large) == _gathers(small)


def test_the_search_is_a_loop_on_cpu_and_unrolled_when_asked(unroll_on_cpu):
  tables = cd.Compiler(VOCAB).compile(cd.JsonSchema(CLOSED))
  looped = _lowered(tables)
  unroll_on_cpu(True)
  unrolled = _lowered(tables)
  assert looped.count("stablehlo.while") == 1 and "stablehlo.while" not in unrolled


def _wide_vocab() -> cd.Vocabulary:
  """Bytes plus 4,000 random lowercase words: a state of `[a-m ]*[n-z][a-z ]*` has
  ~2,000 explicit edges (the tokens that pass from one loop to the other)."""
  rng = np.random.default_rng(1)
  words = {"".join(rng.choice(list("abcdefghij klmnopqrstuvwxyz"), size=rng.integers(2, 8)))
           for _ in range(4200)}
  tokens = [bytes([b]) for b in range(256)] + sorted(w.encode() for w in words)
  return cd.Vocabulary.from_token_bytes(tokens + [None], eos_ids=[len(tokens)])


def _leaves(state) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(state)]


def _assert_same_states(looped: list, unrolled: list) -> None:
  for a, b in zip(looped, unrolled, strict=True):
    for x, y in zip(a, b, strict=True):
      np.testing.assert_array_equal(x, y)


def test_unrolled_search_walks_register_tables_like_the_loop(unroll_on_cpu):
  """Rows 0-2 take allowed tokens only; rows 3-5 also one arbitrary token, at steps 2,
  7 and 12: every state field after each step is equal under both searches."""
  tables = cd.Compiler(VOCAB).compile(cd.JsonSchema(CLOSED))
  rng = np.random.default_rng(0)
  walked = []

  def draw(step, state):
    allowed = np.asarray(cd.allowed_tokens(tables, state))
    tokens = [rng.choice(np.flatnonzero(row)) for row in allowed]
    for row in (3, 4, 5):
      if step == 5 * (row - 3) + 2:
        tokens[row] = rng.integers(VOCAB.vocab_size)
    walked.append(tokens)
    return tokens

  def run(choose):
    state, states = cd.init_state(tables, 6), []
    for step in range(16):
      state = jax.jit(cd.advance)(tables, state, jnp.asarray(choose(step, state), jnp.int32))
      states.append(_leaves(state))
    return states

  looped = run(draw)
  error = [f.name for f in dataclasses.fields(cd.ConstraintState)].index("error")
  assert not looped[-1][error][:3].any()
  unroll_on_cpu(True)
  _assert_same_states(looped, run(lambda step, _: walked[step]))


def test_unrolled_search_finds_every_edge_of_a_wide_state(unroll_on_cpu):
  """Every token of the vocabulary from the start state of a regex whose start state
  has ~2,000 explicit edges (10+ halvings): the same next states under both searches."""
  vocab = _wide_vocab()
  tables = cd.Compiler(vocab).compile(cd.Regex("[a-m ]*[n-z][a-z ]*"))
  assert np.diff(np.asarray(tables.edge_start)).max() > 1000
  tokens = jnp.arange(vocab.vocab_size, dtype=jnp.int32)
  step = lambda: [_leaves(jax.jit(cd.advance)(
      tables, cd.init_state(tables, vocab.vocab_size), tokens))]
  looped = step()
  error = [f.name for f in dataclasses.fields(cd.ConstraintState)].index("error")
  assert (~looped[0][error]).sum() > 1000
  unroll_on_cpu(True)
  _assert_same_states(looped, step())

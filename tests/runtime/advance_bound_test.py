"""`advance` takes a token exactly when the mask offers it, at the stack bound too.

Stack-aware masks leave out the tokens of push-down tables after which a row could not
finish within its stack, including tokens whose pushes would still fit. A token fed by
hand (teacher forcing, speculative drafts) must be judged the same way: for states
reached by random walks that nest to the bound, every token id of the byte vocabulary
is fed to `advance` (one row per token) and the rows without `error` must be exactly
the mask row of `allowed_tokens`, which must be `reference_allowed`'s (numpy, from the
edges); where a token is taken, the step must be `reference_step_stack`'s.
"""

import dataclasses
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import (reference_allowed, reference_end_allowed,
                                          reference_step_stack)

PAREN = 'root ::= "(" root ")" | "x"\n'
NESTING = 'root ::= "(" root ")" | "x" | "[" list "]"\nlist ::= root ("," root)*\n'
TREE = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}},
                  {"type": "object", "additionalProperties": {"$ref": "#"}}]}
CASES = {"paren": (lambda: cd.Grammar(PAREN), 3),
         "nesting": (lambda: cd.Grammar(NESTING), 4),
         "json": (lambda: cd.JsonSchema(TREE), 4)}
OPENING = b"([{"

_MASK = jax.jit(cd.allowed_tokens)
_STEP = jax.jit(cd.advance)


@pytest.fixture(scope="module", name="compiled")
def fixture_compiled(byte_vocab):
  cache = {}

  def compiled(name):
    if name not in cache:
      spec, depth = CASES[name]
      options = cd.CompileOptions(stack_depth=depth, cache_dir=None)
      cache[name] = cd.Compiler(byte_vocab, options).compile(spec())
    return cache[name]
  return compiled


def _walk_states(tables, rng: random.Random, walks: int, max_tokens: int):
  """Distinct (state, stack) pairs along random walks over allowed tokens that prefer
  opening ones, so that they reach the stack bound."""
  seen = {}
  for _ in range(walks):
    state, stack = int(tables.start[0]), ()
    for _ in range(max_tokens):
      seen[state, stack] = None
      allowed = reference_allowed(tables, state, stack)
      choices = [t for t in np.nonzero(allowed)[0].tolist() if t < 256]
      if not choices:
        break
      deeper = [t for t in choices if t in OPENING]
      if deeper and rng.random() < 0.7:
        choices = deeper
      state, stack = reference_step_stack(tables, state, stack, rng.choice(choices))
  return list(seen)


def _rows(tables, state: int, stack: tuple[int, ...], batch: int) -> cd.ConstraintState:
  """`batch` rows all at (state, stack)."""
  padded = np.zeros((batch, tables.stack_depth), np.int32)
  padded[:, :len(stack)] = stack
  return cd.ConstraintState(
      state=jnp.full((batch,), state, jnp.int32), stack=jnp.asarray(padded),
      depth=jnp.full((batch,), len(stack), jnp.int32), done=jnp.zeros(batch, bool),
      error=jnp.zeros(batch, bool))


def _check_every_token(tables, state: int, stack: tuple[int, ...]) -> int:
  """Feeds every token id to (state, stack); returns how many tokens of the language
  the mask refuses although their pushes would fit (the stack-aware cases)."""
  vocab_size = tables.vocab_size
  rows = _rows(tables, state, stack, vocab_size)
  after = _STEP(tables, rows, jnp.arange(vocab_size, dtype=jnp.int32))
  taken = ~np.asarray(after.error)
  mask = np.asarray(_MASK(tables, _rows(tables, state, stack, 1))[0])
  np.testing.assert_array_equal(mask, reference_allowed(tables, state, stack))
  np.testing.assert_array_equal(taken, mask, err_msg=f"state {state} stack {stack}")
  fits = 0
  for t in range(vocab_size):
    step = reference_step_stack(tables, state, stack, t)
    if taken[t] and t != 256:
      depth = int(after.depth[t])
      assert (int(after.state[t]), tuple(np.asarray(after.stack[t, :depth]).tolist())) == step
    elif t == 256:
      assert bool(after.done[t]) == taken[t] == reference_end_allowed(tables, state, stack)
    else:
      # Refused: the row is left as it was.
      assert (int(after.state[t]), int(after.depth[t])) == (state, len(stack))
      fits += step is not None and len(step[1]) <= tables.stack_depth
  return fits


@pytest.mark.parametrize("name", list(CASES))
def test_advance_takes_a_token_iff_the_mask_allows_it(name, compiled):
  tables = compiled(name)
  assert tables.is_pushdown
  states = _walk_states(tables, random.Random(name), walks=12, max_tokens=30)
  assert max(len(stack) for _, stack in states) == tables.stack_depth  # the bound is reached
  fits = sum(_check_every_token(tables, state, stack) for state, stack in states)
  assert fits > 0  # tokens that the step took before it checked the capped rows


def test_teacher_forced_token_past_the_bound_sets_error(compiled):
  """With a stack of 3, `((((` fits (the first `(` pushes nothing: returns are lazy),
  but then `x` would push a fourth symbol: the mask refuses the fourth `(`, and so
  must the step, leaving the row where it was."""
  tables = compiled("paren")
  state = cd.init_state(tables, batch_size=1)
  for t in b"(((":
    assert bool(np.asarray(_MASK(tables, state))[0, t])
    state = _STEP(tables, state, jnp.array([t], jnp.int32))
    assert not bool(state.error[0])
  assert not bool(np.asarray(_MASK(tables, state))[0, ord("(")])
  after = _STEP(tables, state, jnp.array([ord("(")], jnp.int32))
  assert bool(after.error[0])
  assert int(after.state[0]) == int(state.state[0]) and int(after.depth[0]) == int(state.depth[0])
  # The row can still finish along the allowed tokens.
  for t in b"x)))":
    state = _STEP(tables, state, jnp.array([t], jnp.int32))
  state = _STEP(tables, state, jnp.array([256], jnp.int32))
  assert bool(state.done[0]) and not bool(state.error[0])


def test_without_capped_rows_the_same_token_is_taken_then_overflows(compiled):
  """The check is not vacuous: tables without stack-aware masks (capped rows removed)
  take that fourth `(` (it fits), and the row then overflows on `x`."""
  tables = compiled("paren")
  uncapped = dataclasses.replace(tables, capped_limits=np.zeros((0, 0), np.int32),
                                 capped_rows=np.zeros((0, 0), np.int32),
                                 capped_bits=np.zeros((0, 0), np.uint32))
  state = cd.init_state(uncapped, batch_size=1)
  for t in b"((((":
    state = _STEP(uncapped, state, jnp.array([t], jnp.int32))
  assert not bool(state.error[0]) and int(state.depth[0]) == 3
  state = _STEP(uncapped, state, jnp.array([ord("x")], jnp.int32))
  assert bool(state.error[0])

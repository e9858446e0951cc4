"""rewind: restores exactly the state seen n steps earlier; re-advancing reproduces states.

The oracle is the trajectory itself: every state the device produced is kept (as numpy)
and compared, leaf by leaf, with what `rewind` restores. Walks are driven by the
device's own `allowed_tokens`, so the tests run unchanged on any tables (regular,
stacked, push-down) and on every field `ConstraintState` has or will get.
"""

import dataclasses

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import constrained_decoding as cd
from constrained_decoding import errors

_BATCH = 3
_MAX_REWIND = 4

_advance = jax.jit(cd.advance)
_allowed = jax.jit(cd.allowed_tokens)
_record = jax.jit(cd.record)
_rewind = jax.jit(cd.rewind)

_RECURSIVE = 'root ::= "(" root ")" | "[" root "]" | [a-z]{1,3}'


def _regex(pattern):
  return lambda compiler: compiler.compile(cd.Regex(pattern))


def _stacked(compiler):
  return cd.stack_tables([compiler.compile(cd.Regex(p))
                          for p in (r"\d{2,5}", r"[a-z ]{1,30}", r"(yes|no)!")])


def _grammar_unrolled(compiler):
  return compiler.compile(cd.Grammar(_RECURSIVE, max_depth=4))


def _grammar_pushdown(compiler):
  """Push-down tables for a recursive grammar, with a small stack so that deep random
  walks overflow it, which sets `error` (rewound like any other)."""
  compiler = cd.Compiler(compiler.vocab, cd.CompileOptions(stack_depth=6))
  try:
    tables = compiler.compile(cd.Grammar(_RECURSIVE))
  except errors.ConstraintError as e:
    pytest.skip(f"push-down tables not available yet: {e}")
  if not tables.stack_depth:
    pytest.skip("the compiler returned regular tables for a recursive grammar")
  return tables


_TABLES = {
    "iso_date": _regex(r"\d{4}-[01]\d-[0-3]\d"),
    "free_text": _regex(r"[a-z ]{1,40}"),  # a wide state (terminal edge)
    "json_answer": _regex(r'\{"answer": "[ABCD]", "why": "[a-z ]{0,12}"\}'),
    "stacked": _stacked,
    "grammar_unrolled": _grammar_unrolled,
    "grammar_pushdown": _grammar_pushdown,
}


@pytest.fixture(scope="module", params=sorted(_TABLES))
def tables_and_ids(request, gemma_compiler):
  tables = jax.device_put(_TABLES[request.param](gemma_compiler))
  ids = jnp.arange(_BATCH, dtype=jnp.int32) % tables.num_constraints
  return tables, ids


def _host(state) -> dict[str, np.ndarray]:
  """Every field of a `ConstraintState` (whatever fields it has) as numpy."""
  return {f.name: np.asarray(getattr(state, f.name)) for f in dataclasses.fields(state)}


def _row(host: dict, b: int) -> dict:
  return {name: value[b] for name, value in host.items()}


def _assert_rows_equal(actual: dict, expected: dict, context: str):
  assert actual.keys() == expected.keys()
  for name in actual:
    np.testing.assert_array_equal(actual[name], expected[name], err_msg=f"{context}: {name}")


def _with_error(row: dict) -> dict:
  return {**row, "error": np.asarray(True)}


class _Walk:
  """Device state + history, next to the trajectory model they must agree with."""

  def __init__(self, tables, ids, rng):
    self.tables, self.rng = tables, rng
    self.state = cd.init_state(tables, constraint_ids=ids)
    self.history = cd.init_history(self.state, _MAX_REWIND)
    host = _host(self.state)
    # Per row: every state since the start (newest last) with the token that led there.
    self.trajectory = [[(_row(host, b), None)] for b in range(_BATCH)]
    self.count = [1] * _BATCH  # snapshots the history must hold
    self.undone = [[] for _ in range(_BATCH)]  # (state, token) undone by the last rewind
    self.poisoned = [False] * _BATCH  # a rewind went too far: error for good

  def random_tokens(self):
    allowed = np.asarray(_allowed(self.tables, self.state))
    tokens = []
    for row in allowed:
      u = self.rng.random()
      if u < 0.05:  # any token at all: usually forbidden, which sets `error`
        tokens.append(int(self.rng.integers(0, self.tables.vocab_size)))
      elif u < 0.08:  # end of sequence (forbidden unless accepting)
        tokens.append(1)
      else:
        tokens.append(int(self.rng.choice(np.nonzero(row)[0])))
    return tokens

  def advance(self, replay: bool):
    tokens = self.random_tokens()
    expected = [None] * _BATCH
    for b in range(_BATCH):
      if replay and self.undone[b]:
        expected[b], tokens[b] = self.undone[b].pop()
      else:
        self.undone[b] = []
    self.state = _advance(self.tables, self.state, jnp.asarray(tokens, jnp.int32))
    self.history = _record(self.history, self.state)
    host = _host(self.state)
    for b in range(_BATCH):
      row = _row(host, b)
      if expected[b] is not None:  # re-advancing the undone token reproduces its state
        _assert_rows_equal(row, expected[b], f"replay row {b}")
      self.trajectory[b].append((row, tokens[b]))
      self.count[b] = min(self.count[b] + 1, _MAX_REWIND + 1)

  def rewind(self, steps):
    self.history, self.state = _rewind(self.history, self.state,
                                       jnp.asarray(steps, jnp.int32))
    host = _host(self.state)
    for b, n in enumerate(steps):
      if 0 <= n < self.count[b]:
        undone = self.trajectory[b][len(self.trajectory[b]) - n:]
        del self.trajectory[b][len(self.trajectory[b]) - n:]
        # A row flagged by a failed rewind ignores tokens: nothing replays there.
        self.undone[b] = [] if self.poisoned[b] else undone[::-1]
        self.count[b] -= n
        expected = self.trajectory[b][-1][0]
      else:  # too far (or negative): the row keeps its state, flagged, for good
        self.trajectory[b] = [(_with_error(s), t) for s, t in self.trajectory[b]]
        self.poisoned[b] = True
        self.undone[b] = []
        expected = self.trajectory[b][-1][0]
      _assert_rows_equal(_row(host, b), expected, f"rewind row {b} by {n}")
    np.testing.assert_array_equal(np.asarray(self.history.count), self.count)


_OPS = st.lists(
    st.one_of(st.just("advance"), st.just("replay"),
              st.lists(st.integers(-1, _MAX_REWIND + 2), min_size=_BATCH, max_size=_BATCH)),
    min_size=1, max_size=28)


@hypothesis.settings(max_examples=15, deadline=None, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(seed=st.integers(0, 2**32 - 1), ops=_OPS)
def test_rewind_restores_and_readvance_reproduces(tables_and_ids, seed, ops):
  tables, ids = tables_and_ids
  walk = _Walk(tables, ids, np.random.default_rng(seed))
  for op in ops:
    if op in ("advance", "replay"):
      walk.advance(replay=op == "replay")
    else:
      walk.rewind(op)


def test_long_walk_wraps_the_ring_buffer(gemma_compiler):
  # More advances than slots: the last H states stay reachable, H + 1 steps do not.
  tables = gemma_compiler.compile(cd.Regex(r"[a-z]{1,60}"))
  walk = _Walk(tables, jnp.zeros(_BATCH, jnp.int32), np.random.default_rng(0))
  for _ in range(3 * (_MAX_REWIND + 1) + 2):
    walk.advance(replay=False)
  assert walk.count == [_MAX_REWIND + 1] * _BATCH
  walk.rewind([_MAX_REWIND, _MAX_REWIND + 1, 2])  # checked against the trajectory
  assert bool(walk.state.error[1])
  walk.advance(replay=True)
  walk.advance(replay=True)


def _random_state(rng, batch, depth):
  """A `ConstraintState` with arbitrary contents in every field (stack included)."""
  base = cd.ConstraintState(
      state=jnp.zeros(batch, jnp.int32), stack=jnp.zeros((batch, depth), jnp.int32),
      depth=jnp.zeros(batch, jnp.int32), done=jnp.zeros(batch, bool),
      error=jnp.zeros(batch, bool), registers=jnp.zeros((batch, 2), jnp.int32))

  def fill(leaf):
    if leaf.dtype == jnp.bool_:
      return jnp.asarray(rng.random(leaf.shape) < 0.3)
    return jnp.asarray(rng.integers(0, 1000, leaf.shape), leaf.dtype)

  return jax.tree_util.tree_map(fill, base).replace(error=jnp.zeros(batch, bool))


def test_every_field_is_restored_generically():
  # No tables: arbitrary states, as any future field would hold, are snapshotted whole.
  rng = np.random.default_rng(1)
  states = [_random_state(rng, 4, depth=5) for _ in range(7)]
  history = cd.init_history(states[0], max_rewind=6)
  for s in states[1:]:
    history = _record(history, s)
  steps = jnp.array([0, 3, 6, 2])
  history, restored = _rewind(history, states[-1], steps)
  for b, n in enumerate(steps.tolist()):
    _assert_rows_equal(_row(_host(restored), b), _row(_host(states[-1 - n]), b), f"row {b}")
  # Rewinding again continues from the restored point: row 3 is now 2 steps in.
  _, again = _rewind(history, restored, jnp.array([0, 1, 0, 4]))
  assert np.asarray(again.error).tolist() == [False, False, False, False]
  _assert_rows_equal(_row(_host(again), 1), _row(_host(states[2]), 1), "row 1")
  _assert_rows_equal(_row(_host(again), 3), _row(_host(states[0]), 3), "row 3")


def test_too_far_sets_error_without_corrupting():
  rng = np.random.default_rng(2)
  states = [_random_state(rng, 2, depth=3) for _ in range(3)]
  history = cd.init_history(states[0], max_rewind=8)
  history = cd.record(cd.record(history, states[1]), states[2])
  history, out = cd.rewind(history, states[2], jnp.array([3, -1]))
  assert np.asarray(out.error).tolist() == [True, True]
  _assert_rows_equal({**_host(out), "error": _host(states[2])["error"]}, _host(states[2]),
                     "kept")
  np.testing.assert_array_equal(history.count, [3, 3])
  # Sticky: a later, valid rewind keeps the flag.
  _, later = cd.rewind(history, out, 2)
  assert np.asarray(later.error).tolist() == [True, True]
  _assert_rows_equal({**_host(later), "error": _host(states[0])["error"]}, _host(states[0]),
                     "later")


def test_rewind_under_vmap_and_without_jit(gemma_compiler, gemma_vocab):
  tables = gemma_compiler.compile(cd.Regex(r"\d{1,8}"))
  digits = [i for i, b in enumerate(gemma_vocab.token_bytes) if b in (b"1", b"2")]
  groups = jax.vmap(lambda _: cd.init_state(tables, batch_size=2))(jnp.arange(3))
  history = jax.vmap(lambda s: cd.init_history(s, 2))(groups)
  token = jnp.full((3, 2), digits[0], jnp.int32)
  advanced = jax.vmap(cd.advance, in_axes=(None, 0, 0))(tables, groups, token)
  history = jax.vmap(cd.record)(history, advanced)
  with jax.disable_jit():
    _, back = jax.vmap(cd.rewind)(history, advanced, jnp.ones((3, 2), jnp.int32))
  _assert_rows_equal(_host(back), _host(groups), "vmap")
  assert not np.asarray(advanced.state == groups.state).any()


def test_init_history_rejects_bad_length():
  state = _random_state(np.random.default_rng(0), 1, depth=0)
  with pytest.raises(ValueError, match=r"init_history got max_rewind=-1\. Expected an int >= 0"):
    cd.init_history(state, -1)

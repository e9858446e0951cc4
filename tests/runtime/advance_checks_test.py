"""The runtime's public functions check token arrays, logits and states at the host
boundary (issue 20, "Silent coercions" and "broadcast"): a typed
`DecodingArgumentError` that names the argument, what was expected and what was
given, never a truncated, wrapped or broadcast id. Inside jit the dtype and shape
checks run once at trace time; values are unknown there (documented: `error`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import errors

V = 257  # the byte vocabulary: 256 bytes and end of sequence (256)


@pytest.fixture(scope="module", name="tables")
def fixture_tables(byte_compiler):
  return byte_compiler.compile(cd.Regex("a+b"))


@pytest.fixture(scope="module", name="grammar")
def fixture_grammar(byte_vocab):
  options = cd.CompileOptions(stack_depth=3, cache_dir=None)
  return cd.Compiler(byte_vocab, options).compile(cd.Grammar('root ::= "(" root ")" | "x"\n'))


def _raises(message: str):
  return pytest.raises(errors.DecodingArgumentError, match=message)


@pytest.mark.parametrize("tokens, message", [
    (np.array([97.9, 97.0], np.float32), r"advance: tokens is a float32 array of shape \(2,\)"
                                         r"\. Expected an integer dtype"),
    (jnp.array([97.9, 97.0]), r"tokens is a float32 array .* Expected an integer dtype"),
    ([97.9, 97.0], r"tokens is a float64 array .* Expected an integer dtype"),
    (np.array([True, False]), r"tokens is a bool array .* Expected an integer dtype"),
    (np.array([2**32 + 97, 97], np.int64),
     r"advance: tokens\[0\] = 4294967393 is out of range\. Expected token ids in \[0, 257\)"),
    (np.array([97, -1], np.int64), r"tokens\[1\] = -1 is out of range\. Expected token ids "
                                   r"in \[0, 257\)"),
    (jnp.array([97, V], jnp.int32), r"tokens\[1\] = 257 is out of range"),
    (np.array([97, 97, 97], np.int32), r"tokens is a int32 array of shape \(3,\)\. Expected "
                                       r"shape \(2,\)"),
    (np.array([97], np.int32), r"of shape \(1,\)\. Expected shape \(2,\)"),
    (np.array([[97], [97]], np.int32), r"of shape \(2, 1\)\. Expected shape \(2,\)"),
    (np.int32(97), r"of shape \(\)\. Expected shape \(2,\)"),
])
def test_advance_rejects_bad_tokens(tokens, message, tables):
  state = cd.init_state(tables, batch_size=2)
  with _raises(message):
    cd.advance(tables, state, tokens)


def test_advance_accepts_integer_arrays_of_any_width(tables):
  state = cd.init_state(tables, batch_size=2)
  for tokens in ([97, 97], np.array([97, 97], np.int64), np.array([97, 97], np.uint8),
                 jnp.array([97, 97], jnp.int32), np.array([97, 97], np.uint64)):
    out = cd.advance(tables, state, tokens)
    assert np.asarray(out.error).tolist() == [False, False]
    assert np.asarray(out.state).tolist() != np.asarray(state.state).tolist()
  # End of sequence (id 256, in range) where end is not allowed: error, not a raise.
  out = cd.advance(tables, state, np.array([256, 97]))
  assert np.asarray(out.error).tolist() == [True, False]


def test_errors_are_value_errors(tables):
  state = cd.init_state(tables, batch_size=1)
  with pytest.raises(ValueError):
    cd.advance(tables, state, np.array([97.5]))


def test_jitted_advance_checks_at_trace_time_and_does_not_retrace(tables):
  traces = []

  @jax.jit
  def step(tables, state, tokens):
    traces.append(1)
    return cd.advance(tables, state, tokens)

  state = cd.init_state(tables, batch_size=2)
  for tokens in ([97, 97], [97, 97], [98, 97]):
    state = step(tables, state, jnp.array(tokens, jnp.int32))
  assert len(traces) == 1
  assert np.asarray(state.error).tolist() == [False, False]
  assert np.asarray(state.done).tolist() == [False, False]
  # Values are unknown inside jit: an id out of range sets the row's error (documented).
  state = cd.init_state(tables, batch_size=2)
  out = step(tables, state, jnp.array([-5, V + 3], jnp.int32))
  assert np.asarray(out.error).tolist() == [True, True]
  assert len(traces) == 1
  # Dtypes and shapes are static: checked while tracing.
  with _raises(r"tokens is a float32 array of shape \(2,\)\. Expected an integer dtype"):
    step(tables, state, jnp.array([97.9, 97.0]))
  with _raises(r"tokens is a int32 array of shape \(3,\)\. Expected shape \(2,\)"):
    step(tables, state, jnp.array([97, 97, 97], jnp.int32))


def test_vmapped_advance_and_mask_still_work(tables):
  states = jax.vmap(lambda _: cd.init_state(tables, batch_size=3))(jnp.arange(2))
  tokens = jnp.array([[97, 97, 98], [98, 97, 97]], jnp.int32)
  out = jax.vmap(cd.advance, in_axes=(None, 0, 0))(tables, states, tokens)
  assert np.asarray(out.error).tolist() == [[False, False, True], [True, False, False]]
  masked = jax.vmap(cd.mask_logits, in_axes=(None, 0, 0))(tables, out, jnp.zeros((2, 3, V)))
  assert masked.shape == (2, 3, V)


@pytest.mark.parametrize("logits, message", [
    (np.zeros((V,), np.float32), r"mask_logits: logits is a float32 array of shape \(257,\)"
                                 r"\. Expected shape \(2, V'\) with V' >= 257"),
    (np.zeros((3, V), np.float32), r"of shape \(3, 257\)\. Expected shape \(2, V'\)"),
    (np.zeros((1, V), np.float32), r"of shape \(1, 257\)\. Expected shape \(2, V'\)"),
    (np.zeros((2, V - 1), np.float32), r"of shape \(2, 256\)\. Expected shape \(2, V'\) "
                                       r"with V' >= 257"),
    (np.zeros((2, 1, V), np.float32), r"of shape \(2, 1, 257\)\. Expected shape \(2, V'\)"),
    (np.zeros((2, V), np.int32), r"logits is a int32 array of shape \(2, 257\)\. Expected a "
                                 r"floating dtype"),
    (np.zeros((2, V), bool), r"logits is a bool array .* Expected a floating dtype"),
])
def test_mask_logits_rejects_bad_logits(logits, message, tables):
  state = cd.init_state(tables, batch_size=2)
  with _raises(message):
    cd.mask_logits(tables, state, logits)
  with _raises(message):  # the same at trace time
    jax.jit(cd.mask_logits)(tables, state, jnp.asarray(logits))


def test_mask_logits_takes_wider_and_bfloat16_logits(tables):
  state = cd.init_state(tables, batch_size=2)
  for logits in (np.zeros((2, V), np.float32), jnp.zeros((2, V + 31), jnp.bfloat16)):
    masked = np.asarray(cd.mask_logits(tables, state, logits), np.float32)
    assert masked.shape == logits.shape
    assert np.isfinite(masked[:, 97]).all() and not np.isfinite(masked[:, 98]).any()
    assert not np.isfinite(masked[:, V:]).any()


@pytest.mark.parametrize("kwargs, message", [
    (dict(constraint_ids=np.array([0.0, 1.0])), r"init_state: constraint_ids is a float64 "
                                               r"array of shape \(2,\)\. Expected an integer"),
    (dict(constraint_ids=np.array([0, 2])), r"constraint_ids\[1\] = 2 is out of range\. "
                                            r"Expected indices of stacked constraints in "
                                            r"\[0, 2\)"),
    (dict(constraint_ids=[5]), r"constraint_ids\[0\] = 5 is out of range"),
    (dict(constraint_ids=jnp.array([-1, 0])), r"constraint_ids\[0\] = -1 is out of range"),
    (dict(constraint_ids=np.array([2**32, 0], np.int64)),
     r"constraint_ids\[0\] = 4294967296 is out of range"),
    (dict(constraint_ids=np.zeros((2, 1), np.int32)), r"of shape \(2, 1\)\. Expected shape "
                                                      r"\(B,\)"),
    (dict(batch_size=2, constraint_ids=np.zeros(3, np.int32)),
     r"constraint_ids has shape \(3,\)\. Expected \(2,\)"),
    (dict(batch_size=0), r"batch_size 0 is not a positive int"),
    (dict(batch_size=True), r"batch_size True is not a positive int"),
    (dict(), r"init_state needs batch_size or constraint_ids"),
])
def test_init_state_rejects(kwargs, message, tables, byte_compiler):
  stacked = cd.stack_tables([tables, byte_compiler.compile(cd.Regex("[0-9]"))])
  with _raises(message):
    cd.init_state(stacked, **kwargs)


def test_init_state_in_jit_checks_dtype_and_takes_ids(tables, byte_compiler):
  stacked = cd.stack_tables([tables, byte_compiler.compile(cd.Regex("[0-9]"))])
  init = jax.jit(lambda t, ids: cd.init_state(t, constraint_ids=ids))
  state = init(stacked, jnp.array([1, 0], jnp.int32))
  out = cd.advance(stacked, state, [ord("7"), ord("a")])
  assert np.asarray(out.error).tolist() == [False, False]
  with _raises(r"constraint_ids is a float32 array"):
    init(stacked, jnp.array([1.0, 0.0]))


def test_a_state_of_other_tables_is_refused(tables, grammar):
  """A push-down state (stack of 3) with regular tables, and the other way round."""
  for state_of, used_with in ((grammar, tables), (tables, grammar)):
    state = cd.init_state(state_of, batch_size=2)
    for call in (lambda: cd.allowed_tokens(used_with, state),
                 lambda: cd.allowed_bits(used_with, state),
                 lambda: cd.mask_logits(used_with, state, np.zeros((2, V), np.float32)),
                 lambda: cd.advance(used_with, state, [97, 97])):
      with _raises(r"state\.stack has shape \(2, \d\)\. Expected \(2, \d\) for these tables "
                   r"\(stack_depth \d\)"):
        call()


def test_a_state_with_an_extra_axis_is_refused(tables):
  states = jax.vmap(lambda _: cd.init_state(tables, batch_size=3))(jnp.arange(2))
  with _raises(r"allowed_tokens: state has rows of shape \(2, 3\)\. Expected one batch axis"):
    cd.allowed_tokens(tables, states)
  with _raises(r"advance: state has rows of shape \(2, 3\)"):
    cd.advance(tables, states, jnp.zeros((2, 3), jnp.int32))

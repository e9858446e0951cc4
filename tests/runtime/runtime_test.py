"""The device step against the numpy reference, under jit, vmap and disable_jit."""

import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.testing import TokenIndex, reference_allowed, reference_walk


@pytest.fixture(scope="module")
def index(gemma_vocab):
  return TokenIndex(gemma_vocab)


_WALKS = [
    (r"\d{4}-[01]\d-[0-3]\dT[0-2]\d:[0-5]\d:[0-5]\d([+][0-2]\d:[0-5]\d|Z)",
     ["2024-11-21T23:42:08Z", "1999-01-31T00:00:00+05:30"]),
    (r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
     ["192.168.0.1", "255.255.255.255"]),
    (r"[a-z ]{1,40}", ["hello world", "a b c"]),
]


_MASK = jax.jit(cd.allowed_tokens)


@pytest.mark.parametrize("use_jit", [True, False])
@pytest.mark.parametrize("pattern, texts", _WALKS)
def test_device_walk_equals_reference(pattern, texts, use_jit, gemma_compiler, index):
  tables = gemma_compiler.compile(cd.Regex(pattern))
  rng = random.Random(7)
  rows = [index.random_tokenization(t.encode(), rng) for t in texts for _ in range(2)]
  length = max(map(len, rows))
  eos = 1
  padded = np.array([r + [eos] * (length + 1 - len(r)) for r in rows], np.int32)

  def step(state, tokens):
    return cd.advance(tables, state, tokens)

  step_fn = jax.jit(step) if use_jit else step
  mask_fn = _MASK if use_jit else cd.allowed_tokens
  ctx = jax.disable_jit() if not use_jit else _null()
  with ctx:
    state = cd.init_state(tables, batch_size=len(rows))
    for k in range(length + 1):
      allowed = np.asarray(mask_fn(tables, state))
      for b, row in enumerate(rows):
        if k < len(row):
          ref_states, ok = reference_walk(tables, row[:k])
          assert ok
          current = ref_states[-1] if ref_states else int(tables.start[0])
          assert int(state.state[b]) == current
          np.testing.assert_array_equal(allowed[b], reference_allowed(tables, current))
      state = step_fn(state, jnp.asarray(padded[:, k]))
  assert bool(state.done.all()) and not bool(state.error.any())


class _null:
  def __enter__(self):
    return self

  def __exit__(self, *args):
    return False


def test_forbidden_token_sets_sticky_error(gemma_compiler, gemma_vocab, index):
  tables = gemma_compiler.compile(cd.Regex(r"\d+"))
  advance = jax.jit(cd.advance)
  state = cd.init_state(tables, batch_size=3)
  letter = index.longest_tokenization(b"x")[0]
  digit = index.longest_tokenization(b"7")[0]
  # Row 0: forbidden letter. Row 1: EOS before any digit. Row 2: fine, then EOS.
  state = advance(tables, state, jnp.array([letter, 1, digit]))
  assert state.error.tolist() == [True, True, False]
  state = advance(tables, state, jnp.array([digit, digit, 106]))
  assert state.error.tolist() == [True, True, False]
  assert state.done.tolist() == [False, False, True]
  # Stopped rows allow only end of sequence, never nothing.
  allowed = np.asarray(_MASK(tables, state))
  for row in allowed:
    assert set(np.nonzero(row)[0]) == set(gemma_vocab.eos_ids)
  # Out-of-range ids are errors, not crashes.
  state = cd.init_state(tables, batch_size=2)
  state = advance(tables, state, jnp.array([-5, gemma_vocab.vocab_size + 3]))
  assert state.error.tolist() == [True, True]


def test_mask_logits(gemma_compiler, gemma_vocab):
  tables = gemma_compiler.compile(cd.Regex(r"yes|no"))
  state = cd.init_state(tables, batch_size=2)
  logits = jnp.zeros((2, gemma_vocab.vocab_size + 64), jnp.bfloat16)  # padded width
  masked = jax.jit(cd.mask_logits)(tables, state, logits)
  finite = np.isfinite(np.asarray(masked, np.float32))
  assert masked.dtype == jnp.bfloat16
  assert not finite[:, gemma_vocab.vocab_size:].any()
  allowed = {int(i) for i in np.nonzero(finite[0])[0]}
  assert all(re.fullmatch(r"y|ye|yes|n|no", gemma_vocab.token_bytes[i].decode()) for i in allowed)
  assert {gemma_vocab.token_bytes[i] for i in allowed} >= {b"yes", b"no", b"y", b"n"}


def test_vmap_over_groups_of_rows(gemma_compiler, index):
  # E.g. beams: an extra leading axis over batches, mapped with vmap.
  tables = gemma_compiler.compile(cd.Regex(r"[0-9]{2}x"))
  groups = jax.vmap(lambda _: cd.init_state(tables, batch_size=3))(jnp.arange(2))
  tokens = jnp.array(index.longest_tokenization(b"123456")).reshape(2, 3)
  # Under jit (batching rules as op by op, one compile instead of one per primitive).
  out = jax.jit(jax.vmap(cd.advance, in_axes=(None, 0, 0)))(tables, groups, tokens)
  masked = jax.jit(jax.vmap(cd.mask_logits, in_axes=(None, 0, 0)))(
      tables, out, jnp.zeros((2, 3, tables.vocab_size)))
  advance, mask_logits = jax.jit(cd.advance), jax.jit(cd.mask_logits)
  for g in range(2):
    flat = advance(tables, cd.init_state(tables, batch_size=3), tokens[g])
    np.testing.assert_array_equal(out.state[g], flat.state)
    np.testing.assert_array_equal(masked[g], mask_logits(tables, flat, jnp.zeros((3, tables.vocab_size))))


def test_two_regexes_in_one_bucket_compile_once(gemma_compiler):
  a = gemma_compiler.compile(cd.Regex(r"\d{3}"))
  b = gemma_compiler.compile(cd.Regex(r"[0-4]\d\d"))
  assert a.shape_key == b.shape_key
  traces = []

  @jax.jit
  def step(tables, state, logits, tokens):
    traces.append(1)
    return cd.mask_logits(tables, state, logits), cd.advance(tables, state, tokens)

  logits = jnp.zeros((2, a.vocab_size))
  for tables in (a, b, a):
    step(tables, cd.init_state(tables, batch_size=2), logits, jnp.zeros(2, jnp.int32))
  assert len(traces) == 1


def test_per_row_constraints(gemma_compiler, index):
  stacked = cd.stack_tables([gemma_compiler.compile(cd.Regex(p)) for p in (r"\d+", r"[a-z]+")])
  state = cd.init_state(stacked, constraint_ids=jnp.array([0, 1, 1, 0]))
  digit = index.longest_tokenization(b"5")[0]
  letter = index.longest_tokenization(b"q")[0]
  state = jax.jit(cd.advance)(stacked, state, jnp.array([digit, letter, digit, letter]))
  assert state.error.tolist() == [False, False, True, True]


def test_init_state_errors(gemma_compiler):
  tables = gemma_compiler.compile(cd.Regex("a"))
  with pytest.raises(ValueError, match=r"init_state needs batch_size or constraint_ids"):
    cd.init_state(tables)
  with pytest.raises(ValueError, match=r"constraint_ids has shape \(3,\). Expected \(2,\)"):
    cd.init_state(tables, 2, constraint_ids=jnp.zeros(3, jnp.int32))


def test_allowed_bits_pack_allowed_tokens(byte_compiler):
  """`allowed_bits` is `allowed_tokens` packed (bit t % 32 of word t // 32), push-down
  tables and end of sequence included, and stops at end of sequence only."""
  # Jitted (one trace each, the same code as op by op, which compiled each of the
  # functions' primitives on its own: ~6 s of this file's CPU).
  allowed_bits, allowed_tokens, advance = map(
      jax.jit, (cd.allowed_bits, cd.allowed_tokens, cd.advance))
  tables = byte_compiler.compile(cd.Grammar('root ::= "a" | "(" root ")"'))
  state = cd.init_state(tables, batch_size=2)
  for token in [ord("("), ord("("), ord("a"), ord(")")]:
    bits = np.asarray(allowed_bits(tables, state))
    assert bits.dtype == np.uint32 and bits.shape == (2, -(-tables.vocab_size // 32))
    unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    np.testing.assert_array_equal(unpacked[:, :tables.vocab_size].astype(bool),
                                  np.asarray(allowed_tokens(tables, state)))
    state = advance(tables, state, jnp.array([token, 0], jnp.int32))  # row 1: error
  assert bool(state.error[1]) and not bool(state.error[0])
  eos_only = np.zeros(tables.vocab_size, bool)
  eos_only[256] = True
  np.testing.assert_array_equal(np.asarray(allowed_tokens(tables, state))[1], eos_only)

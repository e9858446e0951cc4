"""Gemma 3 forward pass on tiny random models, against a naive reference.

The reference recomputes every position from scratch in float64 numpy, with explicit
causal and sliding-window masks built from positions, and RoPE written with complex
numbers. It shares no code with the model, so agreement checks the cache, the masks
(local layers with a window shorter than the sequence) and the padding logic.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from constrained_decoding import models

_VOCAB_SIZE = 97
_WINDOW = 4
_CONFIG = models.Gemma3Config.tiny(vocab_size=_VOCAB_SIZE, sliding_window=_WINDOW)
_STEP = jax.jit(models.forward, static_argnames="config")


@pytest.fixture(scope="module")
def params():
  return models.random_params(_CONFIG, seed=0)


def _reference_logits(params, config, tokens):
  """float64 logits [L, V] of one unpadded row at positions 0..L-1, no cache."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  num_heads, num_kv, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
  length = len(tokens)
  pos = np.arange(length)

  def norm(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + config.rms_norm_eps) * w

  def rope(x, base):  # x [L, N, Dh]; dims i and i + Dh/2 are the real/imag parts.
    half = head_dim // 2
    freq = base ** (-np.arange(half) * 2.0 / head_dim)
    z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * pos[:, None, None] * freq)
    return np.concatenate([z.real, z.imag], axis=-1)

  def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

  x = p["embedding"][np.asarray(tokens)] * np.sqrt(config.embed_dim)
  for layer, is_global in zip(p["layers"], config.is_global_layer):
    h = norm(x, layer["pre_attention_norm"])
    q_w, k_w, v_w = np.split(layer["qkv"], [num_heads * head_dim,
                                            (num_heads + num_kv) * head_dim])
    q = (h @ q_w.T).reshape(length, num_heads, head_dim)
    k = (h @ k_w.T).reshape(length, num_kv, head_dim)
    v = (h @ v_w.T).reshape(length, num_kv, head_dim)
    base = config.global_rope_base if is_global else config.local_rope_base
    q = rope(norm(q, layer["query_norm"]), base) * head_dim ** -0.5
    k = rope(norm(k, layer["key_norm"]), base)
    mask = pos[None, :] <= pos[:, None]
    if not is_global:
      mask &= pos[None, :] > pos[:, None] - config.sliding_window
    heads = []
    for head in range(num_heads):
      kv = head // (num_heads // num_kv)
      scores = np.where(mask, q[:, head] @ k[:, kv].T, -np.inf)
      probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
      heads.append((probs / probs.sum(axis=-1, keepdims=True)) @ v[:, kv])
    attn = np.concatenate(heads, axis=-1) @ layer["attention_output"].T
    x = x + norm(attn, layer["post_attention_norm"])
    h = norm(x, layer["pre_ffw_norm"])
    gate, up = np.split(h @ layer["gate_up"].T, 2, axis=-1)
    x = x + norm((gelu_tanh(gate) * up) @ layer["down"].T, layer["post_ffw_norm"])
  return norm(x, p["final_norm"]) @ p["embedding"].T


def _tokens(length, seed):
  return np.random.default_rng(seed).integers(0, _VOCAB_SIZE, size=length).astype(np.int32)


def _prefill(params, tokens, cache_len=32, config=_CONFIG):
  cache = models.init_cache(config, batch_size=1, cache_len=cache_len)
  positions = jnp.arange(len(tokens), dtype=jnp.int32)[None]
  logits, cache = _STEP(params, config, jnp.asarray(tokens)[None], positions, cache)
  return np.asarray(logits[0]), cache


def test_tiny_config_has_local_and_global_layers():
  assert _CONFIG.is_global_layer == (False, True, False, True)
  assert _CONFIG.num_heads > _CONFIG.num_kv_heads  # Grouped-query attention is covered.


def test_gemma3_270m_layer_pattern():
  config = models.Gemma3Config.gemma3_270m()
  assert [i for i, g in enumerate(config.is_global_layer) if g] == [5, 11, 17]
  assert config.effective_query_scale == 1 / 16


@pytest.mark.parametrize("field, value, match", [
    ("num_kv_heads", 3, r"num_heads=4 is not a multiple of num_kv_heads=3"),
    ("head_dim", 15, r"head_dim=15 is odd"),
    ("sliding_window", 0, r"sliding_window=0 is invalid. Expected a positive int"),
])
def test_invalid_config_is_rejected(field, value, match):
  with pytest.raises(ValueError, match=match):
    models.Gemma3Config.tiny(**{field: value})


def test_random_params_match_param_shapes_and_seed():
  shapes = jax.tree.map(lambda s: s.shape, models.param_shapes(_CONFIG))
  params = models.random_params(_CONFIG, seed=3)
  assert jax.tree.map(lambda a: a.shape, params) == shapes
  again = models.random_params(_CONFIG, seed=3)
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), params,
                                          again)))


@pytest.mark.parametrize("length", [3, 4 * _WINDOW + 3])
def test_prefill_matches_naive_reference(params, length):
  # 19 tokens: local layers see only the last 4 positions, so a window bug shows.
  tokens = _tokens(length, seed=length)
  logits, _ = _prefill(params, tokens)
  np.testing.assert_allclose(logits, _reference_logits(params, _CONFIG, tokens),
                             atol=1e-4, rtol=1e-4)


def test_window_actually_changes_the_output(params):
  # Guards the reference test above: with this window, local layers must matter.
  tokens = _tokens(4 * _WINDOW, seed=1)
  wide = dataclasses.replace(_CONFIG, sliding_window=100)
  logits, _ = _prefill(params, tokens)
  wide_logits, _ = _prefill(params, tokens, config=wide)
  np.testing.assert_allclose(logits[:_WINDOW], wide_logits[:_WINDOW], atol=1e-5)
  assert np.abs(logits[-1] - wide_logits[-1]).max() > 1e-2


def test_step_by_step_decode_matches_prefill(params):
  tokens = _tokens(3 * _WINDOW + 1, seed=2)
  full, _ = _prefill(params, tokens)
  cache = models.init_cache(_CONFIG, batch_size=1, cache_len=32)
  for i, token in enumerate(tokens):
    logits, cache = _STEP(params, _CONFIG, jnp.array([[token]]), jnp.array([[i]]), cache)
    np.testing.assert_allclose(logits[0, 0], full[i], atol=1e-5, rtol=1e-5)


def test_chunked_prefill_matches_single_prefill(params):
  tokens = _tokens(12, seed=4)
  full, _ = _prefill(params, tokens)
  cache = models.init_cache(_CONFIG, batch_size=1, cache_len=32)
  for start in range(0, 12, 3):
    logits, cache = _STEP(params, _CONFIG, jnp.asarray(tokens[None, start:start + 3]),
                          jnp.arange(start, start + 3)[None], cache)
    np.testing.assert_allclose(logits[0], full[start:start + 3], atol=1e-5, rtol=1e-5)


def test_rows_of_different_lengths_match_separate_runs(params):
  # Row 0 is right-padded (padding at positions past its end), row 1 is left-padded
  # (padding at position -1), row 2 fills the chunk.
  lengths, width = (5, 7, 11), 11
  rows = [_tokens(n, seed=10 + n) for n in lengths]
  tokens = np.zeros((3, width), np.int32)
  positions = np.zeros((3, width), np.int32)
  tokens[0, :5], positions[0] = rows[0], np.arange(width)
  tokens[1, 4:], positions[1] = rows[1], np.r_[[-1] * 4, np.arange(7)]
  tokens[2], positions[2] = rows[2], np.arange(width)
  cache = models.init_cache(_CONFIG, batch_size=3, cache_len=32)
  batched, cache = _STEP(params, _CONFIG, jnp.asarray(tokens), jnp.asarray(positions),
                         cache)
  last = [4, 10, 10]  # Index of each row's last real token in the chunk.
  next_tokens = _tokens(3, seed=99)
  step_logits, _ = _STEP(params, _CONFIG, jnp.asarray(next_tokens)[:, None],
                         jnp.array(lengths)[:, None], cache)
  for b, row in enumerate(rows):
    alone, alone_cache = _prefill(params, row)
    real = np.flatnonzero(positions[b] >= 0)[:len(row)]
    np.testing.assert_allclose(np.asarray(batched[b, real]), alone, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(batched[b, last[b]]), alone[-1], atol=1e-5)
    alone_step, _ = _STEP(params, _CONFIG, jnp.array([[next_tokens[b]]]),
                          jnp.array([[len(row)]]), alone_cache)
    np.testing.assert_allclose(np.asarray(step_logits[b, 0]), np.asarray(alone_step[0, 0]),
                               atol=1e-5, rtol=1e-5)


def test_stale_cache_entries_are_invisible(params):
  # Reusing a cache for a shorter prompt must not let the old keys leak in.
  tokens = _tokens(6, seed=5)
  _, used = _prefill(params, _tokens(20, seed=6))
  logits, _ = _STEP(params, _CONFIG, jnp.asarray(tokens)[None], jnp.arange(6)[None], used)
  fresh, _ = _prefill(params, tokens)
  np.testing.assert_allclose(np.asarray(logits[0]), fresh, atol=1e-5, rtol=1e-5)


def test_logit_indices_select_positions(params):
  tokens = _tokens(9, seed=7)
  full, _ = _prefill(params, tokens)
  cache = models.init_cache(_CONFIG, batch_size=1, cache_len=32)
  logits, _ = _STEP(params, _CONFIG, jnp.asarray(tokens)[None], jnp.arange(9)[None],
                    cache, logit_indices=jnp.array([[8, 2]]))
  assert logits.shape == (1, 2, _VOCAB_SIZE)
  np.testing.assert_allclose(np.asarray(logits[0]), full[[8, 2]], atol=1e-6)


def test_greedy_decode_inside_while_loop_matches_python_loop(params):
  prompt, num_new, cache_len = _tokens(5, seed=8), 10, 32

  @jax.jit
  def generate(params, prompt):
    cache = models.init_cache(_CONFIG, batch_size=1, cache_len=cache_len)
    logits, cache = models.forward(params, _CONFIG, prompt[None],
                                   jnp.arange(5, dtype=jnp.int32)[None], cache)
    out = jnp.zeros((num_new,), jnp.int32)

    def cond(state):
      i, *_ = state
      return i < num_new  # Budget spent.

    def body(state):
      i, token, out, cache = state
      out = out.at[i].set(token)
      logits, cache = models.forward(params, _CONFIG, token[None, None],
                                     (5 + i)[None, None], cache)
      return i + 1, jnp.argmax(logits[0, -1]).astype(jnp.int32), out, cache

    first = jnp.argmax(logits[0, -1]).astype(jnp.int32)
    _, _, out, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), first, out, cache))
    return out

  expected, sequence = [], list(prompt)
  for _ in range(num_new):
    logits, _ = _prefill(params, np.array(sequence, np.int32))
    expected.append(int(np.argmax(logits[-1])))
    sequence.append(expected[-1])
  assert np.asarray(generate(params, jnp.asarray(prompt))).tolist() == expected


def test_decode_does_not_recompile_for_new_positions_or_tokens(params):
  traces = []

  @jax.jit
  def step(params, tokens, positions, cache):
    traces.append(1)
    return models.forward(params, _CONFIG, tokens, positions, cache)

  cache = models.init_cache(_CONFIG, batch_size=2, cache_len=16)
  for i in range(3):
    _, cache = step(params, jnp.array([[i], [i + 1]]), jnp.array([[i], [i + 2]]), cache)
  assert len(traces) == 1


def test_init_cache_buffers_are_distinct_and_donatable(params):
  cache = models.init_cache(_CONFIG, batch_size=1, cache_len=16)
  buffers = jax.tree.leaves(cache)
  assert len({id(b) for b in buffers}) == 2 * _CONFIG.num_layers
  step = jax.jit(models.forward, static_argnames="config", donate_argnames="cache")
  _, new_cache = step(params, _CONFIG, jnp.array([[1]]), jnp.array([[0]]), cache)
  assert new_cache.cache_len == 16 and new_cache.batch_size == 1


def test_bfloat16_params_run_close_to_float32(params):
  tokens = _tokens(6, seed=9)
  full, _ = _prefill(params, tokens)
  bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
  logits, _ = _prefill(bf16, tokens)
  assert logits.dtype == np.float32
  np.testing.assert_allclose(logits, full, atol=0.1)

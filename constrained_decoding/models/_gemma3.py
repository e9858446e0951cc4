"""Gemma 3 (text) as pure JAX functions of a params pytree and a KV-cache pytree.

Public names:
  Params                  the params pytree type (a dict; layout below).
  KVCache                 per-layer key/value caches with static shapes.
  init_cache(...)         an empty cache for a batch size and a cache length.
  forward(...)            logits for a chunk of tokens (prefill, L > 1, or decode, L = 1).
  random_params(...)      random weights for any config, for tests.
  param_shapes(config)    the expected shape of every parameter.
  Gemma3Network(config)   `init_cache` and `forward` as a `models.Network` (the protocol
                          the decode loops take).

Params layout (every matrix is (out, in), like a torch `Linear` weight and like the
GGUF tensors after dequantization, so `y = x @ W.T`):

  {'embedding': (V, D),                 # also the output head (tied)
   'final_norm': (D,),
   'layers': ({'pre_attention_norm': (D,),
               'qkv': ((H + 2 K) Dh, D),  # q rows head-major, then k, then v
               'query_norm': (Dh,), 'key_norm': (Dh,),
               'attention_output': (D, H Dh),
               'post_attention_norm': (D,),
               'pre_ffw_norm': (D,),
               'gate_up': (2 F, D),      # GELU branch rows first, then linear branch
               'down': (D, F),
               'post_ffw_norm': (D,)}, ...)}   # one dict per layer

Norm weights multiply directly: `rms_norm(x) * w`. They already include Gemma's
`1 + scale`, as GGUF files store them (DeepMind's Flax `scale` is `w - 1`).

Layers are a tuple unrolled by a Python loop rather than stacked for `lax.scan`: with
per-layer caches that XLA updates in place, the loop decodes about 2.5x faster at batch
8 on CPU (see shared/notes/gemma3-gguf.md, section 4), at the price of longer compiles.
"""

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from constrained_decoding.models import _config

Params = dict[str, Any]

# Added to the scores of hidden keys. Finite, so that a query that sees no key at all
# (a padding position) gets a uniform average instead of NaN.
_MASKED_SCORE = -1e30


@flax.struct.dataclass(kw_only=True)
class KVCache:
  """Keys and values of every layer, indexed by absolute position.

  ```python
  cache = init_cache(config, batch_size=8, cache_len=512)
  logits, cache = forward(params, config, tokens, positions, cache)
  ```

  The token at position p of row b is stored in slot p of row b, in every layer. A
  query at position p attends to slots `0..p` (global layers) or
  `p - sliding_window + 1 .. p` (local layers), so those slots must have been written
  for that row, by this call or an earlier one. A cache can be reused for a new prompt
  without clearing it: stale slots beyond the new positions are never visible.

  Attributes:
    keys: One array per layer, after key norm and RoPE.
    values: One array per layer.
  """

  keys: tuple[Float[Array, "B cache_len kv_heads head_dim"], ...]
  values: tuple[Float[Array, "B cache_len kv_heads head_dim"], ...]

  @property
  def batch_size(self) -> int:
    return self.keys[0].shape[0]

  @property
  def cache_len(self) -> int:
    """Number of slots, i.e. one more than the largest position that can be stored."""
    return self.keys[0].shape[1]


def init_cache(config: _config.Gemma3Config, *, batch_size: int, cache_len: int,
               dtype: Any = jnp.float32) -> KVCache:
  """Returns an all-zero cache.

  Args:
    config: The model's hyper-parameters.
    batch_size: Number of rows.
    cache_len: Number of slots per row; positions must stay below it. Decode cost grows
      with it (every step attends over all slots), so size it to prompt + output.
    dtype: Storage dtype of keys and values.
  """
  shape = (batch_size, cache_len, config.num_kv_heads, config.head_dim)
  # Distinct buffers for every array, so that all of them can be donated to jit.
  def zeros() -> tuple[jax.Array, ...]:
    return tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))

  return KVCache(keys=zeros(), values=zeros())


def forward(
    params: Params,
    config: _config.Gemma3Config,
    tokens: Int[Array, "B L"],
    positions: Int[Array, "B L"],
    cache: KVCache,
    *,
    logit_indices: Int[Array, "B N"] | None = None,
) -> tuple[Float[Array, "B _ V"], KVCache]:
  """Runs the model on a chunk of tokens, reading and extending the KV cache.

  One function serves prefill (L > 1) and decode (L = 1), under `jax.jit` (with
  `config` static) and inside `lax.while_loop`. Rows may sit at different positions:
  a batch of prompts of different lengths is one call, right-padded (padding gets
  positions past the row's end; its slots are overwritten by later decode steps before
  any query sees them) or left-padded (padding gets position -1). A negative position
  marks padding: nothing is written to the cache and its logits are meaningless.

  ```python
  step = jax.jit(forward, static_argnames='config', donate_argnames='cache')
  logits, cache = step(params, config, prompt, jnp.arange(L)[None], cache)
  logits, cache = step(params, config, next_token[:, None], jnp.array([[L]]), cache)
  ```

  Args:
    params: Weights, as from `load_gguf_params` or `random_params`.
    config: The model's hyper-parameters (static under jit).
    tokens: Token ids (int32).
    positions: Absolute position of each token (int32), below `cache.cache_len`:
      writes beyond it are dropped, so later queries would miss those keys.
    cache: The cache holding positions written by earlier calls.
    logit_indices: Optional indices into the L axis; only those positions get logits
      (e.g. each row's last prompt token), which saves the 262k-wide output
      projection for the others.

  Returns:
    float32 logits, [B, L, V] (or [B, N, V] with `logit_indices`), and the updated
    cache. Donate the old cache to jit so that XLA updates it in place.
  """
  x = jnp.take(params["embedding"], tokens, axis=0).astype(jnp.float32)
  x = x * math.sqrt(config.embed_dim)
  keys, values = [], []
  for i, is_global in enumerate(config.is_global_layer):
    x, k, v = _block(params["layers"][i], config, is_global, x, positions,
                     cache.keys[i], cache.values[i])
    keys.append(k)
    values.append(v)
  x = _rms_norm(x, params["final_norm"], config.rms_norm_eps)
  if logit_indices is not None:
    x = jnp.take_along_axis(x, logit_indices[..., None], axis=1)
  logits = _dense(x, params["embedding"])
  return logits, KVCache(keys=tuple(keys), values=tuple(values))


@dataclasses.dataclass(frozen=True)
class Gemma3Network:
  """Gemma 3 as a `models.Network`: `forward` and `init_cache` bound to a config.

  ```python
  network = Gemma3Network(config)
  cache = network.init_cache(batch_size=1, cache_len=64)
  logits, cache = network.apply(params, tokens, positions, cache)
  ```

  Hashed and compared by its config (a frozen dataclass), exactly as the config alone
  was: a static argument of jit that holds no weights, so two models with the same
  architecture share compiled programs.

  Attributes:
    config: The hyper-parameters.
  """

  config: _config.Gemma3Config

  @property
  def logits_width(self) -> int:
    """Width of the logits: the embedding table's rows (the output head is tied)."""
    return self.config.vocab_size

  def init_cache(self, *, batch_size: int, cache_len: int) -> KVCache:
    """An all-zero `KVCache` (float32)."""
    return init_cache(self.config, batch_size=batch_size, cache_len=cache_len)

  def apply(self, params: Params, tokens: Int[Array, "B L"], positions: Int[Array, "B L"],
            cache: KVCache, *, logit_indices: Int[Array, "B N"] | None = None,
            ) -> tuple[Float[Array, "B _ V"], KVCache]:
    """`forward(params, self.config, ...)`."""
    return forward(params, self.config, tokens, positions, cache,
                   logit_indices=logit_indices)


def _block(layer: Params, config: _config.Gemma3Config, is_global: bool, x: jax.Array,
           positions: jax.Array, k_cache: jax.Array, v_cache: jax.Array
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One decoder block: attention and gated MLP, each with pre- and post-norms."""
  eps = config.rms_norm_eps
  h = _rms_norm(x, layer["pre_attention_norm"], eps)
  h, k_cache, v_cache = _attention(layer, config, is_global, h, positions, k_cache,
                                   v_cache)
  x = x + _rms_norm(h, layer["post_attention_norm"], eps)
  h = _rms_norm(x, layer["pre_ffw_norm"], eps)
  h = _mlp(layer, h)
  x = x + _rms_norm(h, layer["post_ffw_norm"], eps)
  return x, k_cache, v_cache


def _attention(layer: Params, config: _config.Gemma3Config, is_global: bool,
               x: jax.Array, positions: jax.Array, k_cache: jax.Array,
               v_cache: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Grouped-query attention over the cache, after writing this chunk into it."""
  batch, length, _ = x.shape
  num_heads, num_kv, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
  qkv = _dense(x, layer["qkv"]).reshape(batch, length, num_heads + 2 * num_kv, head_dim)
  q, k, v = jnp.split(qkv, [num_heads, num_heads + num_kv], axis=2)
  q = _rms_norm(q, layer["query_norm"], config.rms_norm_eps)
  k = _rms_norm(k, layer["key_norm"], config.rms_norm_eps)
  base = config.global_rope_base if is_global else config.local_rope_base
  q = _apply_rope(q, positions, base) * config.effective_query_scale
  k = _apply_rope(k, positions, base)

  k_cache = _write_slots(k_cache, k, positions)
  v_cache = _write_slots(v_cache, v, positions)

  # Query head h uses key/value head h // G, as in gemma and llama.cpp.
  q = q.reshape(batch, length, num_kv, num_heads // num_kv, head_dim)
  scores = jnp.einsum("blkgd,bskd->bkgls", q, k_cache.astype(q.dtype),
                      preferred_element_type=jnp.float32)
  visible = _visible_slots(positions, k_cache.shape[1], is_global,
                           config.sliding_window)
  scores = jnp.where(visible[:, None, None], scores, _MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bkgls,bskd->blkgd", probs, v_cache.astype(probs.dtype),
                   preferred_element_type=jnp.float32)
  out = out.reshape(batch, length, num_heads * head_dim)
  return _dense(out, layer["attention_output"]), k_cache, v_cache


def _visible_slots(positions: Int[Array, "B L"], cache_len: int, is_global: bool,
                   sliding_window: int) -> Bool[Array, "B L cache_len"]:
  """Which cache slots (= key positions) each query may attend to."""
  slots = jnp.arange(cache_len, dtype=jnp.int32)
  query = positions[:, :, None]
  visible = slots <= query
  if not is_global:
    visible &= slots > query - sliding_window
  return visible


def _write_slots(cache: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
  """Stores new[b, l] in slot positions[b, l]; negative positions are not stored."""
  batch, cache_len = cache.shape[:2]
  # A negative index would wrap around; send padding out of range, where mode='drop'
  # discards it.
  slots = jnp.where(positions < 0, cache_len, positions)
  rows = jnp.arange(batch)[:, None]
  return cache.at[rows, slots].set(new.astype(cache.dtype), mode="drop")


def _apply_rope(x: Float[Array, "B L N head_dim"], positions: Int[Array, "B L"],
                base: float) -> Float[Array, "B L N head_dim"]:
  """Rotary position embedding, split-half (NeoX) style as in Gemma.

  Dimension i of the first half and dimension i of the second half form one rotated
  pair, with frequency `base ** (-2 i / Dh)`. (Interleaved, GPT-J style pairs would
  run without error but give a perplexity of ~575 instead of ~7.)

  Args:
    x: Queries or keys, N heads.
    positions: Absolute positions.
    base: RoPE base frequency (the "max wavelength").
  """
  head_dim = x.shape[-1]
  fraction = 2 * jnp.arange(head_dim // 2, dtype=jnp.float32) / head_dim
  timescale = base ** fraction
  angles = positions[..., None].astype(jnp.float32) / timescale  # [B, L, Dh/2]
  sin = jnp.sin(angles)[:, :, None, :]
  cos = jnp.cos(angles)[:, :, None, :]
  first, second = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin],
                         axis=-1).astype(x.dtype)


def _mlp(layer: Params, x: jax.Array) -> jax.Array:
  """Gated MLP: down(gelu_tanh(gate(x)) * up(x))."""
  gate, up = jnp.split(_dense(x, layer["gate_up"]), 2, axis=-1)
  return _dense(jax.nn.gelu(gate, approximate=True) * up, layer["down"])


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """x / rms(x) * weight over the last axis, in float32."""
  x = x.astype(jnp.float32)
  x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  return x * weight.astype(jnp.float32)


def _dense(x: jax.Array, w: jax.Array) -> jax.Array:
  """x @ w.T for w of shape (out, in), accumulating in float32 whatever w's dtype.

  With bfloat16 weights, the inputs are rounded to bfloat16 but the products are summed
  in float32 (XLA's CPU bf16 dot without f32 output is ~10x slower).
  """
  return jax.lax.dot_general(
      x.astype(w.dtype), w, (((x.ndim - 1,), (1,)), ((), ())),
      preferred_element_type=jnp.float32)


def param_shapes(config: _config.Gemma3Config) -> Params:
  """The expected shape of every parameter, as a params pytree.

  Leaves are float32 `jax.ShapeDtypeStruct`s, so the result can stand in for params in
  `jax.eval_shape`, and loaders can check what they built against it.
  """
  d, f = config.embed_dim, config.hidden_dim
  h, k, dh = config.num_heads, config.num_kv_heads, config.head_dim

  def spec(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)

  layer = {
      "pre_attention_norm": spec(d),
      "qkv": spec((h + 2 * k) * dh, d),
      "query_norm": spec(dh),
      "key_norm": spec(dh),
      "attention_output": spec(d, h * dh),
      "post_attention_norm": spec(d),
      "pre_ffw_norm": spec(d),
      "gate_up": spec(2 * f, d),
      "down": spec(d, f),
      "post_ffw_norm": spec(d),
  }
  return {
      "embedding": spec(config.vocab_size, d),
      "final_norm": spec(d),
      "layers": tuple(dict(layer) for _ in range(config.num_layers)),
  }


def random_params(config: _config.Gemma3Config, seed: int = 0, *,
                  dtype: Any = jnp.float32) -> Params:
  """Random weights of the right shapes, scaled so activations stay of order one.

  Matrices are N(0, 1/fan_in) (the embedding N(0, 1/D), so that `E[t] * sqrt(D)` has
  unit scale); norm weights are 1 + N(0, 0.1²), i.e. near the identity in the GGUF
  convention. Deterministic in `seed`.

  Args:
    config: Hyper-parameters; any size.
    seed: Seed of the generator.
    dtype: dtype of every parameter.
  """
  specs, treedef = jax.tree.flatten(param_shapes(config))
  rng = np.random.default_rng(seed)
  leaves = []
  for s in specs:
    if len(s.shape) == 1:
      value = 1.0 + 0.1 * rng.standard_normal(s.shape)
    else:
      value = rng.standard_normal(s.shape) / math.sqrt(s.shape[1])
    leaves.append(jnp.asarray(value, dtype))
  return jax.tree.unflatten(treedef, leaves)

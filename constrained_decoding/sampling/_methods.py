"""Sampling methods: pure functions from (masked) logits to token ids.

They run after `mask_logits`, so -inf entries (forbidden tokens) are never chosen as
long as one token is allowed, which the tables guarantee (no all-masked live state).

Public names:
  SamplingConfig       greedy / temperature / top-k / top-p settings (a static value).
  sample_tokens(logits, rng, config)  Int[B] next tokens.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
  """How to pick the next token from masked logits.

  ```python
  SamplingConfig()                              # greedy
  SamplingConfig(temperature=0.7, top_p=0.95)   # nucleus sampling
  ```

  Attributes:
    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k: Keep only the k most likely tokens (0: no limit).
    top_p: Keep the smallest set of most likely tokens whose probability reaches p
      (1.0: no limit).
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature {self.temperature} is negative. Expected >= 0.")
    if self.top_k < 0:
      raise ValueError(f"top_k {self.top_k} is negative. Expected >= 0 (0: no limit).")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p {self.top_p} is outside (0, 1]. Expected a probability.")

  @property
  def is_greedy(self) -> bool:
    return self.temperature == 0

  def static_part(self) -> "SamplingConfig":
    """The fields that change the compiled program (greedy or not, top-k, top-p on/off).

    Temperature and the top-p value are passed to jitted code as arrays, so changing
    them does not recompile.
    """
    return SamplingConfig(temperature=0.0 if self.is_greedy else 1.0, top_k=self.top_k,
                          top_p=1.0 if self.top_p >= 1.0 else 0.5)


def sample_tokens(
    logits: Float[Array, "B V"],
    rng: jax.Array,
    config: SamplingConfig,
    *,
    temperature: Float[Array, ""] | float | None = None,
    top_p: Float[Array, ""] | float | None = None,
) -> Int[Array, "B"]:
  """Draws one token per row from `logits` according to `config`.

  `temperature` and `top_p` override the config's values (pass arrays under jit so that
  changing them does not recompile); `config` decides greedy vs sampling and top-k.
  """
  if config.is_greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  temperature = config.temperature if temperature is None else temperature
  top_p = config.top_p if top_p is None else top_p
  logits = logits.astype(jnp.float32) / temperature
  neg_inf = jnp.asarray(-jnp.inf, logits.dtype)
  if config.top_k:
    k = min(config.top_k, logits.shape[-1])
    kth = jax.lax.top_k(logits, k)[0][:, -1:]
    logits = jnp.where(logits < kth, neg_inf, logits)
  if config.top_p < 1.0:  # top-p enabled; its value is `top_p`
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # Keep a token if the mass strictly before it is below p (so the top one stays).
    before = jnp.cumsum(probs, axis=-1) - probs
    cutoff_index = jnp.sum(before < top_p, axis=-1, keepdims=True) - 1
    cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
    logits = jnp.where(logits < cutoff, neg_inf, logits)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)

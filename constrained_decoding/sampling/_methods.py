"""Sampling methods: pure functions from (masked) logits to token ids.

They run after `mask_logits`, so -inf entries (forbidden tokens) are never chosen as
long as one token is allowed, which the tables guarantee (no all-masked live state).

Public names:
  SamplingConfig       greedy / temperature / top-k / top-p settings (a static value).
  sample_tokens(logits, rng, config)  Int[B] next tokens.
  filter_logits(logits, config)       logits of the distribution sample_tokens draws from.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from constrained_decoding.errors import DecodingArgumentError

# Forced tokens per model call for `SamplingConfig(jump_forward=True)`.
DEFAULT_JUMP_FORWARD = 8
# Most forced tokens per model call: the width of a static buffer in the decode loop.
MAX_JUMP_FORWARD = 1024


def _check_real(name: str, value) -> None:
  """Raises unless `value` is a finite real number (not a bool, str, NaN or inf)."""
  if (not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool)
      or not math.isfinite(value)):
    raise DecodingArgumentError(f"{name} {value!r} is not a finite number. Expected a "
                                f"finite float.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
  """How to pick the next token from masked logits.

  ```python
  SamplingConfig()                              # greedy
  SamplingConfig(temperature=0.7, top_p=0.95)   # nucleus sampling
  ```

  Every field is checked here (`DecodingArgumentError`): a NaN or infinite
  temperature would turn every logit into NaN.

  Attributes:
    temperature: 0 means greedy (argmax); otherwise logits are divided by it. Finite.
    top_k: Keep only the k most likely tokens (0: no limit).
    top_p: Keep the smallest set of most likely tokens whose probability reaches p
      (1.0: no limit).
    jump_forward: After each sampled token, up to this many *forced* tokens (the only
      token the constraint allows, or an end of sequence when nothing else is) are
      taken without sampling and fed to the model in one call (0: off; True means 8).
      The output distribution is unchanged: a forced token has probability 1 under
      constrained sampling, and forcing happens per token, never by re-tokenizing
      bytes. Greedy outputs are identical up to float rounding of batched model calls.
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  jump_forward: int = 0

  def __post_init__(self):
    _check_real("temperature", self.temperature)
    if self.temperature < 0:
      raise DecodingArgumentError(
          f"temperature {self.temperature} is negative. Expected a finite float >= 0 "
          f"(0: greedy).")
    if not isinstance(self.top_k, (int, np.integer)) or isinstance(self.top_k, bool):
      raise DecodingArgumentError(f"top_k {self.top_k!r} is not an int. Expected an int "
                                  f">= 0 (0: no limit).")
    if self.top_k < 0:
      raise DecodingArgumentError(f"top_k {self.top_k} is negative. Expected >= 0 "
                                  f"(0: no limit).")
    _check_real("top_p", self.top_p)
    if not 0 < self.top_p <= 1:
      raise DecodingArgumentError(f"top_p {self.top_p} is outside (0, 1]. Expected a "
                                  f"probability (1.0: no limit).")
    if self.jump_forward is True:
      object.__setattr__(self, "jump_forward", DEFAULT_JUMP_FORWARD)
    if (not isinstance(self.jump_forward, (int, np.integer)) or self.jump_forward < 0
        or self.jump_forward > MAX_JUMP_FORWARD):
      raise DecodingArgumentError(
          f"jump_forward {self.jump_forward!r} is not a count. Expected an int in "
          f"[0, {MAX_JUMP_FORWARD}] (0: off), the most forced tokens per model call.")

  @property
  def is_greedy(self) -> bool:
    return self.temperature == 0

  def static_part(self) -> "SamplingConfig":
    """The fields that change the compiled program (greedy or not, top-k, top-p on/off).

    Temperature and the top-p value are passed to jitted code as arrays, so changing
    them does not recompile.
    """
    return SamplingConfig(temperature=0.0 if self.is_greedy else 1.0, top_k=self.top_k,
                          top_p=1.0 if self.top_p >= 1.0 else 0.5,
                          jump_forward=self.jump_forward)


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

  NaN logits count as -inf (no evidence for the token), so a row never picks a
  masked (-inf) token while some token is above -inf, whatever NaNs the model
  produced. A row with every logit -inf or NaN gets an arbitrary id: the decode loops
  replace it with an allowed token (`runtime.allowed_or_lowest`).
  """
  logits = jnp.where(jnp.isnan(logits), jnp.asarray(-jnp.inf, logits.dtype), logits)
  if config.is_greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = filter_logits(logits, config, temperature=temperature, top_p=top_p)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def filter_logits(
    logits: Float[Array, "*rows V"],
    config: SamplingConfig,
    *,
    temperature: Float[Array, ""] | float | None = None,
    top_p: Float[Array, ""] | float | None = None,
) -> Float[Array, "*rows V"]:
  """float32 logits whose softmax is the distribution `sample_tokens` draws from.

  Temperature, then top-k, then top-p (-inf outside the kept set). Not for greedy
  configs. Speculative sampling needs these distributions themselves, not just draws.
  A -inf (masked) or NaN logit is -inf after scaling, whatever the temperature; an
  unmasked one that scaling turns into NaN (a NaN temperature array) becomes 0.
  """
  temperature = config.temperature if temperature is None else temperature
  top_p = config.top_p if top_p is None else top_p
  logits = logits.astype(jnp.float32)
  neg_inf = jnp.asarray(-jnp.inf, logits.dtype)
  masked = jnp.isnan(logits) | (logits == neg_inf)
  scaled = logits / temperature
  # NaN here (a NaN temperature array, inf / inf) carries no information: weight 0.
  scaled = jnp.where(jnp.isnan(scaled), jnp.asarray(0, logits.dtype), scaled)
  logits = jnp.where(masked, neg_inf, scaled)
  if config.top_k:
    k = min(config.top_k, logits.shape[-1])
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    logits = jnp.where(logits < kth, neg_inf, logits)
  if config.top_p < 1.0:  # top-p enabled; its value is `top_p`
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # Keep a token if the mass strictly before it is below p (so the top one stays).
    before = jnp.cumsum(probs, axis=-1) - probs
    cutoff_index = jnp.sum(before < top_p, axis=-1, keepdims=True) - 1
    cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
    logits = jnp.where(logits < cutoff, neg_inf, logits)
  return logits

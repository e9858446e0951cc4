"""Hyper-parameters of the Gemma 3 text model.

Public names:
  Gemma3Config   frozen, hashable hyper-parameters (a static argument of `jax.jit`).
  ModelFormatError   a model file that is not a Gemma 3 GGUF this package can run.
"""

import dataclasses
import os
from typing import Any

import numpy as np

from constrained_decoding.vocab import _gguf_file


class ModelFormatError(ValueError):
  """A model file is not a Gemma 3 GGUF that this package can run."""


# Not stored in GGUF files; llama.cpp hard-codes them for gemma3 too. Values from
# `Gemma3_270M` in DeepMind's gemma library (gm/nn/_gemma.py).
_LOCAL_ROPE_BASE = 10_000.0
_GLOBAL_LAYER_PERIOD = 6


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma3Config:
  """Hyper-parameters of a Gemma 3 text decoder.

  ```python
  config = Gemma3Config.from_gguf(default_gguf_path())   # the real 270M model
  tiny = Gemma3Config.tiny(vocab_size=300)                # same architecture, for tests
  ```

  Frozen and hashable, so it can be a static argument of `jax.jit`; every field fixes
  shapes or the traced program, none holds data.

  Attributes:
    vocab_size: Width of the embedding table and of the logits.
    embed_dim: Width of the residual stream.
    hidden_dim: Width of each branch of the gated MLP.
    num_layers: Number of decoder blocks.
    num_heads: Number of query heads.
    num_kv_heads: Number of key/value heads (grouped-query attention when smaller
      than `num_heads`; `num_heads` must be a multiple of it).
    head_dim: Width of each attention head.
    rms_norm_eps: Epsilon inside every RMS norm.
    sliding_window: Local layers let a query at position p attend to keys at positions
      `p - sliding_window < k <= p`.
    local_rope_base: RoPE base frequency of local (sliding-window) layers.
    global_rope_base: RoPE base frequency of global layers.
    global_layer_period: Layer i is global when `(i + 1) % global_layer_period == 0`
      (Gemma 3: 5 local layers, then 1 global).
    query_scale: Factor applied to queries after RoPE; `None` means `head_dim ** -0.5`.
  """

  vocab_size: int
  embed_dim: int
  hidden_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  sliding_window: int = 512
  local_rope_base: float = _LOCAL_ROPE_BASE
  global_rope_base: float = 1_000_000.0
  global_layer_period: int = _GLOBAL_LAYER_PERIOD
  query_scale: float | None = None

  def __post_init__(self):
    for name in ("vocab_size", "embed_dim", "hidden_dim", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "sliding_window", "global_layer_period"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"Gemma3Config.{name}={value!r} is invalid. Expected a positive int."
        )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"Gemma3Config.num_heads={self.num_heads} is not a multiple of "
          f"num_kv_heads={self.num_kv_heads}. Expected each key/value head to serve the "
          "same number of query heads."
      )
    if self.head_dim % 2:
      raise ValueError(
          f"Gemma3Config.head_dim={self.head_dim} is odd. Expected an even width, "
          "because RoPE rotates pairs of dimensions."
      )

  @property
  def effective_query_scale(self) -> float:
    """The factor applied to queries (`query_scale`, or `head_dim ** -0.5`)."""
    if self.query_scale is None:
      return self.head_dim ** -0.5
    return self.query_scale

  @property
  def is_global_layer(self) -> tuple[bool, ...]:
    """For each layer, whether it attends globally (else within `sliding_window`)."""
    period = self.global_layer_period
    return tuple((i + 1) % period == 0 for i in range(self.num_layers))

  @classmethod
  def gemma3_270m(cls) -> "Gemma3Config":
    """The hyper-parameters of Gemma 3 270M (what `from_gguf` finds in its file)."""
    return cls(vocab_size=262_144, embed_dim=640, hidden_dim=2048, num_layers=18,
               num_heads=4, num_kv_heads=1, head_dim=256)

  @classmethod
  def tiny(cls, *, vocab_size: int = 256, **overrides: Any) -> "Gemma3Config":
    """A small config with the same architecture, for fast tests with random weights.

    Four layers with a global layer every second one, grouped-query attention (4 query
    heads on 2 key/value heads) and an 8-token sliding window, so that short sequences
    already exercise every code path of the full model.

    Args:
      vocab_size: Width of the embedding and of the logits.
      **overrides: Any other field of `Gemma3Config`.
    """
    fields = dict(embed_dim=32, hidden_dim=64, num_layers=4, num_heads=4, num_kv_heads=2,
                  head_dim=16, sliding_window=8, global_layer_period=2)
    fields.update(overrides)
    return cls(vocab_size=vocab_size, **fields)

  @classmethod
  def from_gguf(cls, gguf: "_gguf_file.GgufFile | str | os.PathLike") -> "Gemma3Config":
    """Reads the hyper-parameters from a Gemma 3 GGUF file's metadata.

    The local RoPE base (10,000) and the 5-local-1-global layer pattern are not stored
    in GGUF files; they take the values of all Gemma 3 models.

    Args:
      gguf: A parsed `GgufFile`, or the path of a `.gguf` file.

    Raises:
      ModelFormatError: If the file is not a Gemma 3 model or lacks a needed key.
    """
    if not isinstance(gguf, _gguf_file.GgufFile):
      gguf = _gguf_file.read_gguf(gguf)
    metadata = gguf.metadata
    arch = metadata.get("general.architecture")
    if arch != "gemma3":
      raise ModelFormatError(
          f"GGUF file {gguf.path!r} has general.architecture={arch!r}. Expected "
          "'gemma3'. Only Gemma 3 text models are supported; pass a Gemma 3 GGUF."
      )

    def get(key: str) -> Any:
      full_key = f"gemma3.{key}"
      if full_key not in metadata:
        raise ModelFormatError(
            f"GGUF file {gguf.path!r} lacks the metadata key {full_key!r}. Expected a "
            "complete Gemma 3 header, as written by llama.cpp's converter."
        )
      return metadata[full_key]

    embedding = gguf.tensors.get("token_embd.weight")
    if embedding is None:
      raise ModelFormatError(
          f"GGUF file {gguf.path!r} has no tensor 'token_embd.weight'. Expected the "
          "token embedding of a Gemma 3 model."
      )
    head_dim = int(get("attention.key_length"))
    value_dim = int(get("attention.value_length"))
    if value_dim != head_dim:
      raise ModelFormatError(
          f"GGUF file {gguf.path!r} has key_length={head_dim} but value_length="
          f"{value_dim}. Expected equal widths, as in every Gemma 3 model."
      )
    optional = {}
    # Newer converters may store what older files leave to the reader's defaults.
    if "gemma3.rope.freq_base_swa" in metadata:
      optional["local_rope_base"] = _shortest_float(metadata["gemma3.rope.freq_base_swa"])
    if "gemma3.attention.sliding_window_pattern" in metadata:
      optional["global_layer_period"] = _layer_period(
          metadata["gemma3.attention.sliding_window_pattern"], gguf.path)
    return cls(
        **optional,
        vocab_size=int(embedding.shape[1]),
        embed_dim=int(get("embedding_length")),
        hidden_dim=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=int(get("attention.head_count")),
        num_kv_heads=int(get("attention.head_count_kv")),
        head_dim=head_dim,
        rms_norm_eps=_shortest_float(get("attention.layer_norm_rms_epsilon")),
        sliding_window=int(get("attention.sliding_window")),
        global_rope_base=_shortest_float(get("rope.freq_base")),
    )


def _shortest_float(value: float) -> float:
  """A float32 metadata value as the shortest decimal that rounds to it (1e-6, not
  9.99999997e-07), so that configs read from files equal the documented ones."""
  return float(str(np.float32(value)))


def _layer_period(pattern: Any, path: str) -> int:
  """The global-layer period from GGUF's `sliding_window_pattern`.

  llama.cpp writes either the period (an int) or one bool per layer, true for
  sliding-window layers; the latter must repeat "period - 1 local, then 1 global".
  """
  if isinstance(pattern, int):
    return pattern
  is_local = [bool(v) for v in pattern]
  if all(is_local):
    return len(is_local) + 1  # No global layer at all.
  period = is_local.index(False) + 1
  if all(local == ((i + 1) % period != 0) for i, local in enumerate(is_local)):
    return period
  raise ModelFormatError(
      f"GGUF file {path!r} has sliding_window_pattern={is_local}. Expected a pattern "
      "of the form [local] * (n - 1) + [global], repeated, as in Gemma 3."
  )

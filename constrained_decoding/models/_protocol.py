"""The model protocol: what `generate`, `evaluate` and the other decode loops need.

Modelled on DeepMind gemma's `TransformerLike`: a model is split into a *static* part,
the `Network` (pure functions of hyper-parameters, hashed into jit's cache key), and a
*traced* part, `params` (a pytree of arrays). The decode loops never look inside either:

```python
model.network.init_cache(batch_size=B, cache_len=C)                -> cache
model.network.apply(params, tokens, positions, cache,
                    logit_indices=None)                            -> (logits, cache)
model.network.logits_width                                         -> V (int)
model.encode(text) -> list[int];  model.vocab;  model.params
```

Public names:
  Network             the static pure functions (`apply`, `init_cache`, `logits_width`).
  LanguageModel       network + params + vocabulary + prompt encoder.
  ModelProtocolError  a model object lacks part of the protocol (named in the message).
  check_model(model)  the host-side check every decode entry point runs first.
  decode_network(model)  the network the loops run: the model's own, or one whose
                      logits past the vocabulary are -inf when they are wider than it.

Device code: imports jax, never pynini.
"""

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from constrained_decoding.vocab._vocabulary import Vocabulary


@runtime_checkable
class Network(Protocol):
  """A model's pure functions: static under `jax.jit`, so hashable and holding no arrays.

  ```python
  @dataclasses.dataclass(frozen=True)      # hashed by value: equal networks share programs
  class MyNetwork:
    dim: int
    logits_width: int

    def init_cache(self, *, batch_size, cache_len):
      return jnp.zeros((batch_size, cache_len, self.dim))

    def apply(self, params, tokens, positions, cache, *, logit_indices=None):
      ...
      return logits, cache
  ```

  The decode loops pass a network as a static argument of `jax.jit`: equal networks
  (a frozen dataclass of hyper-parameters compares by value) share one compiled
  program, and a network that held weights would keep them alive in jit's cache and
  bake them into the program as constants. Weights go in `LanguageModel.params`.

  Contract of the cache (the decode loops rely on it; Gemma 3's `KVCache` keeps it):

  - Slot p of row b holds what the token at position p of row b left. A call writes
    the slots of its positions, overwriting earlier writes there.
  - A query at position p sees only slots <= p (causal by position, not by call). So a
    cache can be rewound by writing again: speculative decoding overwrites rejected
    drafts, and stale slots past a row's position are never seen.
  - A negative position is padding (left-padded prompts, rows paused under
    jump-forward): nothing is written, and its logits are ignored.
  - Positions reach `cache_len - 1` at most; the loops size the cache so.

  Attributes:
    logits_width: V, the width of `apply`'s logits. Wider than the vocabulary's
      `vocab_size` is fine (the decode loops mask the extra columns); narrower than
      the tables of a constraint is a `VocabularyMismatchError`.
  """

  @property
  def logits_width(self) -> int:
    ...

  def init_cache(self, *, batch_size: int, cache_len: int) -> Any:
    """An empty cache (a pytree of arrays) of `batch_size` rows and `cache_len` slots."""
    ...

  def apply(
      self,
      params: Any,
      tokens: Int[Array, "B L"],
      positions: Int[Array, "B L"],
      cache: Any,
      *,
      logit_indices: Int[Array, "B N"] | None = None,
  ) -> tuple[Float[Array, "B _ V"], Any]:
    """Runs the model on `tokens` at `positions`, reading and extending `cache`.

    One function serves the three calls the decode loops make: the prefill (a
    left-padded prompt, L = prompt width, `logit_indices` = the last column), a decode
    step (L = 1), and a verification or jump-forward chunk (L = k + 1, every logit or
    the ones at `logit_indices`). Traced inside `jax.jit` and `lax.while_loop`: no
    Python branching on values, shapes of the output fixed by those of the input.

    Args:
      params: The weights (`LanguageModel.params`), traced.
      tokens: Token ids (int32).
      positions: Absolute position of each token (int32); negative marks padding.
      cache: The cache from `init_cache` or an earlier call.
      logit_indices: Optional columns of L whose logits are returned ([B, N, V]); None
        returns all of them ([B, L, V]). Lets a model skip the output projection of
        the others.

    Returns:
      Logits (floating, [B, L or N, logits_width]) and the updated cache (same
      structure, shapes and dtypes as the one given: it is a `while_loop` carry).
    """
    ...


@runtime_checkable
class LanguageModel(Protocol):
  """What the decode loops take as `model`: a network, its weights, a vocabulary.

  ```python
  @dataclasses.dataclass(frozen=True, eq=False)
  class MyModel:
    network: MyNetwork            # static under jit
    params: Any                   # traced: a pytree of arrays
    vocab: cd.Vocabulary          # what constraints are compiled for

    def encode(self, text: str) -> list[int]:
      return [BOS, *tokenizer.encode(text)]

  completions = cd.generate(MyModel(...), "Answer: ", constraint=cd.Regex("yes|no"))
  ```

  `cd.models.Gemma3` implements it. See `docs/models.md` for a worked example.

  Attributes:
    network: The static pure functions (`Network`).
    params: The weights, passed to `network.apply` as a traced argument.
    vocab: The vocabulary the model's logits index: token bytes and end-of-sequence
      ids. Constraints are compiled for it (`cd.Compiler(model.vocab)`).
  """

  @property
  def network(self) -> Network:
    ...

  @property
  def params(self) -> Any:
    ...

  @property
  def vocab(self) -> Vocabulary:
    ...

  def encode(self, text: str) -> list[int]:
    """Token ids of a text prompt (with BOS or whatever the model expects first)."""
    ...


class ModelProtocolError(TypeError):
  """A model object does not implement `LanguageModel` / `Network` (see the message)."""


_MODEL_ATTRIBUTES = ("network", "params", "vocab")
_MODEL_METHODS = ("encode",)
_NETWORK_METHODS = ("init_cache", "apply")


def check_model(model: Any, *, name: str = "model") -> Any:
  """`model` if it implements `LanguageModel`; else raises, naming what is missing.

  Run on the host before anything is traced, so that a missing method is reported as
  such rather than as an AttributeError from deep inside `jax.jit`.

  Raises:
    ModelProtocolError: A missing attribute or method, a non-callable method, a
      network that cannot be hashed (it is a static argument of jit), a `vocab` that is
      not a `Vocabulary`, or a `logits_width` that is not a positive int.
  """
  kind = type(model).__name__
  for attr in _MODEL_ATTRIBUTES:
    if not hasattr(model, attr):
      raise ModelProtocolError(
          f"{name} (a {kind}) has no attribute {attr!r}. Expected a cd.models."
          f"LanguageModel: network, params, vocab and encode(text) (see docs/models.md).")
  for method in _MODEL_METHODS:
    if not callable(getattr(model, method, None)):
      raise ModelProtocolError(
          f"{name} (a {kind}) has no method {method!r}. Expected a cd.models."
          f"LanguageModel: network, params, vocab and encode(text) (see docs/models.md).")
  if not isinstance(model.vocab, Vocabulary):
    raise ModelProtocolError(
        f"{name}.vocab is a {type(model.vocab).__name__}. Expected a cd.Vocabulary (e.g. "
        f"cd.Vocabulary.from_token_bytes(...)).")
  network = model.network
  net_kind = type(network).__name__
  for method in _NETWORK_METHODS:
    if not callable(getattr(network, method, None)):
      raise ModelProtocolError(
          f"{name}.network (a {net_kind}) has no method {method!r}. Expected a cd.models."
          f"Network: init_cache(*, batch_size, cache_len), apply(params, tokens, "
          f"positions, cache, *, logit_indices=None) and logits_width.")
  width = getattr(network, "logits_width", None)
  if not isinstance(width, int) or isinstance(width, bool) or width < 1:
    raise ModelProtocolError(
        f"{name}.network (a {net_kind}) has logits_width {width!r}. Expected a positive "
        f"int, the width of apply's logits.")
  try:
    hash(network)
  except TypeError as e:
    raise ModelProtocolError(
        f"{name}.network (a {net_kind}) is not hashable ({e}). Expected a hashable "
        f"network (e.g. a frozen dataclass of hyper-parameters): it is a static argument "
        f"of jax.jit. Keep weights in {name}.params.") from e
  # Logits narrower than the vocabulary are refused where they matter, with the tables:
  # a constraint's mask would lose the ids past them (`VocabularyMismatchError`).
  return model


@dataclasses.dataclass(frozen=True)
class _PaddedColumnsMasked:
  """`network` with -inf logits in the columns past the vocabulary (`num_tokens` on).

  Used only when a model's logits are wider than its vocabulary (padded embedding
  tables): constrained rows never pick those columns anyway (`mask_logits` forbids
  them), and this keeps unconstrained rows off them too.
  """

  network: Any
  num_tokens: int

  @property
  def logits_width(self) -> int:
    return self.network.logits_width

  def init_cache(self, *, batch_size: int, cache_len: int) -> Any:
    return self.network.init_cache(batch_size=batch_size, cache_len=cache_len)

  def apply(self, params, tokens, positions, cache, *, logit_indices=None):
    logits, cache = self.network.apply(params, tokens, positions, cache,
                                       logit_indices=logit_indices)
    real = jnp.arange(logits.shape[-1]) < self.num_tokens
    return jnp.where(real, logits, -jnp.inf).astype(logits.dtype), cache


def decode_network(model: Any) -> Any:
  """The network the decode loops run for `model` (checked with `check_model` first).

  The model's own network when its logits are no wider than its vocabulary (the same
  static value, so the same compiled programs); else one that masks the columns past
  `model.vocab.vocab_size`.
  """
  network = model.network
  if network.logits_width <= model.vocab.vocab_size:
    return network
  return _PaddedColumnsMasked(network, model.vocab.vocab_size)

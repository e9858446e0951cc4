"""DeepMind gemma's own sampler, constrained (extra `gemma`).

gemma's `gm.text.SamplerLoop` can only mask a static `forbidden_tokens` tuple (a new set
recompiles), and its `SamplingState` has no slot for per-row constraint state. This
module is the adapter: a `SamplingState` with two more fields (the constraint state
and the tables, both traced, so another constraint in the same bucket reuses the
compiled loop) and a `SamplerLoop` whose step masks, guards and advances the constraint
around `sampling.get_next_tokens`:

```python
sampler = cd.sampling.ConstrainedSampler(model=model, params=params, tokenizer=tokenizer)
text = sampler.sample(prompt, tables=tables, max_new_tokens=64)
```

Written against gemma 3.3.0. Its prefill (`_prefill.prefill`) does not sample: the loop
re-runs the last prompt token, so every new token, the first included, comes out of
`_sample_step`, which is the one method replaced here. Everything else (the
`lax.while_loop`, the post-processing, streaming, multi-turn caches) is gemma's.

Imported lazily by `constrained_decoding.sampling` (module `__getattr__`): gemma is an
optional extra, never a dependency of the core package.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

import flax.struct
from gemma.gm.text import _prefill
from gemma.gm.text import _sampler
from gemma.gm.text import _sampler_loop
import jax
import jax.numpy as jnp

from constrained_decoding import runtime
from constrained_decoding.tables import ConstraintTables


@flax.struct.dataclass(kw_only=True)
class ConstrainedSamplingState(_sampler_loop.SamplingState):
  """gemma's sampling state, plus the constraint.

  Attributes:
    constraint: Per-row constraint state (`cd.ConstraintState`, `[B]` rows), advanced
      by every sampled token.
    tables: The constraint's tables. A traced field (not a static one, not a closure),
      so a second constraint whose tables fall in the same bucket reuses the loop.
  """

  constraint: runtime.ConstraintState
  tables: ConstraintTables


# Not type-checked in tests: gemma annotates `model` with a Protocol that is not
# runtime-checkable, which beartype refuses.
@typing.no_type_check
@dataclasses.dataclass(frozen=True, kw_only=True)
class ConstrainedSamplerLoop(_sampler_loop.SamplerLoop):
  """gemma's `SamplerLoop` whose every token obeys a constraint.

  Same static fields as gemma's (all hashable configuration; the tables travel in the
  state). `start` turns the state that gemma's prefill returns into a
  `ConstrainedSamplingState`; `sample` is gemma's. A row stops at one of `end_tokens`
  as in gemma, and also once its constraint is done or in error, so give the
  vocabulary the tables were compiled for the same end ids (`eos_ids`) as `end_tokens`:
  a finished row then emits one of them and gemma's post-processing zeroes what follows.
  A row cut off by `max_new_tokens` or a full cache holds a prefix of the language;
  `state.constraint.done` tells which rows completed.
  """

  def start(
      self,
      init_state: _sampler_loop.SamplingState,
      tables: ConstraintTables,
      *,
      constraint_ids: Any = None,
  ) -> ConstrainedSamplingState:
    """`init_state` (from gemma's prefill) with a fresh constraint state per row.

    `constraint_ids` picks one constraint per row of stacked tables
    (`cd.stack_tables`), as in `cd.init_state`.
    """
    batch_size = init_state.done.shape[0]
    if constraint_ids is None:
      constraint = runtime.init_state(tables, batch_size=batch_size)
    else:
      constraint = runtime.init_state(tables, constraint_ids=constraint_ids)
    fields = {f.name: getattr(init_state, f.name)
              for f in dataclasses.fields(_sampler_loop.SamplingState)}
    return ConstrainedSamplingState(**fields, constraint=constraint, tables=tables)

  @functools.partial(jax.jit, static_argnames=("self",))
  def _sample_step(
      self,
      state: ConstrainedSamplingState,
      *,
      params: Any,
  ) -> ConstrainedSamplingState:
    """gemma's step with the mask before `get_next_tokens` and `advance` after it."""
    out = self.model.apply(
        {"params": params},
        tokens=state.last_token[..., None],
        cache=state.cache,
        positions=state.last_token_pos[..., None],
        attention_mask=state.attention_mask_for_step[:, None, :],  # B 1 L
    )
    logits = out.logits[:, 0, :]  # B 1 V -> B V
    if self.forbidden_tokens:
      logits = logits.at[:, self.forbidden_tokens].set(-jnp.inf)
    logits = runtime.mask_logits(state.tables, state.constraint, logits)

    next_rng, curr_rng = jax.random.split(state.rng)
    next_token = self.sampling.get_next_tokens(logits, rng=curr_rng)
    # A row whose allowed logits were all -inf or NaN (or all forbidden_tokens) gets its
    # lowest allowed id rather than a token that would put it in error.
    next_token = runtime.allowed_or_lowest(state.tables, state.constraint, next_token)
    constraint = runtime.advance(state.tables, state.constraint, next_token)

    predicted_tokens = state.predicted_tokens.at[:, state.step].set(next_token)
    done = (state.done
            | jnp.isin(next_token, jnp.asarray(self.end_tokens))
            | constraint.done
            | constraint.error)
    return dataclasses.replace(
        state,
        step=state.step + 1,
        done=done,
        last_token=next_token,
        # As gemma: the position moves only while the row was not done before.
        last_token_pos=state.last_token_pos + ~state.done,
        predicted_tokens=predicted_tokens,
        cache=out.cache,
        rng=next_rng,
        constraint=constraint,
    )


@typing.no_type_check  # As ConstrainedSamplerLoop.
@dataclasses.dataclass(frozen=True, kw_only=True)
class ConstrainedSampler(_sampler.Sampler):
  """gemma's `gm.text.Sampler` with a constraint per call.

  ```python
  sampler = cd.sampling.ConstrainedSampler(model=model, params=params)
  out = sampler.sample(prompts, tables=tables, max_new_tokens=64, return_state=True)
  out.text, out.state.constraint.done
  ```

  `sample` takes gemma's arguments plus `tables` (and `constraint_ids` for stacked
  tables); the body is gemma 3.3.0's `Sampler.sample` with `ConstrainedSamplerLoop` in
  place of `SamplerLoop`. The tables' vocabulary must match the tokenizer's ids and
  the logits width (`cd.Vocabulary.from_sentencepiece(...)` on the tokenizer's model,
  with `eos_ids` the sampler's end tokens: EOS, `<end_of_turn>` and `stop_tokens`).
  """

  def sample(  # pytype: disable=signature-mismatch
      self,
      prompt,
      *,
      tables: ConstraintTables,
      constraint_ids=None,
      images=None,
      max_new_tokens=None,
      stream=False,
      sampling=None,
      rng=None,
      return_state=False,
      last_state=None,
      sharding=None,
  ):
    """Samples text from the model that `tables` accepts; else as gemma's `sample`."""
    sampling = sampling or self.sampling
    rng = _sampler._normalize_rng(rng)  # pylint: disable=protected-access
    has_batch_dim = _sampler._get_has_batch_dim(prompt)  # pylint: disable=protected-access
    if stream and has_batch_dim:
      raise ValueError(
          "Streaming is not supported for batched prompts (as in gemma's Sampler).")
    inputs = self._get_inputs(
        prompt=prompt,
        images=images,
        add_bos=last_state is None,
        has_batch_dim=has_batch_dim,
        sharding=sharding,
    )
    init_state = _prefill.prefill(
        model=self.model,
        params=self.params,
        input=inputs,
        last_state=last_state,
        cache_length=self.cache_length,
        pad_length=self.pad_length,
        rng=rng,
        sharding=sharding,
        max_out_length=self.max_out_length,
    )
    if max_new_tokens and max_new_tokens > self.max_out_length:
      raise ValueError(
          f"max_new_tokens is {max_new_tokens}. Expected at most max_out_length "
          f"({self.max_out_length}).")
    max_new_tokens = jnp.asarray(max_new_tokens or self.max_out_length)

    loop = ConstrainedSamplerLoop(
        model=self.model,
        end_tokens=(
            self.tokenizer.special_tokens.EOS,
            self.tokenizer.special_tokens.END_OF_TURN,
            *self._normalized_stop_tokens,
        ),
        forbidden_tokens=self._normalized_forbidden_tokens,
        sampling=sampling,
        cache_length=self.cache_length,
        special_tokens=self.tokenizer.special_tokens,
    )
    state = loop.sample(
        params=self.params,
        init_state=loop.start(init_state, tables, constraint_ids=constraint_ids),
        max_new_tokens=max_new_tokens,
        stream=stream,
    )
    if stream:
      return self._stream_decode_state(state, return_state=return_state)
    return self._decode_state(
        state,
        predicted_tokens=state.predicted_tokens,
        has_batch_dim=has_batch_dim,
        return_state=return_state,
    )

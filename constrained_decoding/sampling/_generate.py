"""Constrained generation: prefill, then decode inside one `lax.while_loop`.

The constraint state is threaded through the loop carry; each iteration masks the
logits, samples, advances the constraint and runs the model on the new token. No host
callback runs inside the loop: the only host work is tokenizing prompts before and
detokenizing after (or between chunks when streaming).

Public names:
  generate(model, prompts, ...)         -> list[Completion]
  generate_stream(model, prompts, ...)  yields (row, text piece) as tokens are produced.
  Completion                            token ids, text, and how the row ended.
"""

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from constrained_decoding import runtime
from constrained_decoding.models import _gemma3
from constrained_decoding.sampling._methods import SamplingConfig, sample_tokens
from constrained_decoding.tables import ConstraintTables, bucket_size, stack_tables

_MIN_PROMPT_BUCKET = 16


@flax.struct.dataclass(kw_only=True)
class DecodeState:
  """Carry of the decode loop (one row per sequence).

  Attributes:
    step: Number of tokens generated so far (scalar; equal for all rows).
    tokens: Generated tokens; slots past a row's end hold its first end-of-sequence id.
    logits: Next-token logits of each row (from the last model call).
    cache: The model's KV cache.
    constraint: Constraint state (a dummy when decoding is unconstrained).
    prompt_lengths: Prompt length of each row (positions continue from there).
    done: The row produced an end-of-sequence token.
    rng: Sampling key.
  """

  step: Int[Array, ""]
  tokens: Int[Array, "B N"]
  logits: Float[Array, "B V"]
  cache: Any
  constraint: runtime.ConstraintState
  prompt_lengths: Int[Array, "B"]
  done: Bool[Array, "B"]
  rng: jax.Array


@dataclasses.dataclass(frozen=True)
class Completion:
  """One generated sequence.

  Attributes:
    token_ids: Generated ids, without the end-of-sequence token.
    text: Their text (invalid UTF-8, possible only without a constraint, is replaced).
    finished: An end-of-sequence token ended the row (else it ran out of tokens).
    error: The constraint saw a forbidden token (never expected; a bug if True).
  """

  token_ids: tuple[int, ...]
  text: str
  finished: bool
  error: bool


def _is_eos(tokens: Int[Array, "B"], eos_ids: Int[Array, "E"]) -> Bool[Array, "B"]:
  return (tokens[:, None] == eos_ids[None, :]).any(axis=1)


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens", "cache_len"))
def _prefill(params, tables, prompt_tokens, prompt_lengths, constraint_ids, rng, *,
             config, max_new_tokens: int, cache_len: int) -> DecodeState:
  """Runs left-padded prompts through the model; returns the loop's initial carry."""
  batch, width = prompt_tokens.shape
  positions = jnp.arange(width)[None, :] - (width - prompt_lengths)[:, None]
  positions = jnp.where(positions < 0, -1, positions).astype(jnp.int32)  # -1 marks padding
  cache = _gemma3.init_cache(config, batch_size=batch, cache_len=cache_len)
  last = jnp.full((batch, 1), width - 1, jnp.int32)
  logits, cache = _gemma3.forward(params, config, prompt_tokens, positions, cache,
                                  logit_indices=last)
  if tables is None:
    zeros = jnp.zeros(batch, jnp.int32)
    constraint = runtime.ConstraintState(state=zeros, stack=jnp.zeros((batch, 0), jnp.int32),
                                         depth=zeros, done=jnp.zeros(batch, bool),
                                         error=jnp.zeros(batch, bool))
  else:
    constraint = runtime.init_state(tables, constraint_ids=constraint_ids)
  return DecodeState(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.zeros((batch, max_new_tokens), jnp.int32),
      logits=logits[:, 0],
      cache=cache,
      constraint=constraint,
      prompt_lengths=prompt_lengths,
      done=jnp.zeros(batch, bool),
      rng=rng,
  )


@functools.partial(jax.jit, static_argnames=("config", "sampling"), donate_argnames=("state",))
def _decode(params, tables, state: DecodeState, limit, eos_ids, temperature, top_p, *,
            config, sampling: SamplingConfig) -> DecodeState:
  """Decodes until `limit` tokens are generated or every row is done: one while_loop."""
  pad = eos_ids[0]

  def cond_fn(s: DecodeState):
    # Continue while some row is still producing and the token budget is not spent.
    return (s.step < limit) & ~s.done.all()

  def body_fn(s: DecodeState) -> DecodeState:
    logits = s.logits
    if tables is not None:
      logits = runtime.mask_logits(tables, s.constraint, logits)
    rng, key = jax.random.split(s.rng)
    token = sample_tokens(logits, key, sampling, temperature=temperature, top_p=top_p)
    token = jnp.where(s.done, pad, token)
    constraint = s.constraint
    if tables is not None:
      constraint = runtime.advance(tables, constraint, token)
    done = s.done | _is_eos(token, eos_ids) | constraint.error
    positions = (s.prompt_lengths + s.step)[:, None]
    next_logits, cache = _gemma3.forward(params, config, token[:, None], positions, s.cache)
    return s.replace(
        step=s.step + 1,
        tokens=s.tokens.at[:, s.step].set(token),
        logits=next_logits[:, 0],
        cache=cache,
        constraint=constraint,
        done=done,
        rng=rng,
    )

  return jax.lax.while_loop(cond_fn, body_fn, state)


def _prepare(model, prompts, constraint, constraint_ids, max_new_tokens, seed):
  """Host side: tokenize, left-pad to a bucket, stack per-row constraints."""
  if isinstance(prompts, str):
    prompts = [prompts]
  if not prompts:
    raise ValueError("generate got no prompts. Expected a string or a list of strings.")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens {max_new_tokens} is below 1. Expected >= 1.")
  encoded = [p if isinstance(p, (list, tuple)) else model.encode(p) for p in prompts]
  width = bucket_size(max(map(len, encoded)), _MIN_PROMPT_BUCKET)
  batch = len(encoded)
  tokens = np.zeros((batch, width), np.int32)
  for i, ids in enumerate(encoded):
    tokens[i, width - len(ids):] = ids
  lengths = np.array([len(ids) for ids in encoded], np.int32)
  if isinstance(constraint, (list, tuple)):
    if len(constraint) != batch:
      raise ValueError(
          f"Got {len(constraint)} constraints for {batch} prompts. Expected one per prompt "
          f"(or a single ConstraintTables for all).")
    constraint, constraint_ids = stack_tables(constraint), np.arange(batch, dtype=np.int32)
  if constraint is not None:
    if not isinstance(constraint, ConstraintTables):
      raise TypeError(f"constraint is a {type(constraint).__name__}. Expected "
                      f"ConstraintTables from cd.Compiler(vocab).compile(spec).")
    if constraint.vocab_size > model.config.vocab_size:
      raise ValueError(
          f"The constraint was compiled for {constraint.vocab_size} tokens but the model "
          f"has {model.config.vocab_size} logits. Expected a vocabulary of this model.")
    if constraint_ids is None:
      constraint_ids = np.zeros(batch, np.int32)
  if constraint is not None:
    constraint = jax.device_put(constraint)  # once, not at every call
  ids = jnp.asarray(np.zeros(batch, np.int32) if constraint_ids is None else constraint_ids,
                    jnp.int32)
  buffer = bucket_size(max_new_tokens, 16)
  cache_len = width + buffer
  eos_ids = jnp.asarray(model.vocab.eos_ids, jnp.int32)
  state = _prefill(model.params, constraint, jnp.asarray(tokens), jnp.asarray(lengths), ids,
                   jax.random.PRNGKey(seed), config=model.config, max_new_tokens=buffer,
                   cache_len=cache_len)
  return constraint, state, eos_ids


def _decode_until(model, tables, state: DecodeState, limit: int, eos_ids,
                  sampling: SamplingConfig) -> DecodeState:
  """Runs the jitted loop until `limit` tokens exist (values as arrays: no recompiles)."""
  return _decode(model.params, tables, state, jnp.int32(limit), eos_ids,
                 jnp.float32(sampling.temperature), jnp.float32(sampling.top_p),
                 config=model.config, sampling=sampling.static_part())


def _completions(model, state: DecodeState, count: int) -> list[Completion]:
  tokens = np.asarray(state.tokens)[:, :count]
  eos = set(model.vocab.eos_ids)
  errors = np.asarray(state.constraint.error)
  out = []
  for row, err in zip(tokens, errors):
    ids = [int(t) for t in row]
    end = next((k for k, t in enumerate(ids) if t in eos), None)
    kept = tuple(ids if end is None else ids[:end])
    out.append(Completion(token_ids=kept,
                          text=model.vocab.decode(kept).decode("utf-8", errors="replace"),
                          finished=end is not None, error=bool(err)))
  return out


def generate(
    model,
    prompts: str | Sequence[str] | Sequence[Sequence[int]],
    *,
    constraint: ConstraintTables | Sequence[ConstraintTables] | None = None,
    constraint_ids: Sequence[int] | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
) -> list[Completion]:
  """Generates one completion per prompt, each following its constraint.

  ```python
  model = cd.models.Gemma3.from_gguf()
  tables = cd.Compiler(model.vocab).compile(cd.Regex(r"(yes|no)"))
  [answer] = cd.generate(model, "Is water wet? Answer: ", constraint=tables)
  ```

  Args:
    model: A `models.Gemma3` (config, params, tokenizer, vocabulary).
    prompts: Text prompts (BOS is prepended), or lists of token ids used as given.
    constraint: Tables for all rows; a list with one tables per prompt (stacked here);
      or None for unconstrained decoding.
    constraint_ids: With stacked tables, which constraint each row follows.
    max_new_tokens: Most tokens to generate per row (the end-of-sequence token counts).
    sampling: Greedy (default), temperature, top-k, top-p.
    seed: Random seed for sampling.

  Returns:
    One `Completion` per prompt, in order.
  """
  tables, state, eos_ids = _prepare(model, prompts, constraint, constraint_ids,
                                    max_new_tokens, seed)
  state = _decode_until(model, tables, state, max_new_tokens, eos_ids, sampling)
  return _completions(model, state, max_new_tokens)


def generate_stream(
    model,
    prompts: str | Sequence[str],
    *,
    constraint: ConstraintTables | Sequence[ConstraintTables] | None = None,
    constraint_ids: Sequence[int] | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
    chunk_size: int = 1,
) -> Iterator[tuple[int, bytes]]:
  """Like `generate`, but yields `(row, new bytes)` every `chunk_size` tokens.

  The same jitted loop runs with a growing token limit, so the host sees tokens between
  chunks without any callback inside the loop. Bytes (not text) are yielded because a
  token may end inside a multi-byte character; buffer and decode them at the end.
  """
  tables, state, eos_ids = _prepare(model, prompts, constraint, constraint_ids,
                                    max_new_tokens, seed)
  eos = set(model.vocab.eos_ids)
  emitted = 0
  finished = np.zeros(state.tokens.shape[0], bool)
  while emitted < max_new_tokens and not finished.all():
    limit = min(emitted + chunk_size, max_new_tokens)
    state = _decode_until(model, tables, state, limit, eos_ids, sampling)
    produced = int(state.step)
    new = np.asarray(state.tokens[:, emitted:produced])
    for row in range(new.shape[0]):
      for t in new[row]:
        if finished[row]:
          break
        if int(t) in eos:
          finished[row] = True
          break
        yield row, model.vocab.decode([int(t)])
    if produced == emitted:
      break
    emitted = produced

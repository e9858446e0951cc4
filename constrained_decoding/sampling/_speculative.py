"""Speculative decoding under a constraint, inside one jitted `lax.while_loop`.

Paper Sec. 5.3, with the speculative sampling of Leviathan et al. (2023). Each round:

1. A drafter proposes k tokens. Each draft step is masked with the constraint state the
   draft has reached (so proposals stay valid), and every state it passes through is
   recorded in a `ConstraintHistory`.
2. The target model scores `[last token, d_1 .. d_k]` in one call: k + 1 next-token
   distributions. Position j is masked with the recorded state s_j (the constraint's
   penalties are shared with the target, never recomputed on the host), so the target
   can neither accept nor resample an invalid token.
3. Draft token d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)), where p and
   q are the target's and the draft's *constrained* sampling distributions (masked,
   then temperature / top-k / top-p, renormalized); the first rejection resamples from
   norm(max(0, p_j - q_j)); when all k are accepted a bonus token is drawn from p_{k+1}.
   The committed tokens are therefore distributed exactly as plain constrained sampling
   from the target. Greedy: a draft token is accepted iff it is the target's argmax,
   and the target's argmax replaces the first mismatch (the output equals plain
   greedy decoding).
4. The constraint is rewound to the accepted prefix (`runtime.rewind`) and advanced by
   the new token. KV caches need no copy: each row's entries beyond the accepted
   prefix are overwritten by later writes at the same positions before any query can
   see them, because attention masks by position (a query at position p sees slots
   <= p only), so stale entries are never attended.

Drafters: a smaller model sharing the vocabulary (any `models.LanguageModel`),
or `NGramDrafter` (prompt lookup: the continuation of the most recent earlier
occurrence of the current suffix in the prompt + generated tokens), which needs no
model, so the real Gemma 3 270M can be the target on a CPU.

Public names:
  generate_speculative(model, prompts, *, draft, num_draft_tokens, ...)
      -> (list[Completion], SpeculativeStats)
  NGramDrafter        configuration of the model-free drafter.
  SpeculativeStats    per-row draft / acceptance counts.
"""

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from constrained_decoding import runtime
from constrained_decoding.models import _protocol
from constrained_decoding.sampling import _generate
from constrained_decoding.sampling import _host
from constrained_decoding.sampling import _loop
from constrained_decoding.sampling._methods import SamplingConfig, filter_logits, sample_tokens


@dataclasses.dataclass(frozen=True, kw_only=True)
class NGramDrafter:
  """Model-free drafter: prompt lookup over the prompt and the generated tokens.

  ```python
  outs, stats = cd.generate_speculative(model, prompts, draft=cd.NGramDrafter(max_ngram=3))
  ```

  To propose the next token, find the earlier positions where the last `n` tokens of
  the sequence occurred before (n from `max_ngram` down to `min_ngram`, longest match
  first, then most recent) and propose the token that followed. With the constraint on
  the draft, only matches whose next token the constraint allows count, and when none
  matches, the most recent allowed token of the sequence is proposed (in a literal of
  the constraint this is how the prompt spells it: Gemma allows a byte-fallback token
  and a piece for every character). A proposal is a point mass, which speculative
  sampling handles exactly.

  Attributes:
    max_ngram: Longest suffix to match.
    min_ngram: Shortest suffix that counts as a match.
  """

  max_ngram: int = 3
  min_ngram: int = 1

  def __post_init__(self):
    if not (isinstance(self.min_ngram, int) and isinstance(self.max_ngram, int)
            and 1 <= self.min_ngram <= self.max_ngram):
      raise ValueError(
          f"NGramDrafter(min_ngram={self.min_ngram!r}, max_ngram={self.max_ngram!r}) is "
          f"invalid. Expected ints with 1 <= min_ngram <= max_ngram.")


@dataclasses.dataclass(frozen=True)
class SpeculativeStats:
  """How speculation went, per row.

  Attributes:
    drafted: Draft tokens proposed while the row was generating: k per round, except
      that proposals past the row's end (end of sequence or budget) in its last round
      do not count.
    accepted: Draft tokens the target accepted (up to the row's end).
    rounds: Target calls (verification rounds) for the row.
    generated: Tokens generated, as `generate` counts them (the completion's tokens,
      plus its end-of-sequence token).
  """

  drafted: tuple[int, ...]
  accepted: tuple[int, ...]
  rounds: tuple[int, ...]
  generated: tuple[int, ...]

  @property
  def acceptance_rate(self) -> float:
    """Accepted / drafted draft tokens, over all rows (0 when nothing was drafted)."""
    drafted = sum(self.drafted)
    return sum(self.accepted) / drafted if drafted else 0.0

  @property
  def tokens_per_round(self) -> float:
    """Generated tokens per target call, over all rows (plain decoding: 1).

    The first token comes from the prefill's logits, as in `generate`, so it counts
    without a round."""
    rounds = sum(self.rounds)
    return sum(self.generated) / rounds if rounds else 0.0


@flax.struct.dataclass(kw_only=True)
class SpecState:
  """Carry of the speculative loop (one row per sequence).

  The target's cache holds each row's positions before `last`; `last` sits at
  position `prompt_lengths + num_generated - 1` and is fed to the target with the next
  drafts. The draft model's cache holds the positions before `prev`.

  Attributes:
    step: Rounds run so far (scalar).
    tokens: Committed tokens per row; row b's first `num_generated[b]` are valid.
    num_generated: Committed tokens per row.
    last: The newest committed token (not yet in the target's cache).
    prev: The committed token before `last` (refed to the draft model with `last`).
    target_cache: The target model's KV cache.
    draft_cache: The draft model's KV cache (None for the n-gram drafter).
    context: Prompt and committed tokens by position, for the n-gram drafter
      (zero-width for a draft model).
    constraint: Constraint state after `last`.
    prompt_lengths: Prompt length of each row.
    done: The row stopped (end of sequence, token budget, or constraint error).
    rng: Sampling key.
    drafted: Draft tokens proposed per row.
    accepted: Draft tokens accepted per row.
    rounds: Verification rounds per row.
  """

  step: Int[Array, ""]
  tokens: Int[Array, "B N"]
  num_generated: Int[Array, "B"]
  last: Int[Array, "B"]
  prev: Int[Array, "B"]
  target_cache: Any
  draft_cache: Any
  context: Int[Array, "B C"]
  constraint: runtime.ConstraintState
  prompt_lengths: Int[Array, "B"]
  done: Bool[Array, "B"]
  rng: jax.Array
  drafted: Int[Array, "B"]
  accepted: Int[Array, "B"]
  rounds: Int[Array, "B"]


def _select_rows(flags: Bool[Array, "B"], on_true: Any, on_false: Any) -> Any:
  """Per row, the pytree `on_true` where `flags`, else `on_false` (leaves `[B, ...]`)."""
  return jax.tree_util.tree_map(
      lambda a, b: jnp.where(flags.reshape(flags.shape + (1,) * (a.ndim - 1)), a, b),
      on_true, on_false)


def _mask(tables, cstate, logits):
  return logits if tables is None else runtime.mask_logits(tables, cstate, logits)


def _advance(tables, cstate, tokens):
  return cstate if tables is None else runtime.advance(tables, cstate, tokens)


def _propose(logits: Float[Array, "B V"], key: jax.Array, sampling: SamplingConfig,
             temperature, top_p) -> tuple[Int[Array, "B"], Float[Array, "B V"] | None]:
  """One draft token per row, and the log-weights of the draft's distribution q (None
  when greedy: greedy verification compares argmaxes only)."""
  if sampling.is_greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
  q_logits = filter_logits(logits, sampling, temperature=temperature, top_p=top_p)
  return jax.random.categorical(key, q_logits, axis=-1).astype(jnp.int32), q_logits


def _point_mass(tokens: Int[Array, "B"], width: int) -> Float[Array, "B V"]:
  """Log-weights of a distribution putting all mass on `tokens`."""
  hit = jnp.arange(width)[None, :] == tokens[:, None]
  return jnp.where(hit, 0.0, -jnp.inf).astype(jnp.float32)


def _shift_right(x: Array, t: int, fill: int) -> Array:
  """x[:, i - t] at column i (`fill` where i < t)."""
  if t == 0:
    return x
  return jnp.pad(x, ((0, 0), (t, 0)), constant_values=fill)[:, :x.shape[1]]


def _ngram_lookup(context: Int[Array, "B C"], end: Int[Array, "B"],
                  allowed: Bool[Array, "B V"] | None, drafter: NGramDrafter
                  ) -> Int[Array, "B"]:
  """Prompt lookup: the token after the best earlier match of the sequence's suffix.

  `context[b, :end[b] + 1]` is row b's sequence. A match ending at column i < end has
  length l when the l tokens ending at i equal the last l tokens; the best match is the
  longest (up to `max_ngram`), then the most recent; its candidate is column i + 1.
  Only candidates in `allowed` count. Without a match of at least `min_ngram` tokens,
  the most recent allowed token of the sequence is proposed; without one, the lowest
  allowed id (unconstrained: the last token).
  """
  width = context.shape[1]
  rows = jnp.arange(context.shape[0])
  column = jnp.arange(width)[None, :]
  run = jnp.ones(context.shape, bool)
  length = jnp.zeros(context.shape, jnp.int32)
  for t in range(drafter.max_ngram):
    suffix = context[rows, jnp.maximum(end - t, 0)][:, None]
    run &= (_shift_right(context, t, -1) == suffix) & (column >= t) & ((end - t) >= 0)[:, None]
    length += run
  candidate = jnp.pad(context[:, 1:], ((0, 0), (0, 1)))
  ok = column < end[:, None]
  if allowed is not None:
    ok &= jnp.take_along_axis(allowed, jnp.clip(candidate, 0, allowed.shape[1] - 1), axis=1)
  # Any match beats no match (then the most recent allowed token); ties go to recency.
  matched = length >= drafter.min_ngram
  score = jnp.where(ok, jnp.where(matched, (length + 1) * width, 0) + column, -1)
  best = jnp.argmax(score, axis=1)
  found = score[rows, best] >= 0
  if allowed is None:
    fallback = context[rows, end]
  else:
    fallback = jnp.argmax(allowed, axis=1).astype(jnp.int32)
  return jnp.where(found, candidate[rows, best], fallback).astype(jnp.int32)


def _draft_with_model(draft_params, draft_network, tables, s: SpecState, keys,
                      sampling, temperature, top_p, constrain: bool):
  """k draft tokens from the draft model.

  Returns:
    Tokens [B, k], q log-weights [B, k, V] (None when greedy), the constraint history
    s_0..s_k, the state s_k, and the draft's cache.
  """
  pos = s.prompt_lengths + s.num_generated - 1  # position of `last`
  history = runtime.init_history(s.constraint, keys.shape[0])

  def step(carry, key):
    cache, before, token, p, cstate, history = carry
    # Each call feeds the token before too: in the first step that is `prev`, which the
    # draft's cache lacks when the previous round accepted every draft token; elsewhere
    # it rewrites an entry with the same value. One call shape, traced once.
    logits, cache = draft_network.apply(draft_params, jnp.stack([before, token], axis=1),
                                        jnp.stack([p - 1, p], axis=1), cache,
                                        logit_indices=jnp.ones((p.shape[0], 1), jnp.int32))
    logits = logits[:, 0]
    if constrain:
      logits = _mask(tables, cstate, logits)
    proposal, q = _propose(logits, key, sampling, temperature, top_p)
    cstate = _advance(tables, cstate, proposal)
    history = runtime.record(history, cstate)
    return (cache, token, proposal, p + 1, cstate, history), (proposal, q)

  carry = (s.draft_cache, s.prev, s.last, pos, s.constraint, history)
  (cache, _, _, _, cstate, history), (tokens, q) = jax.lax.scan(step, carry, keys)
  if q is not None:
    q = jnp.moveaxis(q, 0, 1)
  return tokens.T, q, history, cstate, cache


def _draft_with_ngrams(drafter: NGramDrafter, tables, s: SpecState, keys, sampling,
                       constrain: bool, width: int):
  """k draft tokens by prompt lookup; returns as `_draft_with_model` (no cache)."""
  rows = jnp.arange(s.last.shape[0])
  end = s.prompt_lengths + s.num_generated - 1  # column of `last` in `context`
  history = runtime.init_history(s.constraint, keys.shape[0])

  def step(carry, _):
    context, end, cstate, history = carry
    allowed = runtime.allowed_tokens(tables, cstate) if (constrain and tables is not None) else None
    token = _ngram_lookup(context, end, allowed, drafter)
    cstate = _advance(tables, cstate, token)
    history = runtime.record(history, cstate)
    context = context.at[rows, end + 1].set(token, mode="drop")
    return (context, end + 1, cstate, history), token

  (_, _, cstate, history), tokens = jax.lax.scan(
      step, (s.context, end, s.constraint, history), keys)
  tokens = tokens.T
  qs = None
  if not sampling.is_greedy:
    qs = jax.vmap(_point_mass, in_axes=(1, None), out_axes=1)(tokens, width)
  return tokens, qs, history, cstate, None


def _accept(target_logits, q_logits, drafts, key, sampling, temperature, top_p):
  """Speculative sampling: accepted draft count m [B] and the token after them [B]."""
  num_draft = drafts.shape[1]
  rows = jnp.arange(drafts.shape[0])
  if sampling.is_greedy:
    choice = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, k + 1]
    accept = drafts == choice[:, :num_draft]
    m = jnp.sum(jnp.cumprod(accept, axis=1), axis=1).astype(jnp.int32)
    return m, choice[rows, m]
  accept_key, resample_key = jax.random.split(key)
  p = jax.nn.softmax(filter_logits(target_logits, sampling, temperature=temperature,
                                   top_p=top_p), axis=-1)  # [B, k + 1, V]
  q = jax.nn.softmax(q_logits, axis=-1)  # [B, k, V]
  p_draft = jnp.take_along_axis(p[:, :num_draft], drafts[..., None], axis=-1)[..., 0]
  q_draft = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
  # u < p / q without dividing (q(d) > 0: d was drawn from q).
  u = jax.random.uniform(accept_key, drafts.shape)
  accept = u * q_draft < p_draft
  m = jnp.sum(jnp.cumprod(accept, axis=1), axis=1).astype(jnp.int32)
  p_m = p[rows, m]
  q_m = jnp.where((m < num_draft)[:, None], q[rows, jnp.minimum(m, num_draft - 1)], 0.0)
  residual = jnp.maximum(p_m - q_m, 0.0)
  # A rejection implies some token with p > q; guard against rounding leaving nothing.
  residual = jnp.where(residual.sum(-1, keepdims=True) > 0, residual, p_m)
  token = jax.random.categorical(resample_key, jnp.log(residual), axis=-1)
  return m, token.astype(jnp.int32)


@functools.partial(
    jax.jit, static_argnames=("target_network", "drafter", "sampling", "num_draft",
                              "constrain_draft"), donate_argnames=("state",))
def _speculate(target_params, draft_params, tables, state: SpecState, limit, eos_ids,
               temperature, top_p, *, target_network, drafter,
               sampling: SamplingConfig, num_draft: int, constrain_draft: bool) -> SpecState:
  """Speculative rounds until every row is done: one while_loop, no host callbacks."""
  width = target_network.logits_width

  def cond_fn(s: SpecState):
    # Continue while some row still generates (rows stop at end of sequence or budget).
    return ~s.done.all()

  def body_fn(s: SpecState) -> SpecState:
    rng, draft_key, accept_key = jax.random.split(s.rng, 3)
    keys = jax.random.split(draft_key, num_draft)
    if isinstance(drafter, NGramDrafter):
      drafts, q_logits, history, draft_state, draft_cache = _draft_with_ngrams(
          drafter, tables, s, keys, sampling, constrain_draft, width)
    else:
      drafts, q_logits, history, draft_state, draft_cache = _draft_with_model(
          draft_params, drafter, tables, s, keys, sampling, temperature, top_p,
          constrain_draft)
    # Target: k + 1 next-token distributions in one call.
    pos = s.prompt_lengths + s.num_generated - 1
    chunk = jnp.concatenate([s.last[:, None], drafts], axis=1)
    positions = pos[:, None] + jnp.arange(num_draft + 1)[None, :]
    logits, target_cache = target_network.apply(target_params, chunk, positions,
                                                s.target_cache)
    if tables is not None:
      # The history's slots 0..k hold s_0..s_k in order (one init, k records, no wrap):
      # position j of the target is masked with the state the draft reached there.
      logits = jax.vmap(runtime.mask_logits, in_axes=(None, 1, 1), out_axes=1)(
          tables, history.snapshots, logits)
    m, token = _accept(logits, q_logits, drafts, accept_key, sampling, temperature, top_p)
    if tables is not None:
      # Never accept a draft the constraint forbids (possible only when the target's
      # logits are NaN or -inf wherever allowed): cut the accepted prefix before it,
      # and let `allowed_or_lowest` below pick the token after the cut.
      draft_ok = ~history.snapshots.error[:, 1:]  # slot j holds s_j, after draft j
      num_ok = jnp.sum(jnp.cumprod(draft_ok, axis=1), axis=1).astype(jnp.int32)
      token = jnp.where(m > num_ok, -1, token)
      m = jnp.minimum(m, num_ok)
    # Rewind the constraint to s_m (k - m draft steps back), where the new token goes.
    _, rewound = runtime.rewind(history, draft_state, num_draft - m)
    if tables is not None:
      token = runtime.allowed_or_lowest(tables, rewound, token)

    active = ~s.done
    rows = jnp.arange(drafts.shape[0])
    offsets = jnp.arange(num_draft + 1)[None, :]
    committed = jnp.concatenate([drafts, jnp.zeros_like(drafts[:, :1])], axis=1)
    committed = committed.at[rows, m].set(token)  # d_1 .. d_m, token
    keep = (offsets <= m[:, None]) & active[:, None]
    columns = jnp.where(keep, s.num_generated[:, None] + offsets, s.tokens.shape[1])
    tokens = s.tokens.at[rows[:, None], columns].set(committed, mode="drop")
    context_columns = jnp.where(keep, pos[:, None] + 1 + offsets, s.context.shape[1])
    context = s.context.at[rows[:, None], context_columns].set(committed, mode="drop")
    constraint = _advance(tables, rewound, token)
    constraint = _select_rows(active, constraint, s.constraint)
    num_generated = s.num_generated + jnp.where(active, m + 1, 0)
    is_eos = (committed[:, :, None] == eos_ids[None, None, :]).any(axis=2) & keep
    done = s.done | (active & (is_eos.any(axis=1) | constraint.error
                               | (num_generated >= limit)))
    # Statistics count drafts up to the row's end only (its end of sequence or budget):
    # past it, a constrained draft keeps proposing end of sequence, which says nothing.
    first_eos = jnp.where(is_eos.any(axis=1), jnp.argmax(is_eos, axis=1), num_draft + 1)
    useful = jnp.minimum(m + 1, jnp.minimum(first_eos, limit - s.num_generated - 1) + 1)
    drafted = jnp.where(useful == m + 1, num_draft, useful)
    accepted = jnp.minimum(m, useful)
    prev = jnp.where(m == 0, s.last, drafts[rows, jnp.maximum(m - 1, 0)])
    return s.replace(
        step=s.step + 1,
        tokens=tokens,
        num_generated=num_generated,
        last=jnp.where(active, token, s.last),
        prev=jnp.where(active, prev, s.prev),
        target_cache=target_cache,
        draft_cache=draft_cache,
        context=context,
        constraint=constraint,
        done=done,
        rng=rng,
        drafted=s.drafted + jnp.where(active, drafted, 0),
        accepted=s.accepted + jnp.where(active, accepted, 0),
        rounds=s.rounds + active.astype(jnp.int32),
    )

  return jax.lax.while_loop(cond_fn, body_fn, state)


@functools.partial(jax.jit, static_argnames=("draft_network", "sampling", "context_len",
                                             "buffer"))
def _start(draft_params, tables, first: _loop.DecodeState, prompt_tokens, eos_ids, limit,
           temperature, top_p, *, draft_network,
           sampling: SamplingConfig, context_len: int, buffer: int) -> SpecState:
  """The loop's initial carry: the first token (a plain step), draft prefill, context."""
  batch, width = prompt_tokens.shape
  rng, key = jax.random.split(first.rng)
  logits = _mask(tables, first.constraint, first.logits)
  token = sample_tokens(logits, key, sampling, temperature=temperature, top_p=top_p)
  if tables is not None:
    token = runtime.allowed_or_lowest(tables, first.constraint, token)
  constraint = _advance(tables, first.constraint, token)
  lengths = first.prompt_lengths
  positions = jnp.arange(width)[None, :] - (width - lengths)[:, None]
  positions = jnp.where(positions < 0, -1, positions).astype(jnp.int32)
  draft_cache = None
  if draft_network is not None:
    draft_cache = draft_network.init_cache(batch_size=batch, cache_len=context_len)
    _, draft_cache = draft_network.apply(
        draft_params, prompt_tokens, positions, draft_cache,
        logit_indices=jnp.full((batch, 1), width - 1, jnp.int32))
    context = jnp.zeros((batch, 0), jnp.int32)
  else:
    rows = jnp.arange(batch)[:, None]
    columns = jnp.where(positions < 0, context_len, positions)
    context = jnp.zeros((batch, context_len), jnp.int32)
    context = context.at[rows, columns].set(prompt_tokens, mode="drop")
    context = context.at[jnp.arange(batch), lengths].set(token, mode="drop")
  done = (token[:, None] == eos_ids[None, :]).any(axis=1) | constraint.error | (limit <= 1)
  zeros = jnp.zeros(batch, jnp.int32)
  return SpecState(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.zeros((batch, buffer), jnp.int32).at[:, 0].set(token),
      num_generated=jnp.ones(batch, jnp.int32),
      last=token,
      prev=prompt_tokens[:, -1],
      target_cache=first.cache,
      draft_cache=draft_cache,
      context=context,
      constraint=constraint,
      prompt_lengths=lengths,
      done=done,
      rng=rng,
      drafted=zeros,
      accepted=zeros,
      rounds=zeros,
  )


def _check_draft(model, draft):
  """Raises unless `draft` is an `NGramDrafter` or a model sharing `model`'s vocabulary."""
  if isinstance(draft, NGramDrafter):
    return
  if not hasattr(draft, "network") or not hasattr(draft, "params"):
    raise TypeError(f"draft is a {type(draft).__name__}. Expected cd.NGramDrafter(...) or a "
                    f"draft model (a cd.models.LanguageModel such as cd.models.Gemma3) "
                    f"sharing the target's vocabulary.")
  _protocol.check_model(draft, name="draft")
  draft_width, width = draft.network.logits_width, model.network.logits_width
  if draft_width != width or draft.vocab != model.vocab:
    raise ValueError(
        f"The draft model has {draft_width} logits and vocabulary {draft.vocab!r}; the "
        f"target has {width} and {model.vocab!r}. Expected the same "
        f"vocabulary. Use a draft of the same model family, or cd.NGramDrafter().")


def generate_speculative(
    model,
    prompts: str | Sequence[str] | Sequence[Sequence[int]],
    *,
    draft: Any = NGramDrafter(),
    num_draft_tokens: int = 4,
    constraint: Any = None,
    constraint_ids: Sequence[int] | None = None,
    constrain_draft: bool = True,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
) -> tuple[list[_host.Completion], SpeculativeStats]:
  """Like `generate`, with a drafter proposing tokens that `model` verifies in one call.

  ```python
  target = cd.models.Gemma3.from_gguf()
  tables = cd.Compiler(target.vocab).compile(cd.Regex(r'\\{"answer": "[ABCD]"\\}'))
  outs, stats = cd.generate_speculative(target, prompts, draft=cd.NGramDrafter(),
                                        num_draft_tokens=4, constraint=tables)
  print(stats.acceptance_rate)
  ```

  The output follows the same distribution as `generate` with the same arguments
  (exactly equal completions under greedy sampling, up to floating-point ties: the
  target scores k + 1 positions per call instead of one).

  Args:
    model: The target, a `models.LanguageModel` (`models.Gemma3`, or your own).
    prompts: As for `generate`.
    draft: `NGramDrafter(...)` (no model), or a smaller model with the same
      vocabulary (a `models.LanguageModel`, e.g. a smaller `models.Gemma3`).
    num_draft_tokens: k, tokens drafted per round (static: changing it recompiles).
    constraint: As for `generate`: tables or a spec for all rows, a list with one per
      prompt, or None.
    constraint_ids: As for `generate`.
    constrain_draft: Mask the draft with the constraint too (the paper's recipe:
      higher acceptance). The target is always masked, so outputs are the same in
      distribution either way.
    max_new_tokens: Most tokens to generate per row.
    sampling: Greedy (default), temperature, top-k, top-p.
    seed: Random seed.

  Returns:
    One `Completion` per prompt, and the acceptance statistics.
  """
  if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
    raise ValueError(f"num_draft_tokens {num_draft_tokens!r} is invalid. Expected an int >= 1.")
  _protocol.check_model(model)
  _check_draft(model, draft)
  max_new_tokens = _host.check_request(model, prompts, max_new_tokens, sampling)
  constraint, specs = _host.compile_specs(model, constraint, _host.num_prompts(prompts))
  # pylint: disable=protected-access
  # Room for a round's overshoot: up to k + 1 tokens past the budget, in the token
  # buffer and in the KV caches (prefill sizes the cache from this count).
  room = max_new_tokens + num_draft_tokens + 1
  tables, first, eos_ids = _generate._prepare(model, prompts, constraint, constraint_ids,
                                              room, seed)
  encoded = _host.encode_prompts(model, prompts)  # as `_prepare` encoded them
  prompt_tokens = jnp.asarray(_host.left_pad(encoded, _host.prompt_width(encoded))[0])
  cache_len = prompt_tokens.shape[1] + first.tokens.shape[1]  # as `_prepare` sized it
  is_model = not isinstance(draft, NGramDrafter)
  # Jump-forward does not apply: a constrained draft proposes a forced token, and the
  # masked target accepts it with probability 1.
  static = dataclasses.replace(sampling.static_part(), jump_forward=0)
  temperature, top_p = jnp.float32(sampling.temperature), jnp.float32(sampling.top_p)
  limit = jnp.int32(max_new_tokens)
  draft_network = _protocol.decode_network(draft) if is_model else None
  state = _start(draft.params if is_model else None, tables, first, prompt_tokens, eos_ids,
                 limit, temperature, top_p, draft_network=draft_network,
                 sampling=static, context_len=cache_len, buffer=first.tokens.shape[1])
  state = _speculate(model.params, draft.params if is_model else None, tables, state, limit,
                     eos_ids, temperature, top_p,
                     target_network=_protocol.decode_network(model),
                     drafter=draft_network if is_model else draft, sampling=static,
                     num_draft=num_draft_tokens, constrain_draft=constrain_draft)
  # `first`'s cache was donated to the loop: only the fields read here are replaced.
  completions = _generate._completions(
      model, first.replace(tokens=state.tokens, constraint=state.constraint), max_new_tokens,
      specs)
  # pylint: enable=protected-access
  stats = SpeculativeStats(
      drafted=tuple(int(x) for x in np.asarray(state.drafted)),
      accepted=tuple(int(x) for x in np.asarray(state.accepted)),
      rounds=tuple(int(x) for x in np.asarray(state.rounds)),
      generated=tuple(len(c.token_ids) + c.finished for c in completions))
  return completions, stats

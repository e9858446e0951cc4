"""The exact grammar-conditioned distribution of a finite language, by enumeration.

Grammar-aligned sampling (paper 003, ASAp) targets Q(w) ∝ 1[w ∈ L] · P(w), the model's
distribution conditioned on the constraint, over *token sequences* (every tokenization
of a string is its own outcome, as the decode loop samples them). For a finite language
Q is computable exactly: enumerate every token sequence the compiled tables accept (a
numpy walk over the same `ConstraintTables` the device uses, `_reference.py`), then
score each with the model by teacher forcing. Plain constrained sampling (GCD) draws
from another, exactly computable distribution: the product of the masked and
renormalized next-token distributions along the sequence. Tests and the benchmark
compare empirical samples against both.

Public names:
  accepted_sequences(tables, max_length, limit)  every accepted token sequence (no EOS).
  ExactDistribution    the sequences with log P(w), Q(w), GCD's distribution, exact EFGs.
  exact_distribution(model, prompt, tables, sampling, ...)  scores them (teacher forcing).
  empirical_kl(counts, probs)   KL(empirical || exact) of sample counts, in nats.
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from constrained_decoding.models import _protocol
from constrained_decoding.sampling._methods import SamplingConfig, filter_logits
from constrained_decoding.tables import ConstraintTables
from constrained_decoding.testing import _reference


def _eos_ids(tables: ConstraintTables) -> np.ndarray:
  bits = np.asarray(tables.eos_bits)
  ids = np.nonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))[0]
  return ids[ids < tables.vocab_size]


def accepted_sequences(tables: ConstraintTables, *, max_length: int = 16,
                       limit: int = 100_000) -> list[tuple[int, ...]]:
  """Every token sequence (end of sequence excluded) that `tables` accept, sorted.

  A depth-first walk of (state, stack) pairs from the first constraint's start, with
  `_reference.reference_allowed` and `reference_step_stack`: what the device computes,
  re-derived from the edges.

  Raises:
    ValueError: The language has a sequence longer than `max_length` tokens (it is
      infinite, or larger than asked for), or more than `limit` sequences.
  """
  eos = set(_eos_ids(tables).tolist())
  out: list[tuple[int, ...]] = []

  def walk(state: int, stack: tuple[int, ...], registers, prefix: tuple[int, ...]):
    if _reference.reference_end_allowed(tables, state, stack):
      out.append(prefix)
      if len(out) > limit:
        raise ValueError(f"The constraint accepts more than {limit} token sequences. "
                         f"Expected a small finite language (raise `limit`).")
    tokens = [t for t in np.nonzero(_reference.reference_allowed(
        tables, state, stack, registers=registers))[0] if int(t) not in eos]
    if tokens and len(prefix) >= max_length:
      raise ValueError(f"The constraint accepts sequences longer than {max_length} tokens "
                       f"(after {list(prefix)!r:.80}). Expected a finite language whose "
                       f"sequences fit in max_length.")
    for t in tokens:
      step = _reference.reference_step_stack(tables, state, stack, int(t), registers)
      assert step is not None, (state, stack, t)
      walk(*step, prefix + (int(t),))

  walk(int(np.asarray(tables.start)[0]), (), _reference.zero_registers(tables), ())
  return sorted(out)


@dataclasses.dataclass(frozen=True)
class ExactDistribution:
  """The exact distributions over a finite language's token sequences.

  Attributes:
    sequences: Every accepted token sequence (end of sequence excluded), sorted.
    log_p: log P(w) of each: the model's probability of the tokens then of any end of
      sequence token (temperature and filters of the `SamplingConfig` applied).
    log_gcd: log-probability that plain constrained sampling (mask, renormalize, draw)
      produces each sequence.
    step_log_p: log P(w_i | prompt, w_<i) of each sequence's tokens.
  """

  sequences: tuple[tuple[int, ...], ...]
  log_p: np.ndarray
  log_gcd: np.ndarray
  step_log_p: tuple[np.ndarray, ...]

  @functools.cached_property
  def index(self) -> dict[tuple[int, ...], int]:
    return {w: i for i, w in enumerate(self.sequences)}

  @property
  def log_mass(self) -> float:
    """log P(L): the probability that unconstrained sampling is grammatical, c(root)."""
    return float(np.logaddexp.reduce(self.log_p))

  @property
  def q(self) -> np.ndarray:
    """Q(w) = 1[w ∈ L] P(w) / P(L): the distribution ASAp converges to."""
    return np.exp(self.log_p - self.log_mass)

  @property
  def gcd(self) -> np.ndarray:
    """The distribution plain constrained sampling draws from."""
    return np.exp(self.log_gcd)

  def efg(self, prefix: Sequence[int]) -> float:
    """The exact expected future grammaticality c(prefix) (paper 003, Sec. 2):
    P(some w ∈ L extends prefix | prefix); 0 for a prefix no sequence extends."""
    prefix = tuple(prefix)
    n = len(prefix)
    hits = [i for i, w in enumerate(self.sequences) if w[:n] == prefix]
    if not hits:
      return 0.0
    head = self.step_log_p[hits[0]][:n].sum()
    return float(np.exp(np.logaddexp.reduce(self.log_p[hits]) - head))

  def counts(self, samples: Sequence[Sequence[int]]) -> np.ndarray:
    """How often each sequence occurs in `samples` (token id sequences).

    Raises:
      ValueError: A sample is not in the language.
    """
    out = np.zeros(len(self.sequences), np.int64)
    for s in samples:
      key = tuple(int(t) for t in s)
      if key not in self.index:
        raise ValueError(f"Sample {list(key)!r:.80} is not in the language. Expected "
                         f"only accepted sequences.")
      out[self.index[key]] += 1
    return out


def empirical_kl(counts: np.ndarray, probs: np.ndarray) -> float:
  """KL(empirical || probs) in nats, of sample counts over the same outcomes."""
  counts = np.asarray(counts, np.float64)
  freq = counts / counts.sum()
  seen = freq > 0
  return float(np.sum(freq[seen] * (np.log(freq[seen]) - np.log(probs[seen]))))


@functools.partial(jax.jit, static_argnames=("network", "sampling"))
def _score(params, tokens, positions, logit_positions, targets, allowed_rows, allowed,
           eos_mask, temperature, top_p, *, network, sampling):
  """Teacher forcing of right-padded sequences: per step, (log P(target), log of the
  allowed mass, log of the end-of-sequence mass)."""
  cache = network.init_cache(batch_size=tokens.shape[0], cache_len=tokens.shape[1])
  logits, _ = network.apply(params, tokens, positions, cache, logit_indices=logit_positions)
  logits = filter_logits(logits, sampling, temperature=temperature, top_p=top_p)
  logp = jax.nn.log_softmax(logits, axis=-1)  # [n, L + 1, V]
  width = logp.shape[-1]
  target = jnp.take_along_axis(logp, jnp.maximum(targets, 0)[..., None], axis=-1)[..., 0]
  mask = allowed[allowed_rows]  # [n, L + 1, Vt]
  mask = jnp.pad(mask, ((0, 0), (0, 0), (0, width - mask.shape[-1])))
  neg = jnp.asarray(-jnp.inf, logp.dtype)
  allowed_mass = jax.nn.logsumexp(jnp.where(mask, logp, neg), axis=-1)
  eos = jnp.pad(eos_mask, (0, width - eos_mask.shape[-1]))
  eos_mass = jax.nn.logsumexp(jnp.where(eos[None, None, :], logp, neg), axis=-1)
  return target, allowed_mass, eos_mass


def exact_distribution(model, prompt: str | Sequence[int], tables: ConstraintTables, *,
                       sampling: SamplingConfig = SamplingConfig(temperature=1.0),
                       max_length: int = 16, limit: int = 100_000,
                       batch_size: int = 16) -> ExactDistribution:
  """Enumerates the language of `tables` and scores every sequence with `model`.

  P is the distribution `cd.generate_aligned` samples from: the model's next-token
  distribution after `sampling`'s temperature, top-k and top-p, over the whole logits
  width (tokens the constraint forbids included).

  Args:
    model: A `models.LanguageModel` (`models.Gemma3`, or your own: `docs/models.md`).
    prompt: Text (encoded with BOS, as `generate` does) or token ids used as given.
    tables: The constraint (its first constraint when stacked). Must be finite.
    sampling: Temperature (> 0) and filters defining P.
    max_length, limit: Bounds of the enumeration (`accepted_sequences`).
    batch_size: Sequences per teacher-forcing call.
  """
  if sampling.is_greedy:
    raise ValueError("exact_distribution needs a sampling temperature > 0. Expected "
                     "SamplingConfig(temperature=...) (greedy decoding has no distribution).")
  _protocol.check_model(model)
  network = _protocol.decode_network(model)  # As the loops: padded columns masked.
  ids = model.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
  sequences = accepted_sequences(tables, max_length=max_length, limit=limit)
  # The allowed set after each prefix, one row per distinct (state, stack).
  rows: dict[tuple, int] = {}
  masks: list[np.ndarray] = []
  seq_rows = []
  for w in sequences:
    walk, ok = _reference.reference_walk(tables, w, with_stacks=True)
    assert ok, w
    start = (int(np.asarray(tables.start)[0]), (), _reference.zero_registers(tables))
    keys = [start[:3 if start[2] else 2], *walk]  # Registers only in register tables.
    for key in keys:
      if key not in rows:
        rows[key] = len(masks)
        masks.append(_reference.reference_allowed(tables, *key))
    seq_rows.append([rows[k] for k in keys])
  allowed = jnp.asarray(np.stack(masks))
  eos_mask = np.zeros(tables.vocab_size, bool)
  eos_mask[_eos_ids(tables)] = True
  longest = max(map(len, sequences))
  width = len(ids) + longest
  static = sampling.static_part()
  log_p, log_gcd, steps = [], [], []
  for lo in range(0, len(sequences), batch_size):
    chunk = sequences[lo:lo + batch_size]
    n = len(chunk)
    tokens = np.zeros((batch_size, width), np.int32)
    targets = np.zeros((batch_size, longest + 1), np.int32)
    row_ids = np.zeros((batch_size, longest + 1), np.int32)
    for i, w in enumerate(chunk):
      tokens[i, :len(ids) + len(w)] = ids + list(w)
      targets[i, :len(w)] = w
      row_ids[i, :len(w) + 1] = seq_rows[lo + i]
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
    logit_positions = np.broadcast_to(
        np.arange(len(ids) - 1, len(ids) + longest, dtype=np.int32), targets.shape)
    target, mass, eos = (np.asarray(a, np.float64) for a in _score(
        model.params, jnp.asarray(tokens), jnp.asarray(positions),
        jnp.asarray(logit_positions), jnp.asarray(targets), jnp.asarray(row_ids), allowed,
        jnp.asarray(eos_mask), jnp.float32(sampling.temperature),
        jnp.float32(sampling.top_p), network=network, sampling=static))
    for i, w in enumerate(chunk[:n]):
      k = len(w)
      steps.append(target[i, :k])
      log_p.append(target[i, :k].sum() + eos[i, k])
      log_gcd.append((target[i, :k] - mass[i, :k]).sum() + eos[i, k] - mass[i, k])
  return ExactDistribution(sequences=tuple(sequences), log_p=np.array(log_p),
                           log_gcd=np.array(log_gcd), step_log_p=tuple(steps))

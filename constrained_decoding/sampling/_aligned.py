"""Grammar-aligned sampling (ASAp, paper 003), one jitted round per batch of samples.

Plain constrained sampling (GCD) masks each step's distribution and renormalizes, so it
draws w with probability Π_i P(w_i | w_<i) / P(allowed | w_<i): not the model's
distribution conditioned on the constraint, Q(w) ∝ 1[w ∈ L] P(w). The gap is the
*expected future grammaticality* (EFG) c(prefix) = P(some continuation is in L |
prefix), which GCD approximates by 1 for every viable prefix. ASAp keeps, across
samples, an over-approximation c̃ for every prefix it has sampled (Eq. 3):

  c̃(p) = 1[p viable]                          if no sample went through p
  c̃(p) = Σ_t P(t | p) c̃(p t)                  otherwise

and samples token t after p with probability ∝ P(t | p) c̃(p t) (Eq. 5). c̃ ≥ c
always (Theorem 1), and c̃ → c as samples accumulate, so the samples' distribution
converges to Q.

The store (`AlignedStore`) is a trie of the sampled prefixes in fixed-size device
arrays, carried from round to round and from call to call:

  edge e (append-only, `num_edges` used):  parent node, token, log P(token | parent)
  node n (k < K: the empty prefix of constraint k; e + K: the child of edge e):
    log c̃(n)  and  log R(n), the mass of allowed tokens with no child node (end of
    sequence included: its EFG is exactly 1, so it never needs a node).

With K constraints per call (per-row constraints, `constraint_ids`), each constraint
has its own root, so a prefix is keyed by (constraint id, tokens): the same tokens under
two constraints are two nodes, and a row only ever reads and updates the trie of its own
constraint (a prefix's EFG under one constraint says nothing about another).

So c̃(n) = R(n) + Σ_{children e of n} P(e) c̃(e + K): a sum of positive terms only, kept
in log space. R(n) is recomputed from the full next-token distribution whenever a
sample passes through n (allowed tokens minus the children that exist or that this
round's samples create), never by subtracting from an earlier value: the subtractive
form 1 - Σ P(t) (1 - c̃) loses every digit when c(n) is around 1e-9.

One round (`_round`, one `jax.jit`, no host callback):
  1. decode, in one `lax.while_loop`: each row at a stored node gathers the c̃ of the
     node's children (a scan of the edge table: O(capacity) per row and step),
     samples from P · c̃ masked by the constraint, and records log P(token) and R;
  2. insert the round's new prefixes, deepest last (rows sharing a constraint and a
     prefix share its node: token histories are compared, all rows advance in lockstep);
  3. recompute c̃ backward along every row's path, deepest first (Eq. 3).
With `batch_size` b > 1 the b rows of a round all sample with the store as it was at the
round's start; the update then includes all b paths (and R excludes every sibling the
round created, so it stays exact). Convergence per *sample* is therefore somewhat slower
than at b = 1 (a round cannot learn from its own rows), in exchange for b samples per
model call.

When the store is full, new prefixes are not stored: their EFG stays the mask's 1
(still an over-approximation, Theorem 1 holds) and below them sampling is plain
constrained sampling; the parent's R keeps the token's mass. `num_dropped` counts such
refused insertions.

Grammars with a lexer (`LexedTables`) work as any constraint does (the loop steps the
constraint through the runtime's dispatch); several stack only with each other
(`UnsupportedFeatureError` for a list that mixes them with other constraints).

Not supported: jump-forward (tokens are sampled one at a time so that every prefix gets
its node), speculative decoding, and several prompts per call (a store belongs to one
prompt, one list of constraints and one sampling distribution).

Public names:
  generate_aligned(model, prompt, *, constraint, num_samples, ...) -> (samples, store)
  AlignedStore      the EFG store (host handle around device arrays).
  StoreArrays       its device arrays (a pytree).
  init_store(capacity, num_constraints)  an empty `StoreArrays`.
"""

import dataclasses
import functools
import hashlib
import math
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from constrained_decoding import runtime
from constrained_decoding.errors import DecodingArgumentError, StoreMismatchError
from constrained_decoding.models import _protocol
from constrained_decoding.sampling import _generate
from constrained_decoding.sampling import _host
from constrained_decoding.sampling import _loop
from constrained_decoding.sampling._methods import SamplingConfig, filter_logits
from constrained_decoding._stacking import stack_tables
from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.tables import DEFAULT_MIN_BUCKET, ConstraintTables

# Edges of a store made by `generate_aligned` without one: 20 bytes each (1.3 MB).
DEFAULT_CAPACITY = 1 << 16
# Most rows per round: the round compares every pair of rows ([B, B] per step).
MAX_BATCH_SIZE = 1024
_NEG_INF = -jnp.inf


@flax.struct.dataclass(kw_only=True)
class StoreArrays:
  """The device arrays of an `AlignedStore` (see the module docstring for the trie).

  Attributes:
    edge_parent: Node of each edge's parent prefix; -1 for a free slot.
    edge_token: The token the edge appends.
    edge_log_prob: log P(token | parent prefix) under the sampling distribution.
    node_log_efg: log c̃ of each node (k < K: the empty prefix of constraint k, e + K:
      the child of edge e; K = len(node_log_efg) - len(edge_parent)).
    node_log_rest: log of the allowed mass of each node's tokens without a child node.
    num_edges: Edges in use (slots are filled in order).
    num_dropped: Insertions refused because the store was full.
    num_samples: Samples absorbed so far.
    num_rounds: Rounds run so far (each round's random key depends on it).
  """

  edge_parent: Int[Array, "C"]
  edge_token: Int[Array, "C"]
  edge_log_prob: Float[Array, "C"]
  node_log_efg: Float[Array, "nodes"]
  node_log_rest: Float[Array, "nodes"]
  num_edges: Int[Array, ""]
  num_dropped: Int[Array, ""]
  num_samples: Int[Array, ""]
  num_rounds: Int[Array, ""]


def init_store(capacity: int, num_constraints: int = 1) -> StoreArrays:
  """An empty store of `capacity` edges: only the empty prefix of each of
  `num_constraints` constraints (root nodes 0 .. K - 1), with c̃ = 1."""
  return StoreArrays(
      edge_parent=jnp.full(capacity, -1, jnp.int32),
      edge_token=jnp.zeros(capacity, jnp.int32),
      edge_log_prob=jnp.zeros(capacity, jnp.float32),
      node_log_efg=jnp.zeros(capacity + num_constraints, jnp.float32),
      node_log_rest=jnp.zeros(capacity + num_constraints, jnp.float32),
      num_edges=jnp.zeros((), jnp.int32),
      num_dropped=jnp.zeros((), jnp.int32),
      num_samples=jnp.zeros((), jnp.int32),
      num_rounds=jnp.zeros((), jnp.int32))


def _num_roots(store: StoreArrays) -> int:
  """K, the number of constraints (root nodes) of a store: static, from the shapes."""
  return store.node_log_efg.shape[0] - store.edge_parent.shape[0]


@dataclasses.dataclass(frozen=True, eq=False)
class AlignedStore:
  """EFG estimates of one (prompt, constraints, sampling distribution), carried across
  calls of `generate_aligned`: one trie of prefixes per constraint.

  ```python
  samples, store = cd.generate_aligned(model, prompt, constraint=spec, num_samples=100)
  more, store = cd.generate_aligned(model, prompt, constraint=spec, num_samples=100,
                                    store=store)   # continues where the first call ended
  ```

  Memory: 20 bytes per edge (`capacity` edges, fixed when the store is created, shared
  by the constraints), one edge per distinct (constraint, sampled prefix). Each decoding step scans the edge table once per
  row, so a capacity far above the number of distinct prefixes costs time too.

  Attributes:
    arrays: The device arrays (`StoreArrays`).
    key: What the estimates are for: the prompt's token ids, a fingerprint of each
      constraint's tables and the sampling distribution (temperature, top-k, top-p).
  """

  arrays: StoreArrays
  key: tuple

  @property
  def capacity(self) -> int:
    return int(self.arrays.edge_parent.shape[0])

  @property
  def num_constraints(self) -> int:
    """K: the constraints whose prefixes the store keeps apart (one trie each)."""
    return _num_roots(self.arrays)

  @property
  def num_nodes(self) -> int:
    """Stored prefixes, the empty one of every constraint included."""
    return int(self.arrays.num_edges) + self.num_constraints

  @property
  def num_samples(self) -> int:
    return int(self.arrays.num_samples)

  @property
  def num_dropped(self) -> int:
    """Insertions refused because the store was full (0 while it never was)."""
    return int(self.arrays.num_dropped)

  @property
  def is_full(self) -> bool:
    return int(self.arrays.num_edges) >= self.capacity

  @property
  def nbytes(self) -> int:
    return sum(int(np.asarray(a).nbytes) for a in jax.tree.leaves(self.arrays))

  @property
  def log_mass_bound(self) -> float:
    """log c̃ of the empty prefix (of constraint 0): an upper bound on log P(L), the
    log-probability that unconstrained sampling produces an accepted sequence (tight in
    the limit). `log_mass_bounds` has one per constraint."""
    return float(self.arrays.node_log_efg[0])

  @property
  def log_mass_bounds(self) -> list[float]:
    """`log_mass_bound` of each constraint, in constraint id order."""
    return [float(x) for x in np.asarray(self.arrays.node_log_efg[:self.num_constraints])]

  def _check_constraint(self, constraint: int) -> int:
    if (not isinstance(constraint, (int, np.integer)) or isinstance(constraint, bool)
        or not 0 <= constraint < self.num_constraints):
      raise DecodingArgumentError(
          f"constraint {constraint!r} names no constraint of this store. Expected an int "
          f"in [0, {self.num_constraints}).")
    return int(constraint)

  def efg(self, prefix: Sequence[int], constraint: int = 0) -> float | None:
    """c̃ of a token prefix (not end of sequence) under constraint id `constraint`, or
    None if it is not stored."""
    parent = np.asarray(self.arrays.edge_parent)
    token = np.asarray(self.arrays.edge_token)
    node = self._check_constraint(constraint)
    for t in prefix:
      hit = np.nonzero((parent == node) & (token == int(t)))[0]
      if not len(hit):
        return None
      node = int(hit[0]) + self.num_constraints
    return float(np.exp(np.asarray(self.arrays.node_log_efg)[node]))

  def prefixes(self, constraint: int = 0) -> dict[tuple[int, ...], float]:
    """Every stored prefix of constraint id `constraint` with its c̃ (host-side, for
    tests and inspection)."""
    constraint = self._check_constraint(constraint)
    return {path: efg for (k, path), efg in self._all_prefixes().items() if k == constraint}

  def _all_prefixes(self) -> dict[tuple[int, tuple[int, ...]], float]:
    """{(constraint id, prefix): c̃} of every stored node."""
    roots = self.num_constraints
    parent = np.asarray(self.arrays.edge_parent)
    token = np.asarray(self.arrays.edge_token)
    efg = np.exp(np.asarray(self.arrays.node_log_efg, np.float64))
    paths = {k: (k, ()) for k in range(roots)}
    for e in range(int(self.arrays.num_edges)):  # parents come before their children
      k, path = paths[int(parent[e])]
      paths[e + roots] = (k, path + (int(token[e]),))
    return {key: float(efg[node]) for node, key in paths.items()}


@flax.struct.dataclass(kw_only=True)
class _LoopState:
  """Carry of the aligned decode loop.

  Attributes:
    decode: The plain decode carry (model cache, constraint, tokens).
    node: Stored node of each row's prefix, or -1 once the prefix is not stored.
    same: Rows b, b' have the same prefix (same tokens so far, both still running).
    log_prob: log P(token) of each row's token at each step.
    log_rest: log R of each row's prefix at each step (allowed mass without a node,
      counting the round's own new children as nodes).
  """

  decode: _loop.DecodeState
  node: Int[Array, "B"]
  same: Bool[Array, "B B"]
  log_prob: Float[Array, "B N"]
  log_rest: Float[Array, "B N"]


def _children(store: StoreArrays, node: Int[Array, "B"], width: int):
  """Per row, the c̃ of its node's children scattered over the vocabulary.

  Returns:
    (hit [B, C]: edge e is a child of the row's node; log c̃ [B, V] of each child
    token, +1 where the token has no child node).
  """
  batch = node.shape[0]
  hit = (store.edge_parent[None, :] == node[:, None]) & (node >= 0)[:, None]
  column = jnp.where(hit, store.edge_token[None, :], width)
  values = jnp.broadcast_to(store.node_log_efg[_num_roots(store):][None, :], hit.shape)
  rows = jnp.broadcast_to(jnp.arange(batch)[:, None], hit.shape)
  efg = jnp.ones((batch, width), jnp.float32).at[rows, column].set(values, mode="drop")
  return hit, efg


def _aligned_step(params, tables, store: StoreArrays, s: _LoopState, *, eos_ids,
                  temperature, top_p, network, sampling) -> _LoopState:
  """One token per row from P · c̃ (Eq. 5), masked; records log P(token) and R."""
  d = s.decode
  batch = d.logits.shape[0]
  rows = jnp.arange(batch)
  pad = eos_ids[0]
  logp = jax.nn.log_softmax(filter_logits(d.logits, sampling, temperature=temperature,
                                          top_p=top_p), axis=-1)
  width = logp.shape[-1]
  allowed = runtime.allowed_tokens(tables, d.constraint)
  allowed = jnp.pad(allowed, ((0, 0), (0, width - allowed.shape[-1])))[:, :width]
  hit, child_efg = _children(store, s.node, width)
  has_child = child_efg <= 0
  weight = jnp.where(allowed, logp + jnp.where(has_child, child_efg, 0.0), _NEG_INF)
  rng, key = jax.random.split(d.rng)
  token = jax.random.categorical(key, weight, axis=-1).astype(jnp.int32)
  token = runtime.allowed_or_lowest(tables, d.constraint, token)
  running = ~d.done
  token = jnp.where(running, token, pad)
  ends = _loop.is_eos(token, eos_ids)
  # R: allowed mass minus stored children minus the children this round creates (the
  # non-final tokens of rows at the same prefix). Ends never get a node.
  grows = running & ~ends
  sibling = jnp.where(s.same & grows[None, :], token[None, :], width)
  excluded = has_child.at[jnp.broadcast_to(rows[:, None], sibling.shape), sibling].set(
      True, mode="drop")
  rest = jax.nn.logsumexp(jnp.where(allowed & ~excluded, logp, _NEG_INF), axis=-1)
  token_log_prob = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
  match = hit & (store.edge_token[None, :] == token[:, None])
  node = jnp.where(match.any(axis=1) & grows, jnp.argmax(match, axis=1) + _num_roots(store),
                   -1)
  same = s.same & (token[:, None] == token[None, :]) & grows[:, None] & grows[None, :]

  constraint = runtime.advance(tables, d.constraint, token)
  done = d.done | ends | constraint.error
  positions = (d.prompt_lengths + d.step)[:, None]
  next_logits, cache = network.apply(params, token[:, None], positions, d.cache)
  decode = d.replace(
      step=d.step + 1, lengths=d.lengths + running.astype(jnp.int32), calls=d.calls + 1,
      tokens=d.tokens.at[:, d.step].set(token), logits=next_logits[:, 0], cache=cache,
      constraint=constraint, done=done, rng=rng)
  return _LoopState(decode=decode, node=node, same=same,
                    log_prob=s.log_prob.at[:, d.step].set(token_log_prob),
                    log_rest=s.log_rest.at[:, d.step].set(rest))


def _insert(store: StoreArrays, s: _LoopState, root: Int[Array, "B"], eos_ids):
  """Adds the round's new prefixes (step 2); returns (store, node of each row's prefix
  at each step, -1 where not stored). `root`: each row's root node (its constraint)."""
  d = s.decode
  batch, buffer = d.tokens.shape
  capacity = store.edge_parent.shape[0]
  roots = _num_roots(store)
  rows = jnp.arange(batch)
  kept = d.lengths > 0
  longest = jnp.max(d.lengths)

  def body(c):
    k, store, node, same, path = c
    took = k < d.lengths
    token = d.tokens[:, k]
    grows = took & ~_loop.is_eos(token, eos_ids)
    same_next = same & (token[:, None] == token[None, :]) & grows[:, None] & grows[None, :]
    stored = grows & (node >= 0)
    match = ((store.edge_parent[None, :] == node[:, None])
             & (store.edge_token[None, :] == token[:, None]))
    found = match.any(axis=1) & stored
    need = stored & ~found
    leader = jnp.argmax(same_next, axis=1)  # lowest row sharing the new prefix
    new = need & (leader == rows)
    slot = store.num_edges + jnp.cumsum(new) - 1
    ok = new & (slot < capacity)
    failed = new & ~ok
    index = jnp.where(ok, slot, capacity)  # out of range: dropped
    made = jnp.where(ok, slot + roots, -1)
    child = jnp.where(found, jnp.argmax(match, axis=1) + roots,
                      jnp.where(need, made[leader], -1))
    # R of the parent: a child that could not be stored keeps its mass there.
    back = jax.nn.logsumexp(jnp.where(same & failed[None, :], s.log_prob[None, :, k],
                                      _NEG_INF), axis=1)
    rest = jnp.logaddexp(s.log_rest[:, k], back)
    at_node = jnp.where(took & (node >= 0), node, capacity + roots)  # else dropped
    store = store.replace(
        edge_parent=store.edge_parent.at[index].set(node, mode="drop"),
        edge_token=store.edge_token.at[index].set(token, mode="drop"),
        edge_log_prob=store.edge_log_prob.at[index].set(s.log_prob[:, k], mode="drop"),
        node_log_efg=store.node_log_efg.at[index + roots].set(0.0, mode="drop"),
        node_log_rest=store.node_log_rest.at[index + roots].set(0.0, mode="drop")
        .at[at_node].set(rest, mode="drop"),
        num_edges=store.num_edges + ok.sum(dtype=jnp.int32),
        num_dropped=store.num_dropped + failed.sum(dtype=jnp.int32))
    path = path.at[:, k].set(jnp.where(took, node, -1))
    return k + 1, store, jnp.where(grows, child, -1), same_next, path

  start = (jnp.int32(0), store, jnp.where(kept, root, -1).astype(jnp.int32),
           kept[:, None] & kept[None, :] & (root[:, None] == root[None, :]),
           jnp.full((batch, buffer), -1, jnp.int32))
  _, store, _, _, path = jax.lax.while_loop(lambda c: c[0] < longest, body, start)
  return store, path


def _backward(store: StoreArrays, path: Int[Array, "B N"], lengths: Int[Array, "B"]):
  """Eq. 3 along every row's path, deepest prefix first (step 3)."""
  capacity = store.edge_parent.shape[0]
  roots = _num_roots(store)

  def body(c):
    k, store = c
    k = k - 1
    node = path[:, k]
    valid = (k < lengths) & (node >= 0)
    hit = (store.edge_parent[None, :] == node[:, None]) & valid[:, None]
    terms = jnp.where(hit, store.edge_log_prob[None, :]
                      + store.node_log_efg[roots:][None, :], _NEG_INF)
    value = jnp.logaddexp(store.node_log_rest[jnp.maximum(node, 0)],
                          jax.nn.logsumexp(terms, axis=1))
    value = jnp.minimum(value, 0.0)  # c̃ <= 1; rounding may overshoot
    index = jnp.where(valid, node, capacity + roots)
    return k, store.replace(node_log_efg=store.node_log_efg.at[index].set(value, mode="drop"))

  _, store = jax.lax.while_loop(lambda c: c[0] > 0, body, (jnp.max(lengths), store))
  return store


@functools.partial(jax.jit, static_argnames=("network", "sampling"))
def _round(params, tables, init: _loop.DecodeState, store: StoreArrays, limit, eos_ids,
           temperature, top_p, num_rows, rng, constraint_ids=None, *, network, sampling):
  """One round: decode `num_rows` rows with the store, then update it (Eq. 3).

  `constraint_ids` [B] (None: all 0): the stacked constraint each row follows; row b
  starts at root node `constraint_ids[b]` of the store, so each constraint has its own
  trie. Returns (store, final decode state). Rows past `num_rows` stay done and are
  ignored.
  """
  batch, buffer = init.tokens.shape
  kept = jnp.arange(batch) < num_rows
  if constraint_ids is None:
    root = jnp.zeros(batch, jnp.int32)
  else:
    root = constraint_ids.astype(jnp.int32)
    init = init.replace(constraint=_loop.init_constraint(tables, root))
  start = _LoopState(
      decode=init.replace(done=~kept, rng=rng),
      node=jnp.where(kept, root, -1).astype(jnp.int32),
      same=kept[:, None] & kept[None, :] & (root[:, None] == root[None, :]),
      log_prob=jnp.zeros((batch, buffer), jnp.float32),
      log_rest=jnp.zeros((batch, buffer), jnp.float32))

  def cond_fn(s: _LoopState):
    # Continue while some row is still producing and the token budget is not spent.
    return (s.decode.step < limit) & ~s.decode.done.all()

  body_fn = functools.partial(_aligned_step, params, tables, store, eos_ids=eos_ids,
                              temperature=temperature, top_p=top_p, network=network,
                              sampling=sampling)
  s = jax.lax.while_loop(cond_fn, body_fn, start)
  store, path = _insert(store, s, root, eos_ids)
  store = _backward(store, path, s.decode.lengths)
  store = store.replace(num_samples=store.num_samples + num_rows.astype(jnp.int32),
                        num_rounds=store.num_rounds + 1)
  return store, s.decode


def _fingerprint(tables: ConstraintTables | LexedTables) -> str:
  """A content hash of the tables (arrays and static fields)."""
  static = (tables.vocab_size, tables.stack_depth)
  if isinstance(tables, LexedTables):  # Its arrays do not fix the indentation stack's size.
    static += ("lexed", tables.indent_depth)
  digest = hashlib.sha256(repr(static).encode())
  for leaf in jax.tree.leaves(tables):
    array = np.asarray(leaf)
    digest.update(repr((array.dtype.str, array.shape)).encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()[:16]


def _check_count(name: str, value, high: int | None = None) -> int:
  if (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1
      or (high is not None and value > high)):
    bound = "an int >= 1" if high is None else f"an int in [1, {high}]"
    raise DecodingArgumentError(f"{name} {value!r} is not a count. Expected {bound}.")
  return int(value)


def _check_sampling(sampling) -> SamplingConfig:
  sampling = _host.check_sampling(sampling)
  if sampling.is_greedy:
    raise DecodingArgumentError(
        "generate_aligned got a greedy SamplingConfig (temperature 0). Expected a "
        "temperature > 0: aligned sampling draws from the model's distribution, e.g. "
        "cd.SamplingConfig(temperature=1.0).")
  if sampling.jump_forward:
    raise DecodingArgumentError(
        f"generate_aligned got jump_forward={sampling.jump_forward}, which it does not "
        f"support (every sampled prefix needs its own node). Expected jump_forward=0.")
  return sampling


def _constraint_tables(model, constraint):
  """(tables, K, the spec of each constraint or None, a fingerprint per constraint).

  One spec or tables (K = 1, or K stacked tables), or a list of K of them (stacked
  here). A list of one gives the same fingerprints as its element alone.
  """
  def one(c, what):
    tables, _ = _host.compile_specs(model, c, 1)
    if not isinstance(tables, (ConstraintTables, LexedTables)):
      raise DecodingArgumentError(f"{what} is a {type(tables).__name__}. Expected "
                                  f"ConstraintTables, LexedTables or a spec (cd.Regex, "
                                  f"cd.Grammar, ...).")
    return tables

  if constraint is None:
    raise DecodingArgumentError(
        "constraint is None. Expected a ConstraintTables or spec, or a list of them (one per "
        "constraint id): aligned sampling needs a constraint.")
  if isinstance(constraint, (list, tuple)):
    if not constraint:
      raise DecodingArgumentError("constraint is an empty list. Expected one or more "
                                  "ConstraintTables or specs.")
    parts = [one(c, f"constraint[{k}]") for k, c in enumerate(constraint)]
    for k, t in enumerate(parts):
      if t.num_constraints != 1:
        raise DecodingArgumentError(
            f"constraint[{k}] stacks {t.num_constraints} constraints. Expected one per "
            f"list element (or pass the stacked tables alone, with constraint_ids).")
    fingerprints = tuple(_fingerprint(t) for t in parts)
    tables = parts[0] if len(parts) == 1 else stack_tables(parts, min_bucket=DEFAULT_MIN_BUCKET)
    specs = [c if _host.is_spec(c) else None for c in constraint]
    return tables, len(parts), specs, fingerprints
  tables = one(constraint, "constraint")
  k = tables.num_constraints
  spec = constraint if _host.is_spec(constraint) else None
  fingerprint = _fingerprint(tables)
  return tables, k, [spec] * k, (fingerprint,) if k == 1 else (f"{fingerprint}/{k}",) * k


def generate_aligned(
    model,
    prompt: str | Sequence[Any],
    *,
    constraint: Any,
    num_samples: int,
    constraint_ids: Sequence[int] | None = None,
    batch_size: int = 1,
    seed: int = 0,
    store: AlignedStore | None = None,
    sampling: SamplingConfig = SamplingConfig(temperature=1.0),
    max_new_tokens: int = 64,
    capacity: int = DEFAULT_CAPACITY,
) -> tuple[list[_host.Completion], AlignedStore]:
  """Draws `num_samples` completions of one prompt with grammar-aligned sampling (ASAp).

  Each completion follows the constraint, like `generate`'s; in addition, as samples
  accumulate, their distribution converges to the model's distribution *conditioned on*
  the constraint, Q(w) ∝ 1[w ∈ L] P(w), which plain constrained sampling does not (see
  the module docstring). Use it when many samples of one prompt are drawn (pass@k,
  self-consistency, synthetic data) and their distribution matters; for one sample, or
  when the constraint rarely cuts off likely continuations, `generate` is cheaper and
  as good.

  ```python
  spec = cd.Regex(r"00000|1[01]{4}")
  samples, store = cd.generate_aligned(model, prompt, constraint=spec, num_samples=500,
                                       batch_size=8, sampling=cd.SamplingConfig(temperature=1.0))
  # Per-row constraints: sample i follows constraint i % 2 (or constraint_ids[i]).
  both, store2 = cd.generate_aligned(model, prompt, constraint=[spec, cd.Regex("[01]{3}")],
                                     num_samples=500, batch_size=8)
  ```

  Args:
    model: A `models.LanguageModel` (`models.Gemma3`, or your own: docs/models.md).
    prompt: One prompt: text (BOS is prepended) or a list of token ids used as given.
    constraint: Tables or a spec, regular or push-down, or a grammar with a lexer
      (`LexedTables`, stacked only with other such tables); or K of them, as a list
      (stacked here) or stacked tables, with `constraint_ids` saying which one each sample
      follows. The store keeps one trie per constraint (root node k for constraint k),
      so the estimates of one constraint are never read or written for another, while
      rows of different constraints share the rounds.
    num_samples: Completions to draw.
    constraint_ids: With K constraints, the constraint id of each sample (num_samples
      ints in [0, K)); None: sample i follows constraint i % K.
    batch_size: Rows per round: all rows of a round sample with the store of the
      round's start, then all update it (faster per sample, slower to converge).
    seed: Random seed. Round r of the store's life uses key `fold_in(seed, r)`, so two
      calls of n samples passing the store on draw what one call of 2n draws (with
      `batch_size` dividing n and the same constraint ids).
    store: The store of an earlier call with the same prompt, constraints (same order)
      and sampling distribution, to continue from; None starts an empty one.
    sampling: Temperature (> 0), top-k, top-p: they define P (applied to the model's
      logits before the constraint). No jump-forward.
    max_new_tokens: Most tokens per completion (the end-of-sequence token counts). A
      row cut at this budget leaves its last prefix at c̃ = 1.
    capacity: Edges of a new store, shared by its constraints (ignored when `store` is
      given).

  Returns:
    (the `Completion`s in the order they were drawn, the updated store).

  Raises:
    DecodingArgumentError: Bad prompt, counts, sampling (greedy, jump-forward),
      constraint (None, an empty list) or constraint_ids.
    StoreMismatchError: `store` was built for another prompt, constraint or sampling.
    UnsupportedFeatureError: A list that holds a grammar with a lexer (`LexedTables`)
      beside other kinds of constraints: such tables stack only with each other.
    VocabularyMismatchError: Tables for a vocabulary wider than the model's logits.
  """
  if isinstance(prompt, (list, tuple, np.ndarray)) and len(prompt) and not isinstance(
      prompt[0], (int, np.integer)):
    raise DecodingArgumentError(f"prompt {prompt!r:.80} is a list of prompts. Expected one "
                                f"prompt (text or token ids): a store belongs to one prompt.")
  max_new_tokens = _host.check_request(model, [prompt], max_new_tokens, sampling)
  sampling = _check_sampling(sampling)
  num_samples = _check_count("num_samples", num_samples)
  batch_size = _check_count("batch_size", batch_size, MAX_BATCH_SIZE)
  tables, num_constraints, specs, fingerprints = _constraint_tables(model, constraint)
  if constraint_ids is None:
    sample_ids = np.arange(num_samples, dtype=np.int32) % num_constraints
  else:
    sample_ids = _host.check_constraint_ids(constraint_ids, num_samples, num_constraints)
  ids = tuple(_host.encode_prompts(model, [prompt])[0])
  key = (ids, fingerprints, float(sampling.temperature), int(sampling.top_k),
         float(sampling.top_p))
  if store is None:
    capacity = _check_count("capacity", capacity)
    store = AlignedStore(arrays=init_store(capacity, num_constraints), key=key)
  elif not isinstance(store, AlignedStore):
    raise DecodingArgumentError(f"store is a {type(store).__name__}. Expected None or the "
                                f"AlignedStore returned by an earlier generate_aligned call.")
  elif store.key != key:
    what = [name for name, a, b in zip(("prompt", "constraint", "temperature", "top_k",
                                        "top_p"), store.key, key) if a != b]
    raise StoreMismatchError(
        f"store was built for another {', '.join(what)}. Expected the store of a call "
        f"with the same prompt, constraints (same order) and sampling distribution (its "
        f"estimates are probabilities under them); pass store=None to start a new one.")
  tables, init, eos_ids = _generate._prepare(model, [list(ids)] * batch_size, tables, None,  # pylint: disable=protected-access
                                             max_new_tokens, seed)
  arrays = store.arrays
  first_round = int(arrays.num_rounds)
  base = jax.random.PRNGKey(seed)
  samples: list[_host.Completion] = []
  for r in range(math.ceil(num_samples / batch_size)):
    rows = min(batch_size, num_samples - len(samples))
    row_ids = np.zeros(batch_size, np.int32)
    row_ids[:rows] = sample_ids[len(samples):len(samples) + rows]
    arrays, state = _round(
        model.params, tables, init, arrays, jnp.int32(max_new_tokens), eos_ids,
        jnp.float32(sampling.temperature), jnp.float32(sampling.top_p), jnp.int32(rows),
        jax.random.fold_in(base, first_round + r), jnp.asarray(row_ids),
        network=_protocol.decode_network(model), sampling=sampling.static_part())
    row_specs = [specs[k] for k in row_ids]
    samples += _generate._completions(model, state, max_new_tokens, row_specs)[:rows]  # pylint: disable=protected-access
  return samples, AlignedStore(arrays=arrays, key=key)

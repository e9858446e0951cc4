"""Pack token automata into `ConstraintTables`, the host -> device contract.

Host-only (numpy). The device side (`runtime/`) registers `ConstraintTables` as a JAX
pytree, so tables built here can be passed straight into jitted functions.

Layout (S states, K edges per state, M distinct masks, W = ceil(V / 32) words, C
constraints stacked):

  start         int32  [C]     start state of each stacked constraint
  accepting     bool   [S]     end of sequence allowed here
  mask_bits     uint32 [M, W]  deduplicated allowed-token sets; token t is bit t % 32 of
                               word t // 32 (end-of-sequence ids included where accepting)
  state_mask    int32  [S]     row of `mask_bits` holding each state's allowed set
  edge_start    int32  [S + 1] explicit edges of state s are edge_start[s]:edge_start[s+1]
  edge_tokens   int32  [E]     explicit edges, sorted by (state, token), padded at the end
                               with PAD_TOKEN (int32 max) so binary search stays valid
  edge_targets  int32  [E]     target state of each edge, padded with NO_STATE (-1)
  eos_bits      uint32 [W]     the end-of-sequence ids as a bitmask
  terminal_bits uint32 [T, W]  token bitmaps of terminal edges (wide states, Sec. 2.5.1)
  state_terminals int32 [S, R, 2]  (terminal id, target) per state in precedence order,
                               -1 padded; consulted only when no explicit edge matches

S, E and M are padded to the next power of two (at least `min_bucket`) so that
constraints of similar size share one compiled executable. Edges are one flat CSR
array rather than a [S, K] matrix padded to the widest state, so one state with 100k
explicit edges costs 100k entries, not 100k per state. Padding states are dead: not
accepting, no edges, never the target of an edge.

Public names:
  ConstraintTables             the packed arrays (+ static `vocab_size`).
  pack_tables(token_dfa, vocab) TokenDfa -> ConstraintTables.
  stack_tables(tables_list)    several constraints in one table set (states offset).
  tables_nbytes(tables)        size report in bytes, per array and in total.
  estimate_nbytes(token_dfa, vocab)  an upper bound, checked before packing.
  bucket_size(n, min_bucket)   the padding rule.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

PAD_TOKEN = np.iinfo(np.int32).max
NO_STATE = -1
DEFAULT_MIN_BUCKET = 8

_ARRAY_FIELDS = ("start", "accepting", "mask_bits", "state_mask", "edge_start",
                 "edge_tokens", "edge_targets", "eos_bits", "terminal_bits", "state_terminals")


@dataclasses.dataclass(frozen=True, eq=False)
class ConstraintTables:
  """Token-level automaton for one or more constraints, packed for the device.

  ```python
  tables = cd.Compiler(vocab).compile(cd.Regex(r"\\d{3}"))
  state = cd.init_state(tables, batch_size=2)
  ```

  Attributes:
    start: Start state of each stacked constraint (`[C]`).
    accepting: Whether an end-of-sequence token is allowed in each state (`[S]`).
    mask_bits: Deduplicated allowed-token sets (`[M, W]`); token t is word t // 32,
      bit t % 32.
    state_mask: Row of `mask_bits` holding each state's allowed set (`[S]`).
    edge_start: Where each state's explicit edges begin in `edge_tokens` (`[S + 1]`).
    edge_tokens: Explicit edges sorted by (state, token), padded with PAD_TOKEN (`[E]`).
    edge_targets: Target state of each edge in `edge_tokens`, padded with -1 (`[E]`).
    eos_bits: The end-of-sequence token ids as a bitmask (`[W]`).
    terminal_bits: Token bitmaps of terminal edges (`[T, W]`).
    state_terminals: (terminal id, target state) of each state's terminal edges, in
      precedence order, -1 padded (`[S, R, 2]`). Explicit edges take precedence.
    vocab_size: Width of the model's logits. Static: it fixes shapes.
  """

  # numpy arrays on the host, jax arrays (or tracers) on the device: hence `Any`.
  start: Any
  accepting: Any
  mask_bits: Any
  state_mask: Any
  edge_start: Any
  edge_tokens: Any
  edge_targets: Any
  eos_bits: Any
  terminal_bits: Any
  state_terminals: Any
  vocab_size: int

  @property
  def num_constraints(self) -> int:
    return int(self.start.shape[0])

  @property
  def shape_key(self) -> tuple[int, ...]:
    """(C, S, E, M, W, T, R): tables with equal keys share one compiled step function."""
    return (self.start.shape[0], self.accepting.shape[0], self.edge_tokens.shape[0],
            *self.mask_bits.shape, self.terminal_bits.shape[0], self.state_terminals.shape[1])

  def __repr__(self) -> str:
    c, s, e, m, _, t, _ = self.shape_key
    return (f"ConstraintTables(constraints={c}, states={s}, edges={e}, "
            f"masks={m}, terminals={t}, vocab_size={self.vocab_size}, "
            f"nbytes={tables_nbytes(self)['total']})")


def bucket_size(n: int, min_bucket: int = DEFAULT_MIN_BUCKET) -> int:
  """The padded size for `n` items: the next power of two, at least `min_bucket`."""
  size = max(int(min_bucket), 1)
  while size < n:
    size *= 2
  return size


def num_words(vocab_size: int) -> int:
  return -(-vocab_size // 32)


def bitmask(token_ids: np.ndarray, vocab_size: int) -> np.ndarray:
  """uint32 `[W]` bitmask with the bits of `token_ids` set."""
  bits = np.zeros(num_words(vocab_size), np.uint32)
  token_ids = np.asarray(token_ids, np.int64)
  np.bitwise_or.at(bits, token_ids >> 5, (np.uint32(1) << (token_ids & 31).astype(np.uint32)))
  return bits


def estimate_nbytes(token_dfa, vocab, *, min_bucket: int = DEFAULT_MIN_BUCKET) -> int:
  """Upper bound on the bytes `pack_tables` would use (masks counted one per state)."""
  s_pad = bucket_size(token_dfa.num_states, min_bucket)
  e_pad = bucket_size(len(token_dfa.edge_token), min_bucket)
  m_pad = bucket_size(token_dfa.num_states, min_bucket)
  t_pad = bucket_size(token_dfa.terminal_bits.shape[0], 1)
  return (e_pad * 8 + (m_pad + t_pad) * num_words(vocab.vocab_size) * 4 + s_pad * 17)


def pack_tables(token_dfa, vocab, *, min_bucket: int = DEFAULT_MIN_BUCKET) -> ConstraintTables:
  """Packs a `TokenDfa` (start state 0, edges sorted by (source, token)).

  Args:
    token_dfa: A trimmed token DFA from `automata.compose_token_dfa`, non-empty.
    vocab: The `Vocabulary` it was built for (end-of-sequence ids and logits width).
    min_bucket: Smallest padded size of S, K and M.
  """
  s = token_dfa.num_states
  src, tok, dst = token_dfa.edge_source, token_dfa.edge_token, token_dfa.edge_target
  eos = np.asarray(vocab.eos_ids, np.int64)
  w = num_words(vocab.vocab_size)
  counts = np.bincount(src, minlength=s)
  offsets = np.zeros(s + 1, np.int64)
  np.cumsum(counts, out=offsets[1:])
  # Deduplicate allowed sets: one mask row per distinct (accepting, tokens) pair.
  row_of_state = np.zeros(s, np.int32)
  rows: dict[bytes, int] = {}
  is_representative = np.zeros(s, bool)
  tok_bytes = tok.tobytes()
  accepting_list = token_dfa.accepting.tolist()
  terminal_list = token_dfa.state_terminal.tolist()
  for q, (lo, hi) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
    key = (b"\1" if accepting_list[q] else b"\0") + terminal_list[q].to_bytes(
        4, "little", signed=True) + tok_bytes[4 * lo:4 * hi]
    new_row = len(rows)
    row = rows.setdefault(key, new_row)
    is_representative[q] = row == new_row
    row_of_state[q] = row
  m = len(rows)
  mask_bits = np.zeros((bucket_size(m, min_bucket), w), np.uint32)
  # Representatives are the first state of each row, so their rows come in order.
  rep_edges = is_representative[src]
  rep_rows = row_of_state[src[rep_edges]]
  rep_tokens = tok[rep_edges]
  accepting_rows = row_of_state[is_representative & token_dfa.accepting]
  all_rows = np.concatenate([rep_rows, np.repeat(accepting_rows, len(eos))])
  all_tokens = np.concatenate([rep_tokens, np.tile(eos, len(accepting_rows))]).astype(np.int64)
  _set_bits(mask_bits, all_rows, all_tokens)
  wide_reps = np.nonzero(is_representative & (token_dfa.state_terminal >= 0))[0]
  mask_bits[row_of_state[wide_reps]] |= token_dfa.terminal_bits[
      token_dfa.state_terminal[wide_reps]]

  s_pad = bucket_size(s, min_bucket)
  e_pad = bucket_size(len(src), min_bucket)
  edge_start = np.full(s_pad + 1, len(src), np.int32)
  edge_start[:s + 1] = offsets
  edge_tokens = np.full(e_pad, PAD_TOKEN, np.int32)
  edge_targets = np.full(e_pad, NO_STATE, np.int32)
  edge_tokens[:len(src)] = tok
  edge_targets[:len(src)] = dst
  accepting = np.zeros(s_pad, bool)
  accepting[:s] = token_dfa.accepting
  state_mask = np.zeros(s_pad, np.int32)
  state_mask[:s] = row_of_state
  num_terminals = token_dfa.terminal_bits.shape[0]
  terminal_bits = np.zeros((bucket_size(num_terminals, 1), w), np.uint32)
  terminal_bits[:num_terminals] = token_dfa.terminal_bits
  state_terminals = np.full((s_pad, 1, 2), NO_STATE, np.int32)
  has = np.nonzero(token_dfa.state_terminal >= 0)[0]
  state_terminals[has, 0, 0] = token_dfa.state_terminal[has]
  state_terminals[has, 0, 1] = token_dfa.terminal_target[has]
  return ConstraintTables(
      start=np.zeros(1, np.int32),
      accepting=accepting,
      mask_bits=mask_bits,
      state_mask=state_mask,
      edge_start=edge_start,
      edge_tokens=edge_tokens,
      edge_targets=edge_targets,
      eos_bits=bitmask(eos, vocab.vocab_size),
      terminal_bits=terminal_bits,
      state_terminals=state_terminals,
      vocab_size=vocab.vocab_size,
  )


def _set_bits(bits: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> None:
  """ORs token bits into `bits[rows]`; (row, token) pairs must be distinct."""
  if not len(rows):
    return
  key = rows.astype(np.int64) * bits.shape[1] + (tokens >> 5)
  value = np.uint32(1) << (tokens & 31).astype(np.uint32)
  order = np.argsort(key, kind="stable")
  key, value = key[order], value[order]
  unique, first = np.unique(key, return_index=True)
  # Distinct bits of one word sum to their OR.
  bits.reshape(-1)[unique] |= np.add.reduceat(value, first).astype(np.uint32)


def _used_sizes(t: ConstraintTables) -> tuple[int, int, int]:
  """(states, edges, masks) actually used, derived from the arrays.

  Real states are numbered before padding and every real state is reachable from a
  start, so the used prefix ends at the largest state id reachable from the starts.
  """
  seen = np.zeros(t.accepting.shape[0], bool)
  frontier = np.unique(t.start)
  seen[frontier] = True
  terminal_targets = t.state_terminals[:, :, 1]
  while len(frontier):
    edges = np.concatenate([np.arange(t.edge_start[f], t.edge_start[f + 1]) for f in frontier])
    nxt = np.concatenate([t.edge_targets[edges.astype(np.int64)],
                          terminal_targets[frontier].reshape(-1)])
    nxt = np.unique(nxt[nxt >= 0])
    frontier = nxt[~seen[nxt]]
    seen[frontier] = True
  s = int(np.nonzero(seen)[0].max()) + 1
  e = int(t.edge_start[s])
  m = int(t.state_mask[:s].max()) + 1
  return s, e, m


def stack_tables(tables: Sequence[ConstraintTables], *,
                 min_bucket: int = DEFAULT_MIN_BUCKET) -> ConstraintTables:
  """Stacks several constraints into one table set, so each batch row can follow its own.

  State ids of the i-th constraint are offset by the states before it; `start[i]` is its
  start state (pass `constraint_ids` to `init_state` to choose per row). Stacking
  already-stacked tables flattens them.

  Raises:
    ValueError: If the tables were built for vocabularies of different logits widths or
      end-of-sequence ids, or `tables` is empty.
  """
  if not tables:
    raise ValueError("stack_tables got no tables. Expected at least one ConstraintTables.")
  first = tables[0]
  for i, t in enumerate(tables):
    if t.vocab_size != first.vocab_size or not np.array_equal(t.eos_bits, first.eos_bits):
      raise ValueError(
          f"Tables {i} were built for another vocabulary (vocab_size {t.vocab_size} vs "
          f"{first.vocab_size}, or different end-of-sequence ids). Expected tables "
          f"compiled with the same Vocabulary."
      )
  used = [_used_sizes(t) for t in tables]
  t_used = [int(t.state_terminals[:s, :, 0].max(initial=-1)) + 1 for t, (s, _, _) in
            zip(tables, used)]
  r_pad = max(t.state_terminals.shape[1] for t in tables)
  s_tot = sum(s for s, _, _ in used)
  e_tot = sum(e for _, e, _ in used)
  m_tot = sum(m for _, _, m in used)
  s_pad = bucket_size(s_tot, min_bucket)
  e_pad = bucket_size(e_tot, min_bucket)
  w = first.mask_bits.shape[1]
  out = dict(
      accepting=np.zeros(s_pad, bool),
      mask_bits=np.zeros((bucket_size(m_tot, min_bucket), w), np.uint32),
      state_mask=np.zeros(s_pad, np.int32),
      edge_start=np.full(s_pad + 1, e_tot, np.int32),
      edge_tokens=np.full(e_pad, PAD_TOKEN, np.int32),
      edge_targets=np.full(e_pad, NO_STATE, np.int32),
      terminal_bits=np.zeros((bucket_size(sum(t_used), 1), w), np.uint32),
      state_terminals=np.full((s_pad, r_pad, 2), NO_STATE, np.int32),
  )
  starts = []
  s_off = m_off = t_off = e_off = 0
  for t, (s, e, m), n_t in zip(tables, used, t_used):
    starts.append(t.start + s_off)
    out["accepting"][s_off:s_off + s] = t.accepting[:s]
    out["mask_bits"][m_off:m_off + m] = t.mask_bits[:m]
    out["state_mask"][s_off:s_off + s] = t.state_mask[:s] + m_off
    out["edge_start"][s_off:s_off + s + 1] = t.edge_start[:s + 1] + e_off
    out["edge_tokens"][e_off:e_off + e] = t.edge_tokens[:e]
    out["edge_targets"][e_off:e_off + e] = t.edge_targets[:e] + s_off
    out["terminal_bits"][t_off:t_off + n_t] = t.terminal_bits[:n_t]
    terms = t.state_terminals[:s]
    r = terms.shape[1]
    out["state_terminals"][s_off:s_off + s, :r] = np.where(
        terms >= 0, terms + np.array([t_off, s_off], np.int32), NO_STATE)
    s_off += s
    e_off += e
    m_off += m
    t_off += n_t
  return ConstraintTables(start=np.concatenate(starts).astype(np.int32),
                          eos_bits=first.eos_bits, vocab_size=first.vocab_size, **out)


def tables_nbytes(tables: ConstraintTables) -> dict[str, int]:
  """Bytes used by each array of `tables`, and their `total`."""
  sizes = {name: int(np.asarray(getattr(tables, name)).nbytes) for name in _ARRAY_FIELDS}
  sizes["total"] = sum(sizes.values())
  return sizes

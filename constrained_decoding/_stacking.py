"""Stacking several constraints' tables into one table set (`stack_tables`).

Split from `tables.py` (the format and the packers): stacking offsets the state, group,
edge, mask, terminal and push-sequence ids of each part, keeps counted chains' shared
terminal rows, their rows excluded near their ends, and push-down tables' stack-bound
rows, and checks that the parts were
compiled for one vocabulary. Grammars with a lexer (`LexedTables`) stack only with each
other, through `_lexed_grammar.stack_lexed_arrays`' offsets (`_stack_lexed`).

Public names:
  stack_tables(tables_list)    several constraints in one table set (states offset).
  terminal_entries(tables)     [S, R, 2] terminal entries per state (rows applied).
"""

from collections.abc import Sequence

import numpy as np

from constrained_decoding.errors import UnsupportedFeatureError
from constrained_decoding.errors import VocabularyMismatchError
from constrained_decoding.lexed_tables import LexedTables
from constrained_decoding.tables import (CAP_PAD, DEFAULT_MIN_BUCKET, GUARD_UCLOSE, GUARD_UHASH,
                                         NO_STATE, PAD_TOKEN, UNIQUE_CAP_RADIX,
                                         RELATIVE, ConstraintTables, bucket_size,
                                         edge_search_steps)


def _used_sizes(t: ConstraintTables) -> tuple[int, int, int, int, int]:
  """(states, groups, edges, masks, push rows) actually used, derived from the arrays.

  Real states, groups and edges are numbered before padding, and every real state has
  at least one group or is reachable, so the used prefixes end at the last state with
  a group or the largest state id reachable from the starts.
  """
  seen = np.zeros(t.accepting.shape[0], bool)
  frontier = np.unique(t.start)
  seen[frontier] = True
  terminal_targets = terminal_entries(t)[:, :, 1]
  while len(frontier):
    groups = t.state_groups[frontier].reshape(-1)
    groups = groups[groups >= 0]
    edges = np.concatenate([np.arange(t.edge_start[x], t.edge_start[x + 1]) for x in groups]
                           + [np.zeros(0, np.int64)])
    nxt = np.concatenate([t.edge_targets[edges.astype(np.int64)],
                          terminal_targets[frontier].reshape(-1),
                          t.push_symbols[t.edge_pushes[edges.astype(np.int64)]].reshape(-1)])
    nxt = np.unique(nxt[nxt >= 0])
    frontier = nxt[~seen[nxt]]
    seen[frontier] = True
  s = int(np.nonzero(seen)[0].max()) + 1
  if _has_relative_targets(t):  # Relative targets are not followed above: every state
    # with a group is real (counted chains number their states before the padding).
    with_group = np.flatnonzero((t.state_groups >= 0).any(axis=1))
    s = max(s, int(with_group.max(initial=-1)) + 1)
  used_groups = t.state_groups[:s]
  g = int(used_groups.max(initial=-1)) + 1
  e = int(t.edge_start[g])
  m = int(t.group_mask[:g].max(initial=0)) + 1
  u = int(t.edge_pushes[:e].max(initial=0)) + 1
  return s, g, e, m, u


def terminal_entries(t: ConstraintTables) -> np.ndarray:
  """int32 [S, R, 2]: each state's terminal entries (`state_terminal_rows` applied)."""
  rows = np.asarray(t.state_terminal_rows)
  table = np.asarray(t.state_terminals)
  return table[rows] if len(rows) else table


def _has_relative_targets(t: ConstraintTables) -> bool:
  """Whether `t` has relative edges or counting terminals (counted chains)."""
  return bool(np.asarray(t.token_counts).shape[0]) or bool(
      (np.asarray(t.edge_targets) <= RELATIVE).any())


def _pad_columns(array: np.ndarray, width: int) -> np.ndarray:
  out = np.full((array.shape[0], width) + array.shape[2:], NO_STATE, array.dtype)
  out[:, :array.shape[1]] = array
  return out


def stack_tables(tables: Sequence[ConstraintTables | LexedTables], *,
                 min_bucket: int = DEFAULT_MIN_BUCKET) -> ConstraintTables | LexedTables:
  """Stacks several constraints into one table set, so each batch row can follow its own.

  State ids of the i-th constraint are offset by the states before it (stack symbols
  are state ids, so they are offset too); `start[i]` is its start state (pass
  `constraint_ids` to `init_state` to choose per row). Regular and grammar tables mix:
  the stack capacity is the largest of the parts. Stacking already-stacked tables
  flattens them.

  Raises:
    VocabularyMismatchError: If the tables were built for different vocabularies
      (fingerprints, logits widths or end-of-sequence ids).
    ValueError: If `tables` is empty.
    UnsupportedFeatureError: If some, not all, are `LexedTables` (grammars with a
      lexer): their runtime steps another layout, so they stack only with each other
      (`_stack_lexed`, which returns `LexedTables`).
  """
  if not tables:
    raise ValueError("stack_tables got no tables. Expected at least one ConstraintTables.")
  lexed = [i for i, t in enumerate(tables) if isinstance(t, LexedTables)]
  if len(lexed) == len(tables):
    return _stack_lexed(tables)
  if lexed:
    flat = next(i for i in range(len(tables)) if i not in lexed)
    raise UnsupportedFeatureError(
        f"stack_tables: tables {lexed[0]} are LexedTables (a grammar with a lexer) and "
        f"tables {flat} are not: LexedTables are not stacked with ConstraintTables (each "
        f"kind has its own runtime), only with each other. Expected all ConstraintTables "
        f"or all LexedTables. Give the grammar with a lexer to the rows of its own batch.")
  first = tables[0]
  known = next((t.vocab_fingerprint for t in tables if t.vocab_fingerprint), "")
  for i, t in enumerate(tables):
    if (t.vocab_size != first.vocab_size or not np.array_equal(t.eos_bits, first.eos_bits)
        or t.vocab_fingerprint not in ("", known)):
      raise VocabularyMismatchError(
          f"Tables {i} were built for another vocabulary (vocab_size {t.vocab_size} vs "
          f"{first.vocab_size}, fingerprint {t.vocab_fingerprint or '?'} vs {known or '?'},"
          f" or other end-of-sequence ids). Expected tables compiled with the same "
          f"Vocabulary.")
  used = [_used_sizes(t) for t in tables]
  # Counting tables also name terminals as filters: all of theirs are kept.
  t_used = [t.terminal_bits.shape[0] if t.token_counts.shape[0]
            else int(t.state_terminals[:u[0], :, 0].max(initial=-1)) + 1
            for t, u in zip(tables, used)]
  r_pad = max(t.state_terminals.shape[1] for t in tables)
  shared = any(len(t.state_terminal_rows) for t in tables)  # Keep rows shared then.
  row_counts = [t.state_terminals.shape[0] if len(t.state_terminal_rows) else u[0]
                for t, u in zip(tables, used)]
  k_pad = max(t.state_groups.shape[1] for t in tables)
  p_pad = max(t.group_pops.shape[1] for t in tables)
  q_pad = max(t.push_symbols.shape[1] for t in tables)
  s_tot, g_tot, e_tot, m_tot, u_tot = (sum(column) for column in zip(*used))
  s_pad, g_pad, e_pad = (bucket_size(n, min_bucket) for n in (s_tot, g_tot, e_tot))
  w = first.mask_bits.shape[1]
  out = dict(
      accepting=np.zeros(s_pad, bool),
      mask_bits=np.zeros((bucket_size(m_tot, min_bucket), w), np.uint32),
      state_groups=np.full((s_pad, k_pad), NO_STATE, np.int32),
      group_mask=np.zeros(g_pad, np.int32),
      group_pops=np.full((g_pad, p_pad), NO_STATE, np.int32),
      group_num_pops=np.zeros(g_pad, np.int32),
      edge_start=np.full(g_pad + 1, e_tot, np.int32),
      edge_tokens=np.full(e_pad, PAD_TOKEN, np.int32),
      edge_targets=np.full(e_pad, NO_STATE, np.int32),
      edge_pushes=np.zeros(e_pad, np.int32),
      push_symbols=np.full((u_tot, q_pad), NO_STATE, np.int32),
      push_lengths=np.zeros(u_tot, np.int32),
      terminal_bits=np.zeros((bucket_size(sum(t_used), 1), w), np.uint32),
      state_terminals=np.full((sum(row_counts) if shared else s_pad, r_pad, 2), NO_STATE,
                              np.int32),
      state_terminal_rows=np.zeros(s_pad if shared else 0, np.int32),
      terminal_counts=np.full((bucket_size(sum(t_used), 1), 3), NO_STATE, np.int32),
      token_counts=np.concatenate([t.token_counts for t in tables]).astype(np.int8),
  )
  starts = []
  s_off = g_off = e_off = m_off = u_off = t_off = c_off = r_off = 0

  for t, (s, g, e, m, u), n_t in zip(tables, used, t_used):
    starts.append(t.start + s_off)
    out["accepting"][s_off:s_off + s] = t.accepting[:s]
    out["mask_bits"][m_off:m_off + m] = t.mask_bits[:m]
    out["state_groups"][s_off:s_off + s] = _pad_columns(_shift(t.state_groups[:s], g_off),
                                                         k_pad)
    out["group_mask"][g_off:g_off + g] = t.group_mask[:g] + m_off
    out["group_pops"][g_off:g_off + g] = _pad_columns(_shift(t.group_pops[:g], s_off), p_pad)
    out["group_num_pops"][g_off:g_off + g] = t.group_num_pops[:g]
    out["edge_start"][g_off:g_off + g + 1] = t.edge_start[:g + 1] + e_off
    out["edge_tokens"][e_off:e_off + e] = t.edge_tokens[:e]
    targets = t.edge_targets[:e]  # Relative targets (<= RELATIVE) need no offset.
    out["edge_targets"][e_off:e_off + e] = np.where(targets >= 0, targets + s_off, targets)
    out["edge_pushes"][e_off:e_off + e] = t.edge_pushes[:e] + u_off
    out["push_symbols"][u_off:u_off + u] = _pad_columns(_shift(t.push_symbols[:u], s_off),
                                                        q_pad)
    out["push_lengths"][u_off:u_off + u] = t.push_lengths[:u]
    out["terminal_bits"][t_off:t_off + n_t] = t.terminal_bits[:n_t]
    counts = np.array(t.terminal_counts[:n_t])  # Stride and bias are relative.
    counts[:, 0] = np.where(counts[:, 0] >= 0, counts[:, 0] + c_off, NO_STATE)
    out["terminal_counts"][t_off:t_off + n_t] = counts
    n_rows = row_counts[len(starts) - 1]
    terms = t.state_terminals[:n_rows]
    # A counting entry's second field is a filter terminal, not a state (or a bound,
    # AT_MOST - r, which stays as it is, as does padding).
    counting = np.asarray(t.terminal_counts)[np.maximum(terms[..., 0], 0), 0] >= 0
    offset = np.stack([np.full(counting.shape, t_off, np.int32),
                       np.where(counting, t_off, s_off).astype(np.int32)], axis=-1)
    out["state_terminals"][r_off:r_off + n_rows, :terms.shape[1]] = np.where(
        terms >= 0, terms + offset, np.where(terms < NO_STATE, terms, NO_STATE))
    if shared:
      own = np.asarray(t.state_terminal_rows)[:s] if len(t.state_terminal_rows) else np.arange(s)
      out["state_terminal_rows"][s_off:s_off + s] = own + r_off
    r_off += n_rows
    s_off += s
    g_off += g
    e_off += e
    m_off += m
    u_off += u
    t_off += n_t
    c_off += t.token_counts.shape[0]
  out.update(_stacked_capped_masks(tables, used, g_pad, w, min_bucket))
  out.update(_stacked_exclusions(tables, used, g_pad, w, min_bucket))
  out.update(_stacked_guards(tables, used, g_pad))
  out.update(_stacked_hashes(tables, used, s_pad, out.get("guard_ops")))
  return ConstraintTables(start=np.concatenate(starts).astype(np.int32),
                          eos_bits=first.eos_bits, vocab_size=first.vocab_size,
                          stack_depth=max(t.stack_depth for t in tables),
                          vocab_fingerprint=known, **out,
                          # The largest group of any part, bucketed like the axes.
                          edge_search_steps=edge_search_steps(out["edge_start"], min_bucket))


def _shift(values: np.ndarray, offset: int) -> np.ndarray:
  """Ids offset by `offset`, padding (-1) kept."""
  return np.where(values >= 0, values + offset, NO_STATE)


def _stacked_guards(tables: Sequence[ConstraintTables], used: list,
                    g_pad: int) -> dict[str, np.ndarray]:
  """The register arrays of stacked tables: guard ids and edge slots offset, guards
  padded to the longest; a row follows one constraint, so the parts share register
  words (as many as the widest part needs). Empty when no part has registers."""
  if not any(t.has_registers for t in tables):
    return {}
  o_pad = max(t.guard_ops.shape[1] for t in tables if t.has_registers)
  m_pad = max(t.guarded_slots.shape[1] for t in tables if t.has_registers)
  group_guarded = np.zeros(g_pad, np.int32)
  rows = 1 + sum(t.guarded_slots.shape[0] - 1 for t in tables if t.has_registers)
  guarded_slots = np.full((rows, m_pad), NO_STATE, np.int32)
  guarded_ids = np.full((rows, m_pad), NO_STATE, np.int32)
  ops = []
  g_off = e_off = d_off = 0
  x_off = 1  # Row 0 stays the empty row.
  for t, (_, g, e, _, _) in zip(tables, used):
    if t.has_registers:
      own = np.asarray(t.group_guarded)[:g]
      group_guarded[g_off:g_off + g] = np.where(own > 0, own + x_off - 1, 0)
      slots = np.asarray(t.guarded_slots)[1:]
      n, width = slots.shape
      guarded_slots[x_off:x_off + n, :width] = _shift(slots, e_off)
      guarded_ids[x_off:x_off + n, :width] = _shift(np.asarray(t.guarded_ids)[1:], d_off)
      x_off += n
      part = np.full((t.guard_ops.shape[0], o_pad, 3), NO_STATE, np.int32)
      part[..., 1:] = 0
      part[:, :t.guard_ops.shape[1]] = t.guard_ops
      ops.append(part)
      d_off += t.guard_ops.shape[0]
    g_off += g
    e_off += e
  words = max(t.register_init.shape[0] for t in tables)
  return dict(guard_ops=np.concatenate(ops), group_guarded=group_guarded,
              guarded_slots=guarded_slots, guarded_ids=guarded_ids,
              register_init=np.zeros(words, np.int32))


def _stacked_hashes(tables: Sequence[ConstraintTables], used: list, s_pad: int,
                    guard_ops) -> dict[str, np.ndarray]:
  """The distinct-strings arrays of stacked tables (`tables.py`): hash rows concatenated
  and the UCLOSE/UHASH operands of `guard_ops` (already stacked) offset to them; states
  of parts without them hash nothing. Empty when no part has them."""
  if not any(t.has_hashes for t in tables):
    return {}
  consts, hashing = [], np.full(s_pad, NO_STATE, np.int32)
  token_hash = next(t.token_hash for t in tables if t.has_hashes)
  guard_ops = np.array(guard_ops)
  s_off = d_off = h_off = 0
  for t, (s, *_) in zip(tables, used):
    if t.has_hashes:
      hashing[s_off:s_off + s] = np.asarray(t.state_hashing)[:s]
      part = guard_ops[d_off:d_off + t.guard_ops.shape[0]]
      kind = part[..., 0]
      part[..., 2] += np.where(kind == GUARD_UCLOSE, h_off * UNIQUE_CAP_RADIX,
                               np.where(kind == GUARD_UHASH, h_off, 0)).astype(np.int32)
      consts.append(np.asarray(t.hash_consts))
      h_off += t.hash_consts.shape[0]
    if t.has_registers:
      d_off += t.guard_ops.shape[0]
    s_off += s
  return dict(guard_ops=guard_ops, hash_consts=np.concatenate(consts),
              state_hashing=hashing, token_hash=token_hash)


def _stacked_exclusions(tables: Sequence[ConstraintTables], used: list, g_pad: int,
                        w: int, min_bucket: int) -> dict[str, np.ndarray]:
  """The rows removed near counted chains' ends (`tables.py`) of stacked tables: each
  part's exclusion rows after the others' (row 0 stays the empty row), its groups'
  row ids offset; empty when no part has any."""
  if not any(t.group_excluded.shape[0] for t in tables):
    return {}
  parts = [(u[1], np.asarray(t.group_excluded)[:, None] if t.group_excluded.shape[0]
            else None, t.excluded_bits) for t, u in zip(tables, used)]
  ids, bits = _stacked_bit_rows(parts, g_pad, 1, w, min_bucket)
  return dict(group_excluded=np.ascontiguousarray(ids[:, 0]), excluded_bits=bits)


def _stacked_capped_masks(tables: Sequence[ConstraintTables], used: list, g_pad: int,
                          w: int, min_bucket: int) -> dict[str, np.ndarray]:
  """The stack-aware mask arrays of stacked tables: each part's groups and exclusion rows
  offset (row 0 stays the empty row); empty when no part has any."""
  l_pad = max(t.capped_limits.shape[1] for t in tables)
  if not l_pad:
    return dict(capped_limits=np.zeros((0, 0), np.int32),
                capped_rows=np.zeros((0, 0), np.int32),
                capped_bits=np.zeros((0, 0), np.uint32))
  limits = np.full((g_pad, l_pad), CAP_PAD, np.int32)
  g_off = 0
  for t, u in zip(tables, used):
    if t.capped_limits.shape[1]:
      limits[g_off:g_off + u[1], :t.capped_limits.shape[1]] = t.capped_limits[:u[1]]
    g_off += u[1]
  parts = [(u[1], t.capped_rows if t.capped_limits.shape[1] else None, t.capped_bits)
           for t, u in zip(tables, used)]
  rows, bits = _stacked_bit_rows(parts, g_pad, l_pad, w, min_bucket)
  return dict(capped_limits=limits, capped_rows=rows, capped_bits=bits)


def _stacked_bit_rows(parts: list, g_pad: int, width: int, w: int,
                      min_bucket: int) -> tuple[np.ndarray, np.ndarray]:
  """Bitmap rows referenced by group: per part (its g groups, their row ids `[>= g, k]`
  with 0 the empty row, or None; its bitmap rows, row 0 empty), the ids stacked into
  `[g_pad, width]` with each part's rows after the others' (0 kept as the shared empty
  row), and the rows concatenated and padded to a bucket of `min_bucket`."""
  ids = np.zeros((g_pad, width), np.int32)
  bits = [np.zeros((1, w), np.uint32)]
  g_off, x_off = 0, 1
  for g, own_ids, own_bits in parts:
    if own_ids is not None:
      own = np.asarray(own_ids)[:g]
      ids[g_off:g_off + g, :own.shape[1]] = np.where(own > 0, own + x_off - 1, 0)
      bits.append(np.asarray(own_bits)[1:])
      x_off += own_bits.shape[0] - 1
    g_off += g
  rows = np.concatenate(bits)
  padded = np.zeros((bucket_size(len(rows), min_bucket), w), np.uint32)
  padded[:len(rows)] = rows
  return ids, padded


def _stack_lexed(tables: Sequence[LexedTables]) -> LexedTables:
  """Grammars with a lexer as one `LexedTables` (rows pick theirs by `constraint_ids`).

  The offsets and padding are `_lexed_grammar.stack_lexed_arrays`', applied to the
  device arrays of each part (the host-only parts of `LexedArrays`, such as the lexer
  and the LR automaton, are not needed to step and are not kept). Needs the compiler's
  host modules (pynini), as compiling does.

  Raises:
    VocabularyMismatchError: The parts were compiled for different vocabularies.
    UnsupportedFeatureError: The host modules do not import (no pynini).
  """
  from constrained_decoding import lexed_tables as _lexed  # pylint: disable=g-import-not-at-top

  try:
    from constrained_decoding.constraints import _lexed_grammar  # pylint: disable=g-import-not-at-top  (host, pynini)
  except ImportError as e:
    raise UnsupportedFeatureError(
        f"stack_tables: stacking {len(tables)} grammars with a lexer (LexedTables) needs "
        f"the compiler's host modules, which did not import ({e}). Expected pynini "
        f"installed, or one grammar with a lexer per batch.") from e

  known = next((t.vocab_fingerprint for t in tables if t.vocab_fingerprint), "")
  for i, t in enumerate(tables):
    if (t.vocab_fingerprint not in ("", known)
        or not np.array_equal(np.asarray(t.eos_bits), np.asarray(tables[0].eos_bits))):
      raise VocabularyMismatchError(
          f"Tables {i} were built for another vocabulary (fingerprint "
          f"{t.vocab_fingerprint or '?'} vs {known or '?'}, or other end-of-sequence ids). "
          f"Expected tables compiled with the same Vocabulary.")
  vocab = _VocabName(fingerprint=known or None)
  parts = [_LexedParts(arrays={f: np.asarray(getattr(t, f)) for f in _lexed._ARRAY_FIELDS},  # pylint: disable=protected-access
                       vocab_size=t.vocab_size, stack_depth=t.stack_depth,
                       indent_depth=t.indent_depth, vocab=vocab) for t in tables]
  return _lexed.lexed_tables_from_arrays(_lexed_grammar.stack_lexed_arrays(parts),
                                         vocab_fingerprint=known)


class _VocabName:
  """What `stack_lexed_arrays` reads of a vocabulary: its fingerprint."""

  def __init__(self, fingerprint):
    self.fingerprint = fingerprint


class _LexedParts:
  """The device arrays of one `LexedTables` under the names `stack_lexed_arrays` reads
  from a `LexedArrays` (host-only parts: None; `goto`: no columns, unused to step)."""

  def __init__(self, *, arrays, vocab_size, stack_depth, indent_depth, vocab):
    self.__dict__.update(arrays)
    self.vocab_size, self.stack_depth, self.indent_depth = vocab_size, stack_depth, indent_depth
    self.vocab = vocab
    self.goto = np.zeros((arrays["action"].shape[0], 0), np.int32)
    self.lexer = self.token_table = self.lr = self.grammar = None
    self.indentation = self.semicolons = None

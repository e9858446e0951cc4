"""Packing: token automata -> `ConstraintTables` (host).

Functions:
  estimate_nbytes(token_dfa, vocab)           table bytes before packing (the budget check).
  pack_tables(token_dfa, vocab, ...)          a regular token automaton's tables.
  pack_pda_tables(token_pda, vocab, ...)      a token-level push-down automaton's tables,
                                              with its stack-bound (capped) mask rows.
  stack_needs(automaton)                      stack height each state needs to finish.
  share_groups(edge_start, ...)               groups with equal rows and edges merged
                                              (counted chains: one per distinct layer).

The layout they fill is `tables.py`'s (its module doc); `_padded` pads an axis to its
bucket for the other packers (`automata/_counting.py`, `automata/_embedded_chains.py`).
"""

import dataclasses

import numpy as np

from constrained_decoding.errors import CompileBudgetError
from constrained_decoding.tables import (CAP_PAD, DEFAULT_MIN_BUCKET, NO_FINISH, NO_STATE,
                                         PAD_TOKEN, ConstraintTables, bitmask, bucket_size,
                                         edge_search_steps, num_words)


# Above this many states `estimate_nbytes` counts the distinct mask rows exactly (one
# pass over the edges, as packing does) rather than assuming one row per state.
_EXACT_ROWS_ABOVE = 512


def estimate_nbytes(token_dfa, vocab, *, min_bucket: int = DEFAULT_MIN_BUCKET,
                    within: int | None = None) -> int:
  """Upper bound on the bytes `pack_tables` would use, checked before it allocates.

  Mask rows (32 KiB each with 262k tokens) are counted one per state for small
  automata, and exactly (distinct allowed sets, as packing deduplicates them) for
  large ones, where many states of repeated sub-schemas share their rows. With
  `within` (the budget the caller checks against), the bound with one row per state is
  returned when it is within it: counting exactly (a pass over the edges, ~1 ms with
  200k) could only lower a bound that already passes.
  """
  s = token_dfa.num_states
  rows = s
  if s > _EXACT_ROWS_ABOVE and (within is None
                                or _nbytes(token_dfa, vocab, min_bucket, rows) > within):
    edge_start = np.searchsorted(token_dfa.edge_source, np.arange(s + 1)).tolist()
    terminals = np.ascontiguousarray(np.asarray(token_dfa.state_terminals)[:, :, 0], np.int32)
    rows = len(_distinct_groups(token_dfa.edge_token, edge_start, terminals)[1])
  return _nbytes(token_dfa, vocab, min_bucket, rows)


def _nbytes(token_dfa, vocab, min_bucket: int, rows: int) -> int:
  """`estimate_nbytes` with `rows` distinct mask rows."""
  s_pad = bucket_size(token_dfa.num_states, min_bucket)
  e_pad = bucket_size(len(token_dfa.edge_token), min_bucket)
  m_pad = bucket_size(rows, min_bucket)
  t_pad = bucket_size(token_dfa.terminal_bits.shape[0], 1)
  r = token_dfa.state_terminals.shape[1]
  return (e_pad * 12 + (m_pad + t_pad) * num_words(vocab.vocab_size) * 4
          + s_pad * (21 + 8 * r))


@dataclasses.dataclass(frozen=True)
class _Automaton:
  """What both packers share: states, edge groups, edges and terminals as numpy arrays.

  Groups must be sorted by state and edges by (group, token).
  """

  num_states: int
  accepting: np.ndarray       # bool [S]
  group_state: np.ndarray     # int [G]
  group_pops: np.ndarray      # int [G, P], -1 padded, top of stack first
  group_num_pops: np.ndarray  # int [G]
  edge_group: np.ndarray      # int [E]
  edge_token: np.ndarray      # int [E]
  edge_target: np.ndarray     # int [E]
  edge_push: np.ndarray       # int [E], rows of push_symbols
  push_symbols: np.ndarray    # int [U, Q], -1 padded, bottom first; row 0 empty
  push_lengths: np.ndarray    # int [U]
  terminal_bits: np.ndarray   # uint32 [T, W]
  state_terminals: np.ndarray  # int [S, R, 2]: (terminal, target) by precedence, -1 padded
  # A token DFA: group g is state g, and nothing pops or pushes (skips generic work).
  regular: bool = False
  # Counting terminals (push-down counted chains, `automata/_pda_chains.py`): int [T, 3]
  # (class row, stride, bias; row -1 for a plain terminal) and int8 [C, V]; None: none.
  terminal_counts: np.ndarray | None = None
  token_counts: np.ndarray | None = None


def pack_tables(token_dfa, vocab, *, min_bucket: int = DEFAULT_MIN_BUCKET,
                guards=None) -> ConstraintTables:
  """Packs a `TokenDfa` (start state 0, edges sorted by (source, token)).

  Args:
    token_dfa: A trimmed token DFA from `automata.compose_token_dfa`, non-empty.
    vocab: The `Vocabulary` it was built for (end-of-sequence ids and logits width).
    min_bucket: Smallest padded size of S, E and M.
    guards: The `_registers.Guards` of its explicit edges, or None.
  """
  s = token_dfa.num_states
  e = len(token_dfa.edge_token)
  automaton = _Automaton(
      num_states=s, accepting=np.asarray(token_dfa.accepting, bool),
      group_state=np.arange(s), group_pops=np.zeros((s, 0), np.int32),
      group_num_pops=np.zeros(s, np.int32), edge_group=token_dfa.edge_source,
      edge_token=token_dfa.edge_token, edge_target=token_dfa.edge_target,
      edge_push=np.zeros(e, np.int32), push_symbols=np.zeros((1, 0), np.int32),
      push_lengths=np.zeros(1, np.int32), terminal_bits=token_dfa.terminal_bits,
      state_terminals=token_dfa.state_terminals, regular=True)
  if guards is None or not (guards.edge_guard >= 0).any():
    return _pack(automaton, vocab, stack_depth=0, min_bucket=min_bucket)
  # Guarded edges are looked up like the others but kept out of the mask rows.
  unguarded = guards.edge_guard < 0
  masked = dataclasses.replace(automaton, edge_group=automaton.edge_group[unguarded],
                               edge_token=automaton.edge_token[unguarded],
                               edge_target=automaton.edge_target[unguarded],
                               edge_push=automaton.edge_push[unguarded])
  tables = _pack(automaton, vocab, stack_depth=0, min_bucket=min_bucket, masked=masked)
  return _with_guards(tables, guards, token_dfa.edge_source, s)


def _with_guards(tables: ConstraintTables, guards, edge_group: np.ndarray,
                 num_groups: int, chains: list[list[int]] | None = None) -> ConstraintTables:
  """`tables` with the guard arrays of a token automaton's edges: for a token DFA
  (groups are states) each group lists its own guarded edges; with `chains` (push-down
  tables, `_prefix_groups`) group k lists those of every group of `chains[k]`."""
  slots = np.flatnonzero(guards.edge_guard >= 0)
  groups = edge_group[slots]
  per_group = np.bincount(groups, minlength=num_groups)
  group_guarded = np.zeros(tables.group_mask.shape[0], np.int32)
  if chains is None:
    width = int(per_group.max())
    with_guards = np.flatnonzero(per_group)
    group_guarded[with_guards] = np.arange(1, len(with_guards) + 1)  # Row 0: none.
    guarded_slots = np.full((len(with_guards) + 1, width), NO_STATE, np.int32)
    guarded_ids = np.full_like(guarded_slots, NO_STATE)
    first = np.concatenate([[0], np.cumsum(per_group)[:-1]])
    column = np.arange(len(slots)) - first[groups]
    guarded_slots[group_guarded[groups], column] = slots
    guarded_ids[group_guarded[groups], column] = guards.edge_guard[slots]
  else:
    own: dict[int, list[int]] = {}
    for slot, group in zip(slots.tolist(), groups.tolist()):
      own.setdefault(group, []).append(slot)
    lists = {k: [x for h in chain for x in own.get(h, ())] for k, chain in enumerate(chains)}
    lists = {k: v for k, v in lists.items() if v}
    width = max(map(len, lists.values()))
    guarded_slots = np.full((len(lists) + 1, width), NO_STATE, np.int32)
    guarded_ids = np.full_like(guarded_slots, NO_STATE)
    for row, (k, listed) in enumerate(sorted(lists.items()), start=1):  # Row 0: none.
      group_guarded[k] = row
      guarded_slots[row, :len(listed)] = listed
      guarded_ids[row, :len(listed)] = guards.edge_guard[listed]
  hashes = {}
  if guards.token_hash is not None:  # Distinct strings: states padded as not hashing.
    state_hashing = np.full(tables.accepting.shape[0], NO_STATE, np.int32)
    state_hashing[:len(guards.state_hashing)] = guards.state_hashing
    hashes = dict(hash_consts=np.asarray(guards.hash_consts, np.int32),
                  state_hashing=state_hashing, token_hash=guards.token_hash)
  return dataclasses.replace(tables, guard_ops=np.asarray(guards.ops, np.int32),
                             group_guarded=group_guarded, guarded_slots=guarded_slots,
                             guarded_ids=guarded_ids,
                             register_init=np.zeros(guards.num_words, np.int32), **hashes)


def pack_pda_tables(token_pda, vocab, *, stack_depth: int,
                    min_bucket: int = DEFAULT_MIN_BUCKET, guards=None,
                    terminal_counts: np.ndarray | None = None,
                    token_counts: np.ndarray | None = None,
                    second_terminals: list | None = None) -> ConstraintTables:
  """Packs a `TokenPda` (`automata/_pda.py`) with a stack of `stack_depth` symbols.

  `terminal_counts` and `token_counts` (`automata/_pda_chains.attach_counting`) make
  some terminals counting ones (`tables.py`, "Relative targets"): a state's entry
  (t, -1) with `terminal_counts[t] = (c, 1, 0)` leads to the state plus the token's
  characters `token_counts[c, token]`, for every token of `terminal_bits[t]`.
  `second_terminals` [(state, terminal, target)] give those states a second entry.

  `guards` (the `_registers.Guards` of its explicit edges, `TokenPda.guards`) as in
  `pack_tables`: guarded edges are left out of the mask rows and listed per group, a
  group's list holding those of the groups popping a prefix of its pops too (the mask
  gathers the deepest matching group's). The stack-aware exclusion rows count them like
  any other edge (the device applies them after ORing in the guarded tokens).
  """
  automaton = _Automaton(
      num_states=token_pda.num_states, accepting=np.asarray(token_pda.accepting, bool),
      group_state=token_pda.group_state, group_pops=token_pda.group_pops,
      group_num_pops=token_pda.group_num_pops, edge_group=token_pda.edge_group,
      edge_token=token_pda.edge_token, edge_target=token_pda.edge_target,
      edge_push=token_pda.edge_push, push_symbols=token_pda.push_symbols,
      push_lengths=token_pda.push_lengths, terminal_bits=token_pda.terminal_bits,
      state_terminals=_state_terminals(token_pda, second_terminals),
      terminal_counts=terminal_counts, token_counts=token_counts)
  stack_depth = max(int(stack_depth), 1)
  needs = stack_needs(automaton)
  start_need = int(needs[0][token_pda.start])
  if start_need > stack_depth:
    needed = ("no stack depth suffices: no token sequence reaches the end"
              if start_need >= NO_FINISH else f"it needs a stack of {start_need}")
    raise CompileBudgetError(
        f"No input can finish within stack_depth={stack_depth}: {needed}. Expected "
        f"CompileOptions.stack_depth >= {start_need if start_need < NO_FINISH else '?'}; "
        "raise it or make the grammar's shortest completion shallower.")
  guarded = guards is not None and bool((guards.edge_guard >= 0).any())
  masked = None
  if guarded:
    unguarded = guards.edge_guard < 0
    masked = dataclasses.replace(automaton, edge_group=automaton.edge_group[unguarded],
                                 edge_token=automaton.edge_token[unguarded],
                                 edge_target=automaton.edge_target[unguarded],
                                 edge_push=automaton.edge_push[unguarded])
  tables = _pack(automaton, vocab, stack_depth=stack_depth, min_bucket=min_bucket,
                 masked=masked)
  limits, capped_rows, capped_bits = _capped_masks(
      automaton, tables.mask_bits.shape[1], vocab.vocab_size, min_bucket, needs)
  tables = dataclasses.replace(tables, capped_limits=limits, capped_rows=capped_rows,
                               capped_bits=capped_bits)
  if not guarded:
    return tables
  chains = _prefix_groups(automaton)
  return _with_guards(tables, guards, automaton.edge_group, len(automaton.group_state),
                      chains=chains)


def _state_terminals(token_pda, second: list | None) -> np.ndarray:
  """int32 `[S, R, 2]`: each state's terminal entry, and its second one if any (R = 2)."""
  first = np.stack([token_pda.state_terminal, token_pda.terminal_target], axis=-1)[:, None, :]
  if not second:
    return first
  more = np.full_like(first, NO_STATE)
  for state, terminal, target in second:
    more[state, 0] = (terminal, target)
  return np.concatenate([first, more], axis=1)


def _prefix_groups(a: _Automaton) -> list[list[int]]:
  """Per group, the groups of its state popping a prefix of its pops (itself last)."""
  pops = [tuple(int(x) for x in row[:n]) for row, n in zip(a.group_pops, a.group_num_pops)]
  by_key = {(state, popped): k
            for k, (state, popped) in enumerate(zip(a.group_state.tolist(), pops))}
  return [[by_key[state, popped[:n]] for n in range(len(popped) + 1)
           if (state, popped[:n]) in by_key]
          for state, popped in zip(a.group_state.tolist(), pops)]


def stack_needs(a: _Automaton) -> tuple[np.ndarray, np.ndarray]:
  """(need [S], need_return [S]) of a push-down automaton, int64, `NO_FINISH` for never.

  need(q): the least stack height above the current depth with which a row at q can
  reach a state where end is allowed: 0 for an accepting q, else the least requirement
  of q's pop-free edges (explicit edges of groups popping nothing, terminal edges),
  which apply whatever the stack holds. need_return(s): the same for the row once the
  return address s is popped, measured from the depth below s: 0 if s is final in its
  rule, else, over the accepting states whose group pops exactly (s,) (the row waits
  there, at a token boundary, before returning), the largest of each group's least
  edge requirement. An edge pushing U (bottom first) to t requires max(|U| + need(t),
  max_j (j + need_return(U_j))) above its base. Fixpoint from the top (rounds over all
  edges at once until nothing changes), so cycles with no way out stay `NO_FINISH`.
  """
  accepting = np.asarray(a.accepting, bool)
  n = a.num_states
  group_pops = np.asarray(a.group_num_pops)
  edge_pops = group_pops[a.edge_group]
  edge_target = np.asarray(a.edge_target).astype(np.int64)
  push = np.asarray(a.edge_push)
  symbols = np.asarray(a.push_symbols, np.int64)
  lengths = np.asarray(a.push_lengths, np.int64)
  positions = np.arange(symbols.shape[1], dtype=np.int64)[None, :]
  pop_free = np.nonzero(edge_pops == 0)[0]
  pop_free_source = np.asarray(a.group_state)[a.edge_group[pop_free]]
  # Groups of accepting states popping exactly one symbol: where a row waits to return.
  returning = (group_pops == 1) & accepting[a.group_state]
  returning_edges = np.nonzero(returning[a.edge_group])[0]
  returning_groups = np.nonzero(returning)[0]
  group_pop_symbols = np.asarray(a.group_pops)
  # No columns when nothing is ever pushed (only tail calls): then no group returns.
  returned_to = (group_pop_symbols[returning_groups, 0] if group_pop_symbols.shape[1]
                 else np.zeros(0)).astype(np.int64)
  term = np.asarray(a.state_terminals)
  has_term = (term[..., 0] >= 0) & (term[..., 1] >= 0)
  term_source = np.nonzero(has_term)[0]
  term_target = term[..., 1][has_term].astype(np.int64)
  counted_source, counted_target = _counting_moves(a)
  term_source = np.concatenate([term_source, counted_source])
  term_target = np.concatenate([term_target, counted_target])
  need = np.where(accepting, 0, NO_FINISH).astype(np.int64)
  need_return = need.copy()
  # Only these edges count (the others pop below the row's own pushes).
  counted = np.concatenate([pop_free, returning_edges])
  target, push = edge_target[counted], push[counted]
  returning_group = a.edge_group[returning_edges]
  requirements = _requirements_of(target, push, symbols, lengths, positions)
  while True:
    required = requirements(need, need_return)
    new_need = np.full(n, NO_FINISH, np.int64)
    np.minimum.at(new_need, pop_free_source, required[:len(pop_free)])
    np.minimum.at(new_need, term_source, need[term_target])
    new_need[accepting] = 0
    group_best = np.full(len(group_pops), NO_FINISH, np.int64)
    np.minimum.at(group_best, returning_group, required[len(pop_free):])
    new_return = np.full(n, -1, np.int64)
    np.maximum.at(new_return, returned_to, group_best[returning_groups])
    new_return = np.where(new_return < 0, NO_FINISH, new_return)
    new_return[accepting] = 0
    if np.array_equal(new_need, need) and np.array_equal(new_return, need_return):
      return need, need_return
    need, need_return = new_need, new_return


def _terminal_token_counts(a: _Automaton, terminal: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens ascending, characters of each) of a counting terminal."""
  vocab_size = a.token_counts.shape[1]
  words = np.asarray(a.terminal_bits[terminal], np.uint32)
  # As bools (the bits are 0/1): numpy's nonzero of a bool array is ~2.7x a uint8's.
  tokens = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little").view(bool))
  tokens = tokens[tokens < vocab_size]
  return tokens, a.token_counts[int(a.terminal_counts[terminal, 0]), tokens]


def _distinct_counts(a: _Automaton, terminal: int) -> np.ndarray:
  """int64: the characters a counting terminal's tokens have, ascending."""
  counts = _terminal_token_counts(a, terminal)[1].astype(np.int64)
  if not len(counts):
    return counts
  low = int(counts.min())
  return np.flatnonzero(np.bincount(counts - low)) + low


def _counted_tokens(a: _Automaton, terminal: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, characters of each) of a counting terminal, by characters ascending."""
  tokens, counts = _terminal_token_counts(a, terminal)
  # Counts are token lengths: a 16-bit stable sort is a radix sort (~13x int64's).
  narrow = (counts.astype(np.int16) if len(counts) and -(1 << 15) <= int(counts.min())
            and int(counts.max()) < 1 << 15 else counts)
  order = np.argsort(narrow, kind="stable")
  return tokens[order], counts[order].astype(np.int64)


def _counting_bits(a: _Automaton, terminal: int) -> list[tuple[int, np.ndarray]]:
  """(characters c, uint32 [W] the tokens of `terminal` with c characters) of a counting
  terminal, c ascending."""
  w = a.terminal_bits.shape[1]
  tokens, counts = _counted_tokens(a, terminal)
  values, starts = np.unique(counts, return_index=True)
  return [(int(c), bitmask(group, a.token_counts.shape[1])[:w])
          for c, group in zip(values.tolist(), np.split(tokens, starts[1:]))]


def _counting_state_terminals(a: _Automaton) -> list[tuple[int, int]]:
  """(state, terminal) of each counting entry."""
  if a.terminal_counts is None:
    return []
  term = np.asarray(a.state_terminals)
  ids = np.maximum(term[..., 0], 0)
  counting = (term[..., 0] >= 0) & (np.asarray(a.terminal_counts)[ids, 0] >= 0)
  states, slots = np.nonzero(counting)
  return list(zip(states.tolist(), term[states, slots, 0].tolist()))


def _counting_moves(a: _Automaton) -> tuple[np.ndarray, np.ndarray]:
  """(source, target) int64 of every move a counting terminal makes (one per count of
  its tokens, stride and bias applied): pop-free moves for `stack_needs`."""
  sources, targets = [], []
  cached: dict = {}
  for state, terminal in _counting_state_terminals(a):
    if terminal not in cached:
      cached[terminal] = _distinct_counts(a, terminal)
    _, stride, bias = (int(x) for x in a.terminal_counts[terminal])
    sources.append(np.full(len(cached[terminal]), state, np.int64))
    targets.append(state + stride * cached[terminal] + bias)
  if not sources:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)
  return np.concatenate(sources), np.concatenate(targets)


def _edge_requirements(need, need_return, target, push, symbols, lengths,
                       positions) -> np.ndarray:
  """int64 [E]: each edge's requirement above its base (see `stack_needs`)."""
  return _requirements_of(target, push, symbols, lengths, positions)(need, need_return)


def _requirements_of(target, push, symbols, lengths, positions):
  """`_edge_requirements` as a function of (need, need_return) alone, with what does not
  depend on them computed once (`stack_needs` asks once a fixpoint round)."""
  pushed_symbols = np.maximum(symbols, 0)
  no_symbol = symbols < 0
  pushed_lengths = lengths[push]
  target_index = np.maximum(target, 0)

  def requirements(need, need_return) -> np.ndarray:
    pushed = positions + need_return[pushed_symbols]
    pushed[no_symbol] = 0
    push_need = pushed.max(axis=1, initial=0)  # [U]
    return np.minimum(np.maximum(pushed_lengths + need[target_index], push_need[push]),
                      NO_FINISH)

  return requirements


def _capped_masks(a: _Automaton, w: int, vocab_size: int, min_bucket: int,
                  needs: tuple[np.ndarray, np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(capped_limits [G, L], capped_rows [G, L], capped_bits [X, W]): stack-aware masks.

  For group g as the deepest matching group, the tokens it allows (its own and its
  prefix groups' explicit edges, then its state's terminal tokens no explicit edge of
  those takes) each have a requirement r (module docstring); for each distinct r >= 1,
  v, the tokens with r >= v form one exclusion row (deduplicated across groups),
  removed when the row's free capacity is below v.
  """
  g_count = len(a.group_state)
  need, need_return = needs
  requirement = _edge_requirements(
      need, need_return, np.asarray(a.edge_target).astype(np.int64), np.asarray(a.edge_push),
      np.asarray(a.push_symbols, np.int64), np.asarray(a.push_lengths, np.int64),
      np.arange(np.asarray(a.push_symbols).shape[1], dtype=np.int64)[None, :]
  ) - np.asarray(a.group_num_pops)[a.edge_group]
  demanding = np.nonzero(requirement >= 1)[0]  # sorted by group, as the edges are
  demanding_groups = np.asarray(a.edge_group)[demanding]
  present, first = np.unique(demanding_groups, return_index=True)
  by_group = dict(zip(present.tolist(), np.split(demanding, first[1:])))
  pops = [tuple(int(x) for x in row[:n]) for row, n in zip(a.group_pops, a.group_num_pops)]
  by_key = {(state, popped): k for k, (state, popped)
            in enumerate(zip(np.asarray(a.group_state).tolist(), pops))}
  term = np.asarray(a.state_terminals)
  counting = dict(_counting_state_terminals(a))
  counting_bits: dict = {}
  rows: dict[bytes, int] = {bytes(num_words(vocab_size) * 4): 0}
  bits_list = [np.zeros(w, np.uint32)]
  per_group: list[list[tuple[int, int]]] = [[] for _ in range(g_count)]
  edge_starts = np.searchsorted(a.edge_group, np.arange(g_count + 1))
  for k, (state, popped) in enumerate(zip(np.asarray(a.group_state).tolist(), pops)):
    chain = [by_key[state, popped[:n]] for n in range(len(popped) + 1)
             if (state, popped[:n]) in by_key]
    edges = np.concatenate([by_group[h] for h in chain if h in by_group] + [demanding[:0]])
    tokens = np.asarray(a.edge_token)[edges].astype(np.int64)
    levels = requirement[edges]
    parts = []  # (tokens, level) of the state's terminal entries
    for terminal, target in term[state].tolist():
      if terminal >= 0 and counting.get(state) == terminal:
        _, stride, bias = (int(x) for x in a.terminal_counts[terminal])
        if terminal not in counting_bits:  # Once per terminal (not per group).
          counting_bits[terminal] = _counting_bits(a, terminal)
        parts += [(bits, int(need[state + stride * c + bias]))
                  for c, bits in counting_bits[terminal]
                  if need[state + stride * c + bias] >= 1]
      elif terminal >= 0 and target >= 0 and need[target] >= 1:
        parts.append((a.terminal_bits[terminal][:w], int(need[target])))
    if parts:  # (Entries hold disjoint tokens: a saturating chain's second entry.)
      covered = bitmask(np.concatenate(
          [np.asarray(a.edge_token)[edge_starts[h]:edge_starts[h + 1]] for h in chain]),
          vocab_size)
      parts = [(bits.astype(np.uint32) & ~covered, level) for bits, level in parts]
    values = set(levels.tolist()) | {level for _, level in parts}
    for v in sorted(values):
      row = bitmask(tokens[levels >= v], vocab_size)
      for bits, level in parts:
        if level >= v:
          row |= bits
      key = row.tobytes()
      if key not in rows:
        rows[key] = len(bits_list)
        bits_list.append(row)
      per_group[k].append((min(v, CAP_PAD), rows[key]))
  g_pad = bucket_size(g_count, min_bucket)
  l_pad = bucket_size(max((len(x) for x in per_group), default=0), 1)
  limits = np.full((g_pad, l_pad), CAP_PAD, np.int32)
  capped_rows = np.zeros((g_pad, l_pad), np.int32)
  for k, entries in enumerate(per_group):
    for l, (v, row) in enumerate(entries):
      limits[k, l], capped_rows[k, l] = v, row
  capped_bits = np.zeros((bucket_size(len(bits_list), min_bucket), w), np.uint32)
  capped_bits[:len(bits_list)] = bits_list
  return limits, capped_rows, capped_bits


def _group_masks(a: _Automaton, w: int, min_bucket: int,
                 edge_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Deduplicated mask rows: (mask_bits [M_pad, W], row of each group [G]).

  The groups of a state that match one stack are those whose pops are prefixes of the
  deepest match's, so a group's row is the union of its own tokens (`_own_rows`) and
  those of its state's groups that pop a prefix of its pops: the allowed set when it is
  the deepest matching group, one row gathered per step however many match. When no
  group pops (token DFAs) the rows are the own rows.
  """
  own_bits, own_row = _own_rows(a, w, min_bucket, edge_start)
  if a.regular or not a.group_num_pops.any():
    return own_bits, own_row
  rows: dict[tuple[int, ...], int] = {}
  row_of_group = np.array([rows.setdefault(chain, len(rows))
                           for chain in _prefix_chains(a, own_row)], np.int32)
  # Whole-row ORs of own rows, so a root group with a million edges is not expanded
  # once per descendant.
  mask_bits = np.zeros((bucket_size(len(rows), min_bucket), w), np.uint32)
  for chain, row in rows.items():
    np.bitwise_or.reduce(own_bits[list(chain)], axis=0, out=mask_bits[row])
  return mask_bits, row_of_group


def _own_rows(a: _Automaton, w: int, min_bucket: int,
              edge_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each group's own tokens, deduplicated: (rows [M_pad, W], row of each group [G]).

  A group's own tokens are its explicit edges (`edge_start[g]:edge_start[g + 1]`), plus
  its state's terminal bitmaps when it pops nothing (terminal edges apply whatever the
  stack holds; every push-down state has a pop-free group). Each row is written once,
  by the first group holding it.
  """
  if a.regular:
    terminals = a.state_terminals[:, :, 0]
  else:
    terminals = np.where((a.group_num_pops == 0)[:, None],
                         a.state_terminals[a.group_state, :, 0], -1)
  terminals = np.ascontiguousarray(terminals, np.int32)
  starts = edge_start.tolist()
  row_of_group, first = _distinct_groups(a.edge_token, starts, terminals)
  bits = np.zeros((bucket_size(len(first), min_bucket), w), np.uint32)
  _copy_terminal_rows(bits, [(row, terms) for row, terms in enumerate(terminals[first].tolist())
                             if max(terms, default=-1) >= 0], a.terminal_bits)
  lo, hi = [starts[k] for k in first], [starts[k + 1] for k in first]
  if len(a.edge_token) - (sum(hi) - sum(lo)) > _DUPLICATE_EDGES:
    # Only the rows' first groups set bits: their edges, copied slice by slice.
    _set_bits(bits, np.repeat(np.arange(len(first)), np.subtract(hi, lo)),
              np.concatenate([a.edge_token[l:h] for l, h in zip(lo, hi)]))
  else:  # Setting a row's bits twice changes nothing: skip filtering.
    _set_bits(bits, np.repeat(row_of_group, edge_start[1:] - edge_start[:-1]), a.edge_token)
  return bits, row_of_group


# Edges of duplicate rows above which `_own_rows` copies out the edges of the rows' first
# groups (~0.3 us a row) rather than setting the bits of every edge (~8 ns an edge).
_DUPLICATE_EDGES = 512


def _distinct_groups(tokens: np.ndarray, edge_start: list[int],
                     terminals: np.ndarray) -> tuple[np.ndarray, list[int]]:
  """Numbers the groups' distinct (terminal ids, explicit tokens) in order of first use.

  Returns (row of each group int32 [G], first group of each row [M], ascending). Keys
  are raw bytes, one comprehension over the groups (no per-group numpy calls); the first
  group holding a key stands for its row.
  """
  tok_bytes = np.asarray(tokens, np.int32).tobytes()
  r4 = 4 * terminals.shape[1]
  term_bytes = terminals.tobytes()
  first_of: dict[bytes, int] = {}
  first_group = [first_of.setdefault(term_bytes[r4 * k:r4 * (k + 1)] + tok_bytes[4 * lo:4 * hi], k)
                 for k, (lo, hi) in enumerate(zip(edge_start[:-1], edge_start[1:]))]
  first = list(first_of.values())
  row_of_first = np.zeros(len(first_group), np.int32)
  row_of_first[first] = np.arange(len(first))
  return row_of_first[first_group], first


def _copy_terminal_rows(bits: np.ndarray, written: list, terminal_bits: np.ndarray) -> None:
  """Writes terminal bitmaps into rows of `bits` (still zero): (row, terminal ids, -1
  for none) pairs.

  Row by row, in place: the first terminal is copied and later ones ORed into the row
  view, so no `[rows, W]` temporaries are gathered (each row is 32 KiB for 262k tokens).
  """
  for row, terminals in written:
    view, empty = bits[row], True
    for terminal in terminals:
      if terminal >= 0:
        if empty:
          view[:] = terminal_bits[terminal]
          empty = False
        else:
          view |= terminal_bits[terminal]


def _prefix_chains(a: _Automaton, own_row: np.ndarray) -> list[tuple[int, ...]]:
  """Per group, the sorted own rows of its state's groups popping a prefix of its pops."""
  by_key = {}
  pops = [tuple(int(x) for x in row[:n]) for row, n in zip(a.group_pops, a.group_num_pops)]
  for k, (state, popped) in enumerate(zip(a.group_state.tolist(), pops)):
    by_key[state, popped] = k
  chains = []
  for k, (state, popped) in enumerate(zip(a.group_state.tolist(), pops)):
    prefixes = (by_key.get((state, popped[:n])) for n in range(len(popped) + 1))
    chains.append(tuple(sorted({int(own_row[h]) for h in prefixes if h is not None})))
  return chains


def _pack(a: _Automaton, vocab, *, stack_depth: int, min_bucket: int,
          masked: _Automaton | None = None) -> ConstraintTables:
  """Packs `a`; its mask rows from `masked` (the same groups, fewer edges) when given."""
  s, g, e = a.num_states, len(a.group_state), len(a.edge_token)
  w = num_words(vocab.vocab_size)
  s_pad, g_pad, e_pad = bucket_size(s, min_bucket), bucket_size(g, min_bucket), bucket_size(
      e, min_bucket)
  # Edges are sorted by group: group k's are those before the first of group k + 1.
  edge_start = np.full(g_pad + 1, e, np.int32)
  edge_start[:g + 1] = a.edge_group.searchsorted(np.arange(g + 1, dtype=a.edge_group.dtype))
  if masked is None:
    mask_bits, row_of_group = _group_masks(a, w, min_bucket, edge_start[:g + 1])
  else:
    mask_bits, row_of_group = _group_masks(
        masked, w, min_bucket,
        masked.edge_group.searchsorted(np.arange(g + 1, dtype=masked.edge_group.dtype)))
  state_groups = _state_groups(a, s_pad)
  group_mask = np.zeros(g_pad, np.int32)
  group_mask[:g] = row_of_group
  group_pops = np.full((g_pad, a.group_pops.shape[1]), NO_STATE, np.int32)
  group_num_pops = np.zeros(g_pad, np.int32)
  edge_pushes = np.zeros(e_pad, np.int32)
  if not a.regular:  # A token DFA pops and pushes nothing: these stay empty.
    group_pops[:g] = a.group_pops
    group_num_pops[:g] = a.group_num_pops
    edge_pushes[:e] = a.edge_push
  edge_tokens = _padded(a.edge_token, e_pad, PAD_TOKEN)
  edge_targets = _padded(a.edge_target, e_pad, NO_STATE)
  accepting = np.zeros(s_pad, bool)
  accepting[:s] = a.accepting
  terminal_bits = _padded_terminal_bits(a, w)
  state_terminals = np.full((s_pad, a.state_terminals.shape[1], 2), NO_STATE, np.int32)
  state_terminals[:s] = a.state_terminals
  return ConstraintTables(
      start=np.zeros(1, np.int32), accepting=accepting, mask_bits=mask_bits,
      state_groups=state_groups, group_mask=group_mask, group_pops=group_pops,
      group_num_pops=group_num_pops, edge_start=edge_start, edge_tokens=edge_tokens,
      edge_targets=edge_targets, edge_pushes=edge_pushes,
      push_symbols=np.asarray(a.push_symbols, np.int32),
      push_lengths=np.asarray(a.push_lengths, np.int32),
      eos_bits=bitmask(np.asarray(vocab.eos_ids, np.int64), vocab.vocab_size),
      terminal_bits=terminal_bits, state_terminals=state_terminals,
      state_terminal_rows=np.zeros(0, np.int32),
      terminal_counts=_padded_terminal_counts(a, terminal_bits.shape[0]),
      token_counts=(np.zeros((0, vocab.vocab_size), np.int8) if a.token_counts is None
                    else np.asarray(a.token_counts, np.int8)),
      vocab_size=vocab.vocab_size, stack_depth=stack_depth,
      vocab_fingerprint=vocab.fingerprint,
      edge_search_steps=edge_search_steps(edge_start, min_bucket))


def _padded_terminal_counts(a: _Automaton, size: int) -> np.ndarray:
  """int32 `[T_pad, 3]`: the counting terminals' (row, stride, bias), -1 elsewhere."""
  out = np.full((size, 3), NO_STATE, np.int32)
  if a.terminal_counts is not None:
    out[:len(a.terminal_counts)] = a.terminal_counts
  return out


def _padded(values: np.ndarray, size: int, fill: int) -> np.ndarray:
  """int32 `[size]`: `values`, then `fill` (each entry written once: these are ~E long)."""
  out = np.empty(size, np.int32)
  out[:len(values)] = values
  out[len(values):] = fill
  return out


def _padded_terminal_bits(a: _Automaton, w: int) -> np.ndarray:
  """uint32 `[T_pad, W]`: the terminal bitmaps, zero rows appended up to a power of two.

  A token DFA's bitmaps are an array of its own (`compose_token_dfa` stacks them): used
  as they are when no padding is needed, saving a copy of 32 KiB per terminal.
  """
  num_terminals = a.terminal_bits.shape[0]
  t_pad = bucket_size(num_terminals, 1)
  if (a.regular and t_pad == num_terminals and a.terminal_bits.dtype == np.uint32
      and a.terminal_bits.shape[1] == w):
    return a.terminal_bits
  terminal_bits = np.zeros((t_pad, w), np.uint32)
  terminal_bits[:num_terminals] = a.terminal_bits
  return terminal_bits


def _state_groups(a: _Automaton, s_pad: int) -> np.ndarray:
  """int32 `[S_pad, K]`: the groups of each state, -1 padded (groups sorted by state)."""
  s, g = a.num_states, len(a.group_state)
  if a.regular:
    state_groups = np.full((s_pad, 1), NO_STATE, np.int32)
    state_groups[:s, 0] = np.arange(s)
    return state_groups
  groups_per_state = np.bincount(a.group_state, minlength=s)
  k = max(int(groups_per_state.max(initial=0)), 1)
  state_groups = np.full((s_pad, k), NO_STATE, np.int32)
  first_group = np.zeros(s + 1, np.int64)
  np.cumsum(groups_per_state, out=first_group[1:])
  rank = np.arange(g) - first_group[a.group_state]
  state_groups[a.group_state, rank] = np.arange(g)
  return state_groups


def _set_bits(bits: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> None:
  """ORs token bits into `bits[rows]`: whole groups of edges, each sorted by token, where
  the groups of one row hold the same tokens.

  `np.bitwise_or.at` (unbuffered, fast since numpy 1.25) costs ~8 ns an edge. When words
  hold several tokens (dense groups, as in push-down tables), the runs of equal words
  are ORed with `np.bitwise_or.reduceat` and written once, several times faster.
  """
  key = rows.astype(np.int64) * bits.shape[1] + (tokens >> 5)
  token_bits = np.uint32(1) << (tokens & 31).astype(np.uint32)
  if len(key) > _DENSE_CHECK_EDGES:
    word_ends = key[1:] != key[:-1]
    if 2 * np.count_nonzero(word_ends) < len(key):  # Two tokens or more a word on average.
      runs = np.flatnonzero(np.concatenate(([True], word_ends)))
      # A row's groups give its words the same bits in every run: `|=` may write a word
      # several times, always with the same value.
      bits.reshape(-1)[key[runs]] |= np.bitwise_or.reduceat(token_bits, runs)
      return
  np.bitwise_or.at(bits.reshape(-1), key, token_bits)


# Edges above which `_set_bits` checks whether words hold several tokens (the check costs
# ~3% of `np.bitwise_or.at`; dense push-down groups have ~1M edges).
_DENSE_CHECK_EDGES = 1 << 16


def share_groups(edge_start: np.ndarray, edge_tokens: np.ndarray, edge_targets: np.ndarray,
                 group_mask: np.ndarray, c: int, min_bucket: int, *,
                 group_excluded: np.ndarray | None = None):
  """Groups 0..c-1 (of a regular table set) with the same mask row (and exclusion row,
  when `group_excluded` is given) and the same explicit edges, targets included, merged
  into one: (group of each int64 [c], the replaced fields: edge_start, edge_tokens,
  edge_targets, edge_pushes, group_mask, group_pops, group_num_pops, and group_excluded
  when given), or None when all differ.

  Relative targets make the states of a chain's layers far from its ends alike (a token
  ending in `\\` leads to the state after the backslash, one layer on, from every
  layer): their edges are stored once.
  """
  bounds = edge_start[:c + 1].astype(np.int64).tolist()
  tokens = edge_tokens[:bounds[c]].astype(np.int32).tobytes()
  targets = edge_targets[:bounds[c]].astype(np.int32).tobytes()
  excluded = ([0] * c if group_excluded is None
              else np.asarray(group_excluded[:c]).tolist())
  masks = np.asarray(group_mask[:c]).tolist()
  index: dict = {}
  keep: list[int] = []
  group_of = [0] * c
  for g in range(c):
    lo, hi = 4 * bounds[g], 4 * bounds[g + 1]
    key = (masks[g], excluded[g], tokens[lo:hi], targets[lo:hi])
    k = index.get(key)
    if k is None:
      k = index[key] = len(keep)
      keep.append(g)
    group_of[g] = k
  group_of = np.array(group_of, np.int64)
  if len(keep) == c:
    return None
  kept = np.array(keep, np.int64)
  start = np.asarray(bounds, np.int64)
  sizes = start[kept + 1] - start[kept]
  new_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  e = int(new_start[-1])
  take = np.repeat(start[kept] - new_start[:-1], sizes) + np.arange(e)
  g_pad = bucket_size(len(kept), min_bucket)
  e_pad = bucket_size(e, min_bucket)
  out_start = np.full(g_pad + 1, e, np.int32)
  out_start[:len(kept) + 1] = new_start
  out_mask = np.zeros(g_pad, np.int32)
  out_mask[:len(kept)] = group_mask[kept]
  more = {}
  if group_excluded is not None:
    more["group_excluded"] = _padded(np.asarray(group_excluded)[kept], g_pad, 0)
  return group_of, dict(**more,
      edge_start=out_start,
      edge_tokens=_padded(edge_tokens[take], e_pad, PAD_TOKEN),
      edge_targets=_padded(edge_targets[take], e_pad, NO_STATE),
      edge_pushes=np.zeros(e_pad, np.int32), group_mask=out_mask,
      group_pops=np.full((g_pad, 0), NO_STATE, np.int32),
      group_num_pops=np.zeros(g_pad, np.int32))

"""Edge arrays of a compressed counted chain (`_counting._compose_compressed`), in numpy.

Split from `_counting.py`: the chain states' trie walk (one position per class of
positions that read every token alike, its edges copied to the others), the edge sort,
liveness by breadth-first search, and the per-state counting entry lists as a table
deduplicated by rows. Each replaces a general routine that costs more on a chain's
thousands of states; `tests/automata/counting_fast_paths_test.py` and
`chain_dfa_test.py` check each against what it replaces.

Public names:
  walk_chain(...)        the explicit edges of every chain state.
  sorted_edges(...)      edges sorted by (group, token).
  live_states(...)       reachable and co-reachable states.
  entry_table(...)       the counting entries of each state as an int64 table.
  unique_rows(rows)      np.unique(rows, axis=0, return_inverse=True), faster.
"""

import itertools

import numpy as np

from constrained_decoding.automata import _compose
from constrained_decoding.errors import CompileBudgetError


def sorted_edges(group: np.ndarray, tok: np.ndarray, target: np.ndarray, num_groups: int,
                  vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The edges sorted by (group, token), pairs that are unique: one sort of an int64 key
  of bit fields (group, token, target - its least value) instead of an argsort and three
  gathers, as `_compose._sorted_edges` (an argsort when the fields take over 63 bits)."""
  low = int(target.min(initial=0))
  group_bits, token_bits, target_bits = (max(int(x - 1).bit_length(), 1) for x in (
      num_groups, vocab_size, int(target.max(initial=0)) - low + 1))
  if group_bits + token_bits + target_bits > 63:
    order = np.argsort(group * vocab_size + tok, kind="stable")
    return group[order], tok[order], target[order]
  key = ((group << token_bits | tok) << target_bits) | (target - low)
  key.sort()
  return (key >> (token_bits + target_bits), key >> target_bits & ((1 << token_bits) - 1),
          (key & ((1 << target_bits) - 1)) + low)


def walk_chain(dfa, subtrie, cell: np.ndarray, stride: int, n2: int, m2: int, span: int,
                budget: dict) -> list:
  """`_compose._walk(dfa, subtrie, chain states)`, walking one position per class of
  positions that read every token alike and copying its edges to the others.

  A token (at most span - 2 bytes, each X at least one) read from position j stays
  within positions j..j + span - 2, where X's moves are the same everywhere; what differs
  is only whether S can be read (positions >= n2) and where the chain ends (m2). So
  positions with the same (min(max(n2 - j, 0), span), min(m2 - j, span)) have the same
  edges, relative to their cells, and their targets never reach m2 (m2 - j >= span
  when several positions share a class). Needs cells numbered position by position
  (`_chain_dfa.build`'s numbering); otherwise every chain state is walked.
  """
  chain_states = np.unique(cell[cell >= 0])
  first = int(cell[0, 0])
  j = np.arange(m2)
  if not np.array_equal(cell[:m2], first + j[:, None] * stride + np.arange(stride)):
    return _compose._walk(dfa, subtrie, chain_states, **budget)
  signature = (np.minimum(np.maximum(n2 - j, 0), span) * (span + 1)
               + np.minimum(m2 - j, span))
  _, firsts, inverse = np.unique(signature, return_index=True, return_inverse=True)
  rep = firsts[inverse.reshape(-1)]  # Each position's representative: the first alike.
  walked = np.concatenate([cell[np.flatnonzero(rep == j)].reshape(-1), cell[m2, :1]])
  walked = np.unique(walked[walked >= 0])
  parts = _compose._walk(dfa, subtrie, walked, **budget)
  copied = np.flatnonzero(rep != j)
  if not len(copied) or not parts:
    return parts
  src, tok, dst = (np.asarray(a, np.int64) for a in _compose._concatenate_columns(parts))
  # Positions to copy to, grouped by representative: `shift[lo[r]:lo[r] + count[r]]`.
  by_rep = np.argsort(rep[copied], kind="stable")
  shift = (copied - rep[copied])[by_rep]
  count = np.bincount(rep[copied], minlength=m2 + 1)
  lo = np.cumsum(count) - count
  src_position = np.where((src >= first) & (src < first + m2 * stride),
                          (src - first) // stride, m2)
  per_edge = count[src_position]
  total = int(per_edge.sum())
  if len(src) + total > budget["max_edges"]:
    raise CompileBudgetError(
        f"{budget['what']} needs more than {budget['max_edges']} explicit token edges. "
        "Expected at most CompileOptions.max_edges. Raise it, or bound the repetition.")
  index = np.arange(total) + (lo[src_position] - (np.cumsum(per_edge) - per_edge)).repeat(
      per_edge)
  step = shift[index] * stride
  in_chain = (dst >= first) & (dst <= first + m2 * stride)
  return [(src, tok, dst), (src.repeat(per_edge) + step, tok.repeat(per_edge),
                            dst.repeat(per_edge) + np.where(in_chain.repeat(per_edge), step, 0))]


def live_states(num_states: int, src: np.ndarray, dst: np.ndarray, start: int,
                 accepting: np.ndarray) -> np.ndarray:
  """`_compose._live_states` (reachable from `start` and co-reachable from `accepting`)
  by breadth-first search in numpy instead of a Python loop per state pair: a
  compressed chain has few levels (a token moves up to `span` positions), so the
  per-level numpy calls cost less than visiting its thousands of pairs in Python."""
  pairs = np.sort(src.astype(np.int64) * num_states + dst)
  pairs = pairs[np.diff(pairs, prepend=-1) != 0]
  heads, tails = pairs // num_states, pairs % num_states
  back = np.argsort(tails, kind="stable")
  return (_reached(np.array([start]), heads, tails, num_states)
          & _reached(np.flatnonzero(accepting), tails[back], heads[back], num_states))


def _reached(seeds: np.ndarray, heads: np.ndarray, tails: np.ndarray,
             num_states: int) -> np.ndarray:
  """bool [num_states]: the states reachable from `seeds` by arcs heads -> tails
  (`heads` sorted), one level a step."""
  first = np.searchsorted(heads, np.arange(num_states + 1))
  seen = np.zeros(num_states, bool)
  seen[seeds] = True
  frontier = np.flatnonzero(seen)
  while len(frontier):
    lo, count = first[frontier], first[frontier + 1] - first[frontier]
    reached = tails[np.arange(int(count.sum())) + (lo - (np.cumsum(count) - count)).repeat(count)]
    reached = reached[~seen[reached]]
    seen[reached] = True
    frontier = np.unique(reached)
  return seen


def entry_table(entries_of: dict, live: np.ndarray, width: int) -> np.ndarray:
  """int64 [Q, width, 2]: each live state's counting entries (terminal, filter) from
  `entries_of`, padded with -1 (dead states and states without entries: all -1).

  States that share one list object (`CountingTerminals.add_chain` gives each (slot, r)
  one) are filled from one row: the entries are read once per distinct list."""
  table = np.full((len(live), width, 2), -1, np.int64)
  if not entries_of:
    return table
  states = np.fromiter(entries_of, np.int64, len(entries_of))
  values = list(entries_of.values())
  _, first, list_of = np.unique(np.fromiter(map(id, values), np.uint64, len(values)),
                                return_index=True, return_inverse=True)
  distinct = [values[i] for i in first.tolist()]
  lengths = np.fromiter(map(len, distinct), np.int64, len(distinct))
  flat = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(
      distinct)), np.int64, 2 * int(lengths.sum())).reshape(-1, 2)
  rows = np.full((len(distinct), width, 2), -1, np.int64)
  rows[np.arange(len(distinct)).repeat(lengths),
       np.arange(len(flat)) - (np.cumsum(lengths) - lengths).repeat(lengths)] = flat
  keep = live[states]
  table[states[keep]] = rows[list_of.reshape(-1)[keep]]
  return table


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(distinct rows in lexicographic order, index of each row among them): what
  `np.unique(rows, axis=0, return_inverse=True)` returns, by one lexsort over the
  columns (np.unique sorts the rows as structured scalars, several times slower)."""
  order = np.lexsort(rows.T[::-1])
  ordered = rows[order]
  first = np.ones(len(rows), bool)
  first[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
  inverse = np.empty(len(rows), np.int64)
  inverse[order] = np.cumsum(first) - 1
  return ordered[first], inverse

"""Loops of a byte DFA and their terminal bitmaps: the data of wide states (`_wide.py`).

A wide state's *loop* is the set of states on short cycles through it, renumbered
canonically so that every constraint with the same character class (every JSON string
body) has the same loop automaton, hence the same cached terminal. This module holds
the pure parts: finding and canonicalizing loops, walking the vocabulary trie in a loop
automaton (`LoopTerminal`, `LoopExits`), the covers of tokens ending inside a loop
(`InsideCover`) and the per-state result (`WideEdge`). `_wide.WideStates` decides which
states are wide and caches terminals per vocabulary; `_near_loop.py` reuses loops for
states that move like them. Both import this module, neither imports the other's
caller.

Public names:
  LoopExits, loop_exits(...)        a terminal's sub-trie walked in its loop automaton.
  LoopTerminal, build_loop_terminal(...), with_subtrie(...)  one loop shape's bitmap.
  InsideCover, inside_cover(...)    terminals for tokens ending inside a loop.
  WideEdge                          a state's terminal edge.
  canonical_loop, loop_digest, token_bits, state_predecessors, member_mask  helpers.
"""

import dataclasses
import functools
import hashlib

import numpy as np

from constrained_decoding import _arrays
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie

# A state is a candidate when this many single bytes loop on it directly.
MIN_SELF_LOOP_BYTES = 16
# ... and becomes wide when its bitmap holds at least this many tokens.
MIN_TERMINAL_TOKENS = 1024
# A loop state other than the anchor where at least this many tokens end gets its own
# terminal edge (`InsideCover`) instead of one explicit edge per token and state.
MIN_INSIDE_TOKENS = 64
# Loops are cycles through the wide state of at most this many bytes: a backslash
# escape followed by a 4-byte character, or a `\uXXXX` escape.
MAX_LOOP_BYTES = 6


@dataclasses.dataclass(frozen=True, eq=False)
class LoopExits:
  """The sub-trie of a terminal walked in its loop automaton alone (`LoopTerminal.exits`).

  Every sub-trie node is reached from the root by reading its bytes in the loop
  automaton from the terminal's entry (after the first byte, for `after_first_byte`)
  until a byte the loop automaton has no transition for: that node is an *exit*. For a
  DFA state p whose bytes move like loop state i (p = phi(i) for the loop's states
  phi), the walk from p is this one read through phi up to each exit, and a plain DFA
  walk after it, from phi(from) on the exit byte. So composition reads a wide state's
  explicit edges from these arrays and walks only past the exits.

  Attributes:
    node_end: int32 `[N]`; node n's subtree is the nodes n..node_end[n]-1 (the trie is
      numbered depth first).
    inside_node, inside_token, inside_state: int32 `[I]`, sorted by node: tokens whose
      bytes stay in the loop automaton, and the loop state they end in.
    exit_node, exit_from, exit_byte: int32 `[X]`, sorted by node: exits, the loop state
      before their last byte, and that byte.
    full_node: int32 `[N]`; each sub-trie node's node in the full trie. Every token
      below an exit leaves the loop, so is in the sub-trie (the sub-trie keeps all tokens
      of their first bytes that the bitmap does not hold): below an exit, walking the
      full trie is walking the sub-trie, and composition walks every exit together with
      the other states' walks, in one pass over the full trie.
    group_from, group_byte, group_start, group_full_node: the exits grouped by (loop
      state, byte): group k's full-trie nodes are
      `group_full_node[group_start[k]:group_start[k+1]]`; one DFA lookup per group.
  """

  node_end: np.ndarray
  inside_node: np.ndarray
  inside_token: np.ndarray
  inside_state: np.ndarray
  exit_node: np.ndarray
  exit_from: np.ndarray
  exit_byte: np.ndarray
  full_node: np.ndarray
  group_from: np.ndarray
  group_byte: np.ndarray
  group_start: np.ndarray
  group_full_node: np.ndarray


def _subtree_ends(trie: VocabTrie) -> np.ndarray:
  """int32 `[N]`: one past the last node of each node's subtree (depth-first numbering)."""
  # The last descendant is reached by following last children; pointer jumping does
  # that in O(log depth) gathers.
  last = np.arange(trie.num_nodes)
  has_children = trie.child_start[1:] > trie.child_start[:-1]
  last[has_children] = trie.child_node[trie.child_start[1:][has_children] - 1]
  while True:
    jumped = last[last]
    if np.array_equal(jumped, last):
      return (last + 1).astype(np.int32)
    last = jumped


def loop_exits(loop: np.ndarray, entry: int, subtrie: VocabTrie, full_node: np.ndarray, *,
               after_first_byte: bool) -> LoopExits:
  """`LoopExits` of `subtrie` walked in the loop automaton `loop` from `entry`.

  `full_node` maps the sub-trie's nodes to the full trie's (`LoopExits.full_node`).
  """
  node_end = _subtree_ends(subtrie)
  inside, exits = [], []
  lo, hi = subtrie.child_start[0], subtrie.child_start[1]
  node = subtrie.child_node[lo:hi].astype(np.int64)
  if after_first_byte:
    state = np.full(len(node), entry, np.int64)
  else:
    state = loop[entry, subtrie.child_byte[lo:hi]].astype(np.int64)
    out = state == NO_STATE
    exits.append((node[out], np.full(int(out.sum()), entry), subtrie.child_byte[lo:hi][out]))
    node, state = node[~out], state[~out]
  while len(node):
    count = subtrie.token_start[node + 1] - subtrie.token_start[node]
    hit = np.flatnonzero(count)
    rep = np.repeat(hit, count[hit])
    first = np.repeat(subtrie.token_start[node[hit]] - (np.cumsum(count[hit]) - count[hit]),
                      count[hit]) + np.arange(len(rep))
    inside.append((node[rep], subtrie.token_ids[first], state[rep]))
    pair, slot = subtrie.child_slots(node)
    byte = subtrie.child_byte[slot]
    nxt = loop[state[pair], byte]
    out = nxt == NO_STATE
    exits.append((subtrie.child_node[slot[out]], state[pair[out]], byte[out]))
    node, state = subtrie.child_node[slot[~out]].astype(np.int64), nxt[~out].astype(np.int64)

  def sorted_columns(parts):
    columns = [np.concatenate([np.asarray(p[k], np.int64) for p in parts] or
                              [np.zeros(0, np.int64)]) for k in range(3)]
    order = np.argsort(columns[0], kind="stable")
    return [c[order].astype(np.int32) for c in columns]

  inside_columns, exit_columns = sorted_columns(inside), sorted_columns(exits)
  full_node = np.asarray(full_node, np.int32)
  exit_node, exit_from, exit_byte = exit_columns
  key = exit_from.astype(np.int64) * 256 + exit_byte
  order = np.argsort(key, kind="stable")
  key = key[order]
  starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, int)
  return LoopExits(node_end, *inside_columns, *exit_columns, full_node=full_node,
                   group_from=(key[starts] // 256).astype(np.int32),
                   group_byte=(key[starts] % 256).astype(np.int32),
                   group_start=np.r_[starts, len(key)].astype(np.int64),
                   group_full_node=full_node[exit_node[order]])


@dataclasses.dataclass(frozen=True, eq=False)
class LoopTerminal:
  """The terminal of one loop shape.

  Attributes:
    key: Hex digest of the canonical loop automaton.
    bits: uint32 `[W]`; tokens whose path from the loop's state stays in the loop and
      returns to it.
    num_tokens: Number of bits set.
    subtrie: Trie of every other token with text (and their prefixes), to find the
      explicit edges of a wide state; None until `WideStates.with_subtrie` builds it
      (most candidate loops are rejected on `num_tokens` alone, and the sub-trie of a
      narrow loop is nearly the whole trie).
    loop, entry, after_first_byte: The loop automaton and how the terminal enters it
      (`build_loop_terminal`); None for a terminal that is not a loop's (then `exits`
      is None).
    full_node: int32 `[N]`, the full-trie node of each sub-trie node (for `exits`).
    first_bytes: bool `[256]` or None (all): the sub-trie keeps only tokens starting
      with these bytes (the others cannot be read where the terminal is used).
  """

  key: str
  bits: np.ndarray
  num_tokens: int
  subtrie: VocabTrie | None
  loop: np.ndarray | None = None
  entry: int = 0
  after_first_byte: bool = False
  full_node: np.ndarray | None = None
  first_bytes: np.ndarray | None = None

  @functools.cached_property
  def exits(self) -> LoopExits | None:
    """The sub-trie walked in the loop automaton (built on first use, kept in memory)."""
    if self.loop is None or self.full_node is None:
      return None
    return loop_exits(self.loop, self.entry, self.subtrie, self.full_node,
                      after_first_byte=self.after_first_byte)


def _loop_states(dfa: ByteDfa, q: int, skip: np.ndarray,
                 predecessors: "Predecessors | None" = None) -> list[int]:
  """States on short cycles through q, in canonical (BFS, byte order) order, q first.

  Only cycles of at most MAX_LOOP_BYTES bytes count (one character, or an escape and a
  character), so that the loop describes q's character class and nothing of the
  surrounding constraint: its terminal is then shared by every constraint that has the
  same class (every JSON string body, say). Cycles through `skip` states (spliced
  copies) do not count: a one-byte extra value would otherwise pull an extra key's
  whole frame (`":1,"a`) into the key body's loop, and the key's declared-prefix
  states out of the near-loop search.

  Plain Python over the rows of the few states near q (a ball of a few dozen states):
  cheaper than numpy calls on arrays that small.
  """
  # Byte classes are byte ranges in order, so the class table gives the same distances
  # and the same first-byte order as the byte table, reading fewer columns.
  table = dfa.byte_classes[0]
  rows: dict[int, list[int]] = {}  # Distinct targets per state, shared by both searches.
  if predecessors is not None:
    in_loop = _cycle_states(table, q, skip, predecessors, rows)
  else:
    in_loop = _cycle_states_forward(table, q, skip)
  # Canonical numbering: BFS from q, successors in order of their first byte.
  order, seen = [q], {q}
  for s in order:  # `order` grows while it is read.
    for t in _distinct_row(table, rows, s):
      if t in in_loop and t not in seen:
        seen.add(t)
        order.append(t)
  return order


def _distinct_row(table: np.ndarray, rows: dict, s: int) -> list[int]:
  """The distinct targets of state s in order of their first byte, memoized in `rows`."""
  row = rows.get(s)
  if row is None:
    row = rows[s] = list(dict.fromkeys(table[s].tolist()))
  return row


def _cycle_states(table: np.ndarray, q: int, skip: np.ndarray, predecessors: "Predecessors",
                  rows: dict) -> dict[int, int]:
  """The states on cycles of at most MAX_LOOP_BYTES bytes through q (not through
  `skip`), searched backward first: the states within that many bytes *before* q are
  few (a string body's opening, a key), while those after it fan out into the rest of
  the constraint. Returned as a dict, state -> bytes from q; `rows` is a
  `_distinct_row` memo.

  Same set as `_cycle_states_forward`: s is on such a cycle iff ahead(s) + behind(s)
  <= MAX_LOOP_BYTES (shortest distances from and to q), and every state u on a
  shortest way q -> s of such an s has ahead(u) + behind(u) <= MAX_LOOP_BYTES too, so
  the forward search may skip every other state without changing those distances.
  """
  # The forward search below asks about states at most MAX_LOOP_BYTES - 1 bytes before
  # q (it takes a step first), so the backward search stops there: its widest level
  # (the most states fan in) is never read.
  behind = _distances(q, predecessors.lists(skip), MAX_LOOP_BYTES - 1)
  ahead, front = {q: 0}, [q]
  for step in range(1, MAX_LOOP_BYTES):
    reached = []
    for s in front:
      for t in _distinct_row(table, rows, s):
        if t not in ahead and step + behind.get(t, MAX_LOOP_BYTES + 1) <= MAX_LOOP_BYTES:
          ahead[t] = step
          reached.append(t)
    if not reached:
      break
    front = reached
  return ahead


def _cycle_states_forward(table: np.ndarray, q: int, skip: np.ndarray) -> set[int]:
  """`_cycle_states` without predecessors: the ball of MAX_LOOP_BYTES - 1 bytes after q,
  then the distances back to q inside it."""
  rows: dict[int, set[int]] = {}
  absent = {NO_STATE, *np.flatnonzero(skip).tolist()}

  def successors(s: int) -> set[int]:
    row = rows.get(s)
    if row is None:
      row = rows[s] = set(table[s].tolist()) - absent
    return row

  # A state s != q on such a cycle is at most MAX_LOOP_BYTES - 1 bytes from q, and so
  # is every state of a shortest way back from s to q: the ball around q holds them all.
  ahead = _distances(q, successors, MAX_LOOP_BYTES - 1)
  # Shortest distances back to q inside the ball, up to the cycle bound.
  before: dict[int, list[int]] = {s: [] for s in ahead}
  for s in ahead:
    for t in successors(s):
      if t in before:
        before[t].append(s)
  behind = _distances(q, before.__getitem__, MAX_LOOP_BYTES)
  return {s for s, d in behind.items() if ahead[s] + d <= MAX_LOOP_BYTES}


def _distances(start: int, neighbours, limit: int) -> dict[int, int]:
  """Breadth-first distances from `start` along `neighbours(s)`, up to `limit` steps."""
  distance, front = {start: 0}, [start]
  for step in range(1, limit + 1):
    reached = []
    for s in front:
      for t in neighbours(s):
        if t not in distance:
          distance[t] = step
          reached.append(t)
    if not reached:
      break
    front = reached
  return distance


# Up to this many DFA states, `canonical_loop` renumbers with an index array of every
# state (~5 us to fill); above, by a search among the loop's own states.
_INDEX_STATES = 1 << 15


def canonical_loop(dfa: ByteDfa, q: int, skip: np.ndarray,
                   predecessors: "Predecessors | None" = None) -> tuple[list[int], np.ndarray]:
  """The loop's states (q first) and its transitions renumbered canonically, -1 outside
  (`skip` as in `_loop_states`; `predecessors`, from `state_predecessors` of the DFA's
  byte-class table, make the search faster)."""
  states = _loop_states(dfa, q, skip, predecessors)
  # (Gathers by `take`: indexing by int32 arrays goes through numpy 2.4's casting
  # iterator, ~2x slower.)
  trans = dfa.transitions.take(states, axis=0)
  if dfa.num_states <= _INDEX_STATES:  # Each target's position, from an index array.
    index = np.full(dfa.num_states + 1, NO_STATE, np.int32)  # [-1] stays NO_STATE.
    index[states] = np.arange(len(states), dtype=np.int32)
    return states, index.take(trans)
  # Each target's position among the states (O(loop), not an index array of every state).
  order = np.argsort(states)
  ordered = np.asarray(states)[order]
  at = np.minimum(np.searchsorted(ordered, trans), len(states) - 1)
  loop = np.where(ordered[at] == trans, order[at], NO_STATE).astype(np.int32)
  return states, loop


def _walk_loop(loop: np.ndarray, trie: VocabTrie, entry: int, *, after_first_byte: bool
               ) -> np.ndarray:
  """bool `[N]`: trie nodes whose bytes lead from loop state `entry` to state 0 in the loop.

  With `after_first_byte`, the first byte of every node is skipped: the walk starts at
  `entry` on each child of the root (the first byte is what led into the loop).
  """
  back_home = np.zeros(trie.num_nodes, bool)
  if after_first_byte:
    node = trie.child_node[trie.child_start[0]:trie.child_start[1]]
    back_home[node] = entry == 0
  else:
    node = np.zeros(1, np.int32)
  state = np.full(len(node), entry, np.int32)
  while len(node):
    pair, slot = trie.child_slots(node)
    nxt = loop[state[pair], trie.child_byte[slot]]
    keep = np.nonzero(nxt != NO_STATE)[0]
    node, state = trie.child_node[slot[keep]], nxt[keep]
    back_home[node[state == 0]] = True
  return back_home


def _subtrie(trie: VocabTrie, special: np.ndarray, fingerprint: str
             ) -> tuple[VocabTrie, np.ndarray]:
  """The trie restricted to the tokens in bool `special` [num tokens] and their prefixes,
  and the full-trie node of each of its nodes."""
  num_nodes = trie.num_nodes
  keep_token = np.flatnonzero(special[trie.token_ids])
  keep = np.zeros(num_nodes, bool)
  keep[0] = True
  front = trie.token_node[keep_token]
  while len(front):  # Mark ancestors, one level up at a time (work ~ kept nodes).
    front = front[~keep[front]]
    keep[front] = True
    front = np.sort(trie.parent[front])
    front = front[np.diff(front, prepend=-1) != 0]
  kept = np.flatnonzero(keep).astype(np.int32)  # Depth-first order is kept.
  new_id = np.full(num_nodes, -1, np.int32)
  new_id[kept] = np.arange(len(kept), dtype=np.int32)
  pair, slot = trie.child_slots(kept)
  child_kept = keep[trie.child_node[slot]]
  pair, slot = pair[child_kept], slot[child_kept]
  child_start = np.zeros(len(kept) + 1, np.int32)
  np.cumsum(np.bincount(pair, minlength=len(kept)), out=child_start[1:])
  token_start = np.zeros(len(kept) + 1, np.int32)
  np.cumsum(np.bincount(new_id[trie.token_node[keep_token]], minlength=len(kept)),
            out=token_start[1:])
  return VocabTrie(
      child_start=child_start,
      child_byte=trie.child_byte[slot],
      child_node=new_id[trie.child_node[slot]],
      node_depth=trie.node_depth[kept],
      token_start=token_start,
      token_ids=trie.token_ids[keep_token],
      fingerprint=fingerprint,
  ), kept


def token_bits(tokens: np.ndarray, num_words: int) -> np.ndarray:
  """uint32 `[num_words]`: the bitmap of token ids `tokens`."""
  tokens = np.asarray(tokens, np.int64)
  if len(tokens) > num_words:  # Many: a bool row packed (~10x faster than scattering).
    dense = np.zeros(32 * num_words, bool)
    dense[tokens] = True
    return np.packbits(dense, bitorder="little").view("<u4").astype(np.uint32)
  bits = np.zeros(num_words, np.uint32)
  np.bitwise_or.at(bits, tokens >> 5, np.uint32(1) << (tokens & 31).astype(np.uint32))
  return bits


def build_loop_terminal(loop: np.ndarray, entry: int, trie: VocabTrie, num_words: int,
                        key: str, *, after_first_byte: bool = False) -> LoopTerminal:
  """Bitmap of tokens going from loop state `entry` to the anchor (state 0), without
  its sub-trie (`with_subtrie`).

  With `after_first_byte`, a token's first byte is not read (it is the byte that led
  into the loop from outside). Walks the whole trie once; the caller caches the result.
  """
  home = _walk_loop(loop, trie, entry, after_first_byte=after_first_byte)
  tokens = trie.token_ids[home[trie.token_node]]
  return LoopTerminal(key=key, bits=token_bits(tokens, num_words), num_tokens=len(tokens),
                      subtrie=None, loop=loop, entry=entry, after_first_byte=after_first_byte)


def with_subtrie(terminal: LoopTerminal, trie: VocabTrie) -> LoopTerminal:
  """`terminal` with its sub-trie: every token of `trie` outside its bitmap (and, with
  `first_bytes`, starting with one of them), with their prefixes."""
  num_tokens = int(trie.token_ids.max()) + 1 if len(trie.token_ids) else 0
  ids = np.arange(num_tokens)
  special = (terminal.bits[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1 == 0
  if terminal.first_bytes is not None:
    first = trie.token_first_byte
    special &= (first >= 0) & terminal.first_bytes[np.maximum(first, 0)]
  subtrie, full_node = _subtrie(trie, special, f"{trie.fingerprint}/{terminal.key}")
  return dataclasses.replace(terminal, subtrie=subtrie, full_node=full_node)


@dataclasses.dataclass(frozen=True, eq=False)
class InsideCover:
  """Terminal edges for tokens that end inside a loop, off its anchor.

  Tokens whose bytes stay in the loop automaton but end at a state j other than the
  anchor (after a backslash in a JSON string: ` $\\`, `{\\`, ~330 Gemma tokens) are
  `LoopExits.inside_token`; each would be one explicit edge per state using the loop.
  For the states j where many end, a wide edge gets one more terminal edge instead:
  those tokens' bitmap, to phi(j).

  Attributes:
    states: The loop states j covered, ascending.
    bits: uint32 `[W]` per covered state: the tokens ending there, less `explicit`.
    keep: bool `[I]`, aligned with the terminal's `exits.inside_token`: the inside
      tokens that stay explicit edges (those of other states, and `explicit`).
    key: Identifies (terminal, explicit tokens), for grouping composition work.
  """

  states: tuple[int, ...]
  bits: tuple[np.ndarray, ...]
  keep: np.ndarray
  key: str


def inside_cover(terminal: LoopTerminal, explicit: np.ndarray | None = None
                 ) -> InsideCover | None:
  """The `InsideCover` of a (non-entry) loop terminal with its sub-trie, or None.

  `explicit` (token ids) stay explicit edges: tokens a near-loop state reads
  differently from its loop state (`_near_loop.py`). None when no state is covered.
  """
  exits = terminal.exits
  if exits is None or terminal.after_first_byte or not len(exits.inside_state):
    return None
  counts = np.bincount(exits.inside_state)
  states = tuple(j for j in np.flatnonzero(counts >= MIN_INSIDE_TOKENS).tolist() if j != 0)
  if not states:
    return None
  covered = np.zeros(len(counts), bool)
  covered[list(states)] = True
  keep = ~covered[exits.inside_state]
  key = terminal.key
  if explicit is not None and len(explicit):
    keep |= np.isin(exits.inside_token, explicit)
    key += "/" + hashlib.sha1(np.unique(explicit).astype(np.int64).tobytes()).hexdigest()[:16]
  num_words = len(terminal.bits)
  bits = []
  for j in states:
    row = token_bits(exits.inside_token[(exits.inside_state == j) & ~keep], num_words)
    row.setflags(write=False)
    bits.append(row)
  return InsideCover(states, tuple(bits), keep, key)


@dataclasses.dataclass(frozen=True, eq=False)
class WideEdge:
  """The terminal edge of one state.

  Attributes:
    parts: (cached terminal, first bytes) pairs. A loop state has one part with
      first bytes None (all). An entry state has one part per loop state its first
      byte can lead to, limited to those first bytes. The parts' sub-tries hold the
      tokens left for explicit edges.
    bits: uint32 `[W]`; the tokens of this edge.
    target: The state the edge leads to (the loop's anchor).
    part_states: Per part, int `[L]`: the DFA state of each state of the part's loop
      automaton (`LoopExits`), or None; () for none at all.
    inside: More terminal edges, for the first part's tokens that end inside its loop
      (`InsideCover`; to `part_states[0][j]`), or None.
  """

  parts: tuple[tuple[LoopTerminal, np.ndarray | None], ...]
  bits: np.ndarray
  target: int
  part_states: tuple[np.ndarray | None, ...] = ()
  inside: InsideCover | None = None

  def inside_edges(self) -> list[tuple[np.ndarray, int]]:
    """(bitmap, target DFA state) of the `inside` terminal edges."""
    if self.inside is None:
      return []
    phi = self.part_states[0]
    return [(bits, int(phi[j])) for j, bits in zip(self.inside.states, self.inside.bits)]

  @functools.cached_property
  def first_bytes(self) -> np.ndarray:
    """bool `[256]`: first bytes whose tokens are handled by this edge's parts."""
    out = np.zeros(256, bool)
    for _, first in self.parts:
      out |= True if first is None else first
    return out


def popcount(bits: np.ndarray) -> int:
  return int(np.bitwise_count(bits).sum())


class Predecessors:
  """Per state, the states with an arc into it: `predecessors[r]` is an int64 array,
  sliced on demand (a wide-state search reads the rows of a few states near each loop,
  so building one array per state up front cost more than the search)."""

  __slots__ = ("_sources", "_bounds", "_lists")

  def __init__(self, sources: np.ndarray, bounds: list[int]):
    self._sources = sources
    self._bounds = bounds
    self._lists = None  # (skipped states, their lists): see `lists`.

  def __getitem__(self, r: int) -> np.ndarray:
    return self._sources[self._bounds[r]:self._bounds[r + 1]]

  def lists(self, skip: np.ndarray):
    """A function r -> the states with an arc into r that `skip` (bool `[Q]`) leaves, as
    a list of ints: for the plain-Python searches of `_cycle_states` (slicing one list
    of every source, made once per skip mask, costs less than a numpy slice per state).
    """
    key = np.flatnonzero(skip).tobytes()
    if self._lists is None or self._lists[0] != key:
      sources, bounds = self._sources, self._bounds
      if key:  # Skipped sources are dropped (rarely any: spliced fragments).
        kept = ~skip[sources]
        sources = sources[kept]
        bounds = np.concatenate([[0], np.cumsum(kept)])[bounds].tolist()
      self._lists = (key, sources.tolist(), bounds)
    _, sources, bounds = self._lists
    return lambda r: sources[bounds[r]:bounds[r + 1]]

  def union(self, states) -> np.ndarray:
    """int64: the distinct states with an arc into any of `states`, ascending (as
    `np.unique` of their rows, without its hashing: a sort of a few dozen values)."""
    rows = np.sort(np.concatenate([self[r] for r in states]))
    return rows[np.concatenate([[True], rows[1:] != rows[:-1]])] if len(rows) else rows

  def __len__(self) -> int:
    return len(self._bounds) - 1


def state_predecessors(table: np.ndarray) -> Predecessors:
  """Per state, the states with an arc into it (from the `[Q, C]` byte-class table).

  A row's repeats of the target of the class before are dropped first (neighbouring
  classes mostly lead to one state): a quarter of the arcs are left to sort.
  """
  q, c = table.shape
  keep = table >= 0
  keep[:, 1:] &= table[:, 1:] != table[:, :-1]
  at = np.flatnonzero(keep)
  pairs = _arrays.sorted_unique(table.reshape(-1)[at].astype(np.int64) * q + at // c)
  bounds = np.searchsorted(pairs // q, np.arange(q + 1))
  return Predecessors(pairs % q, bounds.tolist())


def member_mask(num_states: int, members) -> np.ndarray:
  """bool `[num_states + 1]`: True at `members`; index NO_STATE (-1) reads False."""
  mask = np.zeros(num_states + 1, bool)
  mask[members] = True
  return mask


def loop_digest(loop: np.ndarray) -> bytes:
  """Hash of a canonical loop automaton (the part of every terminal key it determines)."""
  return hashlib.sha1(loop.tobytes() + loop.shape[0].to_bytes(4, "little")).digest()

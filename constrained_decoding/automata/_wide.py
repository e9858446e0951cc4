"""Wide states: one terminal bitmap instead of ~255k token edges (Sec. 2.5.1, DESIGN.md).

A *wide* state q loops on a large class of bytes (JSON string bodies, free text). Its
*loop* L(q) is the set of states on short cycles through q (q itself plus, e.g., the
intermediate states of multi-byte UTF-8 characters and of escapes). A token whose byte path from q
stays inside L(q) and ends at q keeps the automaton in q; all such tokens form one
bitmap, a terminal edge q --bitmap--> q. Every other token that q allows (tokens that
leave the loop, like `",`, or end inside a multi-byte character) is found by walking a
small sub-trie holding only the tokens outside the bitmap. Both depend only on the
vocabulary and the shape of L(q), not on the rest of the constraint, so they are cached
per (vocabulary, loop shape) in memory and on disk: the JSON string body of every
schema shares one entry. Exact: no tokenization is lost, a token may still cross out of
the wide region (`hello",`), and explicit edges take precedence over the terminal.

Each terminal also keeps, built on first use, its sub-trie walked in the loop automaton
alone (`LoopExits`: the tokens that end inside the loop and the nodes where tokens leave
it), so that composition reads a wide state's explicit edges from arrays and only walks
past the exits. `find` counts bytes per state on the DFA's byte classes
(`ByteDfa.byte_classes`), not on 256 columns.

Public names:
  LoopTerminal                 bitmap + sub-trie for one loop shape.
  LoopExits, loop_exits(...)   a terminal's sub-trie walked in its loop automaton.
  WideStates(trie, ...)        finds wide states of a byte DFA, with the cache; also
                               caches the bitmaps of the token classes (TEXT_TOKEN, ...).
"""

import dataclasses
import functools
import hashlib
import os
import time

import numpy as np

from constrained_decoding.automata import _near_loop
from constrained_decoding.automata import _token_classes
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie, write_cache_file
from constrained_decoding.errors import CompileBudgetError

# Bump when the cached layout changes (files of other versions are deleted on write).
WIDE_FORMAT_VERSION = 7
# The on-disk cache of terminals is pruned, least recently used first, past this size.
DEFAULT_MAX_CACHE_BYTES = 1 << 30
# A state is a candidate when this many single bytes loop on it directly.
MIN_SELF_LOOP_BYTES = 16
# ... and becomes wide when its bitmap holds at least this many tokens.
MIN_TERMINAL_TOKENS = 1024
# A loop state other than the anchor where at least this many tokens end gets its own
# terminal edge (`InsideCover`) instead of one explicit edge per token and state.
MIN_INSIDE_TOKENS = 64
# Bitmaps kept by `_FirstByteBits.restrict` (32 KiB each for a 262k vocabulary).
_RESTRICT_CACHE_SIZE = 256
# Loops are cycles through the wide state of at most this many bytes: a backslash
# escape followed by a 4-byte character, or a `\uXXXX` escape.
MAX_LOOP_BYTES = 6
_SUBTRIE_FIELDS = ("child_start", "child_byte", "child_node", "node_depth", "token_start",
                   "token_ids")


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


def _loop_states(dfa: ByteDfa, q: int, skip: np.ndarray) -> list[int]:
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
  in_loop = {s for s, d in behind.items() if ahead[s] + d <= MAX_LOOP_BYTES}
  # Canonical numbering: BFS from q, successors in order of their first byte.
  order, seen = [q], {q}
  for s in order:  # `order` grows while it is read.
    for t in dict.fromkeys(table[s].tolist()):  # Distinct, in order of the first byte.
      if t in in_loop and t not in seen:
        seen.add(t)
        order.append(t)
  return order


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


def _canonical_loop(dfa: ByteDfa, q: int, skip: np.ndarray
                    ) -> tuple[list[int], np.ndarray]:
  """The loop's states (q first) and its transitions renumbered canonically, -1 outside
  (`skip` as in `_loop_states`)."""
  states = _loop_states(dfa, q, skip)
  index = np.full(dfa.num_states, NO_STATE, np.int32)
  index[states] = np.arange(len(states), dtype=np.int32)
  trans = dfa.transitions[states]
  loop = np.where(trans == NO_STATE, NO_STATE, index[np.maximum(trans, 0)]).astype(np.int32)
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


def _popcount(bits: np.ndarray) -> int:
  return int(np.bitwise_count(bits).sum())


def _predecessors(table: np.ndarray) -> list[np.ndarray]:
  """Per state, the states with an arc into it (from the `[Q, C]` byte-class table)."""
  q = table.shape[0]
  src = np.repeat(np.arange(q, dtype=np.int64), table.shape[1])
  dst = table.reshape(-1).astype(np.int64)
  keep = dst >= 0
  pairs = np.unique(dst[keep] * q + src[keep])
  bounds = np.searchsorted(pairs // q, np.arange(q + 1))
  sources = (pairs % q).astype(np.int64)
  return [sources[bounds[r]:bounds[r + 1]] for r in range(q)]


def _member_mask(num_states: int, members) -> np.ndarray:
  """bool `[num_states + 1]`: True at `members`; index NO_STATE (-1) reads False."""
  mask = np.zeros(num_states + 1, bool)
  mask[members] = True
  return mask


def loop_digest(loop: np.ndarray) -> bytes:
  """Hash of a canonical loop automaton (the part of every terminal key it determines)."""
  return hashlib.sha1(loop.tobytes() + loop.shape[0].to_bytes(4, "little")).digest()


class _FirstByteBits:
  """For each byte b, the bitmap of the tokens whose first byte is b."""

  def __init__(self, trie: VocabTrie, num_words: int):
    ids = trie.token_ids.astype(np.int64)
    first = trie.token_first_byte[ids].astype(np.int64)
    self.rows = np.zeros((256, num_words), np.uint32)
    np.bitwise_or.at(self.rows, (first, ids >> 5), np.uint32(1) << (ids & 31).astype(np.uint32))
    # Tokens per first byte: the rows partition the tokens with bytes, so a union's
    # popcount is a sum of these (no 32 KiB row to unpack per query).
    self.counts = np.bincount(first, minlength=256)
    self.all = np.bitwise_or.reduce(self.rows, axis=0)
    self._restricted: dict[tuple[str, bytes], np.ndarray] = {}

  def union(self, byte_mask: np.ndarray) -> np.ndarray:
    """uint32 `[W]`: tokens whose first byte is in bool `byte_mask` [256]."""
    if byte_mask.sum() > 128:  # Rows are disjoint: remove the complement from all.
      return self.all ^ self.union(~byte_mask)
    return np.bitwise_or.reduce(self.rows[byte_mask], axis=0, initial=np.uint32(0))

  def restrict(self, terminal: "LoopTerminal", byte_mask: np.ndarray) -> np.ndarray:
    """uint32 `[W]`: `terminal.bits` limited to tokens whose first byte is in `byte_mask`.

    Memoized per (terminal, first bytes), a bounded per-vocabulary cache: entry states
    of every constraint ask for the same few (string body, opening bytes) pairs.
    """
    key = (terminal.key, np.packbits(byte_mask).tobytes())
    bits = self._restricted.get(key)
    if bits is None:
      bits = terminal.bits & self.union(byte_mask)
      bits.setflags(write=False)
      if len(self._restricted) >= _RESTRICT_CACHE_SIZE:
        self._restricted.pop(next(iter(self._restricted)))
      self._restricted[key] = bits
    return bits


class WideStates:
  """Finds the wide states of byte DFAs for one vocabulary, caching their terminals.

  It is the per-vocabulary cache of every terminal bitmap: loop terminals here, and the
  token classes of `(?P<TEXT_TOKEN>)` and `(?P<PARAGRAPH_TOKEN>)` (`token_class_bits`).
  """

  def __init__(self, trie: VocabTrie, num_words: int, cache_dir: str | None,
               max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES):
    self.trie = trie
    self.num_words = num_words
    self.cache_dir = cache_dir
    self.max_cache_bytes = max_cache_bytes
    self._subtrie_memo: dict[str, LoopTerminal] = {}  # Key -> terminal with sub-trie.
    self._cover_memo: dict[str, InsideCover | None] = {}  # Terminal key -> its cover.
    self._entry_memo: dict[tuple, tuple[np.ndarray, int]] = {}
    self._class_memo: dict[str, np.ndarray] = {}
    self._many_memo: dict[bytes, np.ndarray] = {}  # Loop digest -> `may_hold_many`.
    self._shape_memo: dict[tuple, LoopTerminal] = {}  # (digest, entry, after first byte).

  def token_class_bits(self, name: str) -> np.ndarray:
    """uint32 `[W]`: the tokens of the token class `name` (memory and disk cached)."""
    bits = self._class_memo.get(name)
    if bits is not None:
      return bits
    path = self._path(f"class-{name}")
    if path is not None and os.path.exists(path):
      try:
        with np.load(path) as data:
          bits = data["bits"]
      except (OSError, KeyError, ValueError):
        bits = None
    if bits is None or bits.shape != (self.num_words,):
      bits = _token_classes.class_bits(self.trie, name, self.num_words)
      if path is not None:
        self._write(path, bits=bits)
    self._class_memo[name] = bits
    return bits

  def find(self, dfa: ByteDfa, skip: np.ndarray | None = None, *,
           deadline: float = float("inf"), what: str = "The constraint"
           ) -> dict[int, "WideEdge"]:
    """State -> its terminal edge, for the wide states of `dfa` and their neighbours.

    Raises `CompileBudgetError` past `deadline` (a `time.perf_counter()` value).

    States where `skip` (bool `[Q]`) is set get no edge and anchor no loop (the copies
    of a spliced fragment, whose edges come from the fragment).

    * A wide state q (one looping on many bytes directly) gets a terminal back to itself.
    * Other states of its loop, such as the state after a backslash in a JSON string
      (`\\.` returns to q), get a terminal to q when enough tokens take that path.
    * A state p outside the loop whose bytes mostly lead to one loop state r (the
      opening of a string, a key that must differ from declared keys) gets an *entry*
      terminal: tokens whose first byte goes p -> r and whose rest goes r -> q.
    """
    states = np.arange(dfa.num_states)
    trans = dfa.transitions
    table, _, size = dfa.byte_classes  # [Q, C]: counts of bytes per state read this.
    self_loops = (table == states[:, None]) @ size
    if skip is None:
      skip = np.zeros(dfa.num_states, bool)
    anchors = np.nonzero((self_loops >= MIN_SELF_LOOP_BYTES) & ~skip)[0].tolist()
    wide: dict[int, WideEdge] = {}
    loops = []
    for q in anchors:
      members, loop = _canonical_loop(dfa, q, skip)
      digest = loop_digest(loop)
      terminal = self.terminal(loop, 0, digest=digest)
      if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
        terminal = self.with_subtrie(terminal)
        phi = np.asarray(members, np.int32)
        wide[q] = WideEdge(((terminal, None),), terminal.bits, q, (phi,),
                           self.full_cover(terminal))
        loops.append((q, members, loop, digest))
    for q, members, loop, digest in loops:
      phi = np.asarray(members, np.int32)
      for entry, p in enumerate(members[1:], start=1):
        if p not in wide and not skip[p] and self.may_hold_many(loop, entry, digest):
          terminal = self.terminal(loop, entry, digest=digest)
          if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
            # Most tokens cannot start here (after a backslash): a sub-trie of only
            # those that can is small.
            terminal = self.with_subtrie(terminal, trans[p] != NO_STATE)
            wide[p] = WideEdge(((terminal, None),), terminal.bits, q, (phi,),
                               self.full_cover(terminal))
    # States that move like a loop state but for a few bytes (`_near_loop.py`).
    predecessors = _predecessors(table) if loops else []
    wide.update(_near_loop.near_loop_edges(self, dfa, loops, wide, skip, predecessors))
    for q, members, loop, digest in loops:
      if time.perf_counter() > deadline:
        raise CompileBudgetError(
            f"{what} exceeded its compile time budget while finding wide states. Raise "
            "CompileOptions.max_seconds or simplify the constraint.")
      is_member = _member_mask(dfa.num_states, members)
      position = {r: i for i, r in enumerate(members)}
      # Bytes into the loop, for the states with an arc into it (only they can qualify).
      candidates = np.unique(np.concatenate([predecessors[r] for r in members]))
      candidates = candidates[~skip[candidates] & ~is_member[candidates]]
      into_loop = is_member[table[candidates]] @ size
      for p in candidates[into_loop >= MIN_SELF_LOOP_BYTES].tolist():
        if p in wide:
          continue
        row = trans[p]
        parts = []
        for entry in sorted(position[r] for r in set(row[is_member[row]].tolist())):
          first_bytes = row == members[entry]
          tail = self.terminal(loop, entry, after_first_byte=True, digest=digest)
          parts.append((tail, first_bytes))
        bits, count = self._entry_bits(parts)
        if count >= MIN_TERMINAL_TOKENS:
          phi = np.asarray(members, np.int32)
          parts = tuple((self.with_subtrie(tail), first) for tail, first in parts)
          wide[p] = WideEdge(parts, bits, q, (phi,) * len(parts))
    self._add_pre_entries(dfa, wide, loops, skip, predecessors, deadline=deadline, what=what)
    return wide

  def _entry_bits(self, parts: list) -> tuple[np.ndarray, int]:
    """(bitmap, popcount) of an entry edge: the union of its parts' restricted bitmaps.

    Memoized per parts (bounded, per vocabulary), so that equal entry edges of one or
    many constraints share one array (`compose` then packs it once).
    """
    key = tuple((tail.key, np.packbits(first).tobytes()) for tail, first in parts)
    hit = self._entry_memo.get(key)
    if hit is None:
      restrict = self.first_byte_bits.restrict
      # Tokens are partitioned by first byte, so the parts' bitmaps are disjoint.
      bits = np.bitwise_or.reduce([restrict(tail, first) for tail, first in parts])
      bits.setflags(write=False)
      hit = (bits, _popcount(bits))
      if len(self._entry_memo) >= _RESTRICT_CACHE_SIZE:
        self._entry_memo.pop(next(iter(self._entry_memo)))
      self._entry_memo[key] = hit
    return hit

  def _add_pre_entries(self, dfa: ByteDfa, wide: dict, loops: list, skip: np.ndarray,
                       predecessors: list, *, deadline: float, what: str) -> None:
    """Terminals for states just before a wide region (after `Answer:`, before ` text`).

    A state p outside every loop whose bytes lead into the loop of anchor q, directly or
    through entry states (the first character of free text), gets a terminal to q when
    enough tokens take that way (` world` after `Answer:`: most tokens start with a
    space). Its automaton is the canonical loop plus p and those entry states, and its
    sub-trie holds p's other tokens of those first bytes, so the terminal is cached per
    local shape like the others, and p's remaining tokens keep explicit edges (those of
    other first bytes found in the full trie). Only tried when the tokens whose
    first byte leads that way are many, so this costs one cached trie walk per shape.
    """
    trans = dfa.transitions
    table, first, size = dfa.byte_classes
    # Tokens per class of first bytes, as float: a BLAS product per loop below.
    counts = np.add.reduceat(self.first_byte_bits.counts, first).astype(np.float64)
    index = np.full(dfa.num_states, NO_STATE, np.int32)
    for q, members, loop, _ in loops:
      if time.perf_counter() > deadline:
        raise CompileBudgetError(
            f"{what} exceeded its compile time budget while finding wide states. Raise "
            "CompileOptions.max_seconds or simplify the constraint.")
      size = len(members)
      index[members] = np.arange(size, dtype=np.int32)
      entries = [s for s, edge in wide.items() if edge.target == q and index[s] < 0]
      way_in = _member_mask(dfa.num_states, members + entries)
      # Only states with an arc that way can qualify: tokens whose first byte leads
      # that way, per such state (one product over them, not over every state).
      candidates = np.unique(np.concatenate([predecessors[r] for r in members + entries]))
      candidates = candidates[~skip[candidates] & (index[candidates] < 0)]
      tokens_in = way_in[table[candidates]].astype(np.float64) @ counts
      for p in candidates[tokens_in >= MIN_TERMINAL_TOKENS].tolist():
        if p in wide:
          continue
        row = trans[p]
        outside = [p] + sorted(set(row[way_in[row]].tolist()) - set(members))
        index[outside] = size + np.arange(len(outside), dtype=np.int32)
        rows = trans[outside]
        shape = np.concatenate([loop, np.where(rows >= 0, index[np.maximum(rows, 0)],
                                               NO_STATE)]).astype(np.int32)
        index[outside] = NO_STATE
        # Tokens of p's other first bytes are walked in the full trie (a partial edge):
        # keeping them in this sub-trie would make it nearly the whole trie.
        way_bytes = way_in[row]
        terminal = self.terminal(shape, size)
        if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
          terminal = self.with_subtrie(terminal, way_bytes)
          phi = np.asarray(members + outside, np.int32)
          wide[p] = WideEdge(((terminal, way_bytes),), terminal.bits, q, (phi,))
      index[members] = NO_STATE

  def may_hold_many(self, loop: np.ndarray, entry: int, digest: bytes) -> bool:
    """Whether the terminal of `loop` (`loop_digest` `digest`) at `entry` could hold
    MIN_TERMINAL_TOKENS tokens: at most the tokens whose first byte the loop reads there
    (inside a multi-byte character, only byte-fallback tokens), so most loop states
    need no trie walk."""
    many = self._many_memo.get(digest)
    if many is None:
      many = (loop != NO_STATE) @ self.first_byte_bits.counts >= MIN_TERMINAL_TOKENS
      self._many_memo[digest] = many
    return bool(many[entry])

  @functools.cached_property
  def first_byte_bits(self) -> "_FirstByteBits":
    """Token bitmaps by first byte (8 MB for a 262k vocabulary; built on first use)."""
    return _FirstByteBits(self.trie, self.num_words)

  def terminal(self, loop: np.ndarray, entry: int, *, after_first_byte: bool = False,
               digest: bytes | None = None) -> LoopTerminal:
    """The cached terminal of `loop` entered at `entry` (see `build_loop_terminal`),
    without its sub-trie (`with_subtrie`): most candidates are rejected on their
    bitmap alone.

    `digest` is `loop_digest(loop)`, passed by callers that ask about one loop often.
    """
    if digest is None:
      digest = loop_digest(loop)
    shape = (digest, entry, after_first_byte)
    terminal = self._shape_memo.get(shape)
    if terminal is None:
      key = hashlib.sha1(digest + entry.to_bytes(4, "little") + bytes([after_first_byte])
                         ).hexdigest()[:20]
      terminal = self._load(key, loop=loop, entry=entry, after_first_byte=after_first_byte)
      if terminal is None:
        terminal = build_loop_terminal(loop, entry, self.trie, self.num_words, key,
                                       after_first_byte=after_first_byte)
        self._save(terminal)
      self._shape_memo[shape] = terminal
    return terminal

  def with_subtrie(self, terminal: LoopTerminal, first_bytes: np.ndarray | None = None
                   ) -> LoopTerminal:
    """`terminal` with its sub-trie, limited to tokens starting with `first_bytes` (bool
    `[256]`, None for all) when given: a new terminal (its own key) with the same
    bitmap, built once, then cached in memory and on disk."""
    if terminal.subtrie is not None:
      return terminal
    key = terminal.key
    if first_bytes is not None and not first_bytes.all():
      key = hashlib.sha1(key.encode() + np.packbits(first_bytes).tobytes()).hexdigest()[:20]
    else:
      first_bytes = None
    known = self._subtrie_memo.get(key)
    if known is not None:
      return known
    loop_info = dict(loop=terminal.loop, entry=terminal.entry,
                     after_first_byte=terminal.after_first_byte, first_bytes=first_bytes)
    known = self._load(key, **loop_info)
    if known is None or known.subtrie is None:
      known = with_subtrie(dataclasses.replace(terminal, key=key, first_bytes=first_bytes),
                           self.trie)
      self._save(known)
    self._subtrie_memo[key] = known
    return known

  def full_cover(self, terminal: LoopTerminal) -> InsideCover | None:
    """`inside_cover(terminal)`, memoized per terminal key (one object per terminal, so
    that equal bitmaps are packed once)."""
    key = terminal.key
    if key not in self._cover_memo:
      if len(self._cover_memo) >= _RESTRICT_CACHE_SIZE:
        self._cover_memo.pop(next(iter(self._cover_memo)))
      self._cover_memo[key] = inside_cover(terminal)
    return self._cover_memo[key]

  def load_arrays(self, key: str) -> dict | None:
    """The arrays `save_arrays` stored under `key`, or None (other per-vocabulary results
    share this cache, its versioning and pruning: spliced fragments)."""
    path = self._path(key)
    if path is None or not os.path.exists(path):
      return None
    try:
      with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    except (OSError, KeyError, ValueError):
      return None
    try:
      os.utime(path)  # Recently used: pruned last.
    except OSError:
      pass  # A read-only cache still serves.
    return arrays

  def save_arrays(self, key: str, **arrays) -> None:
    """Stores `arrays` under `key` (best effort, like the terminals)."""
    path = self._path(key)
    if path is not None:
      self._write(path, **arrays)

  def _path(self, key: str) -> str | None:
    if self.cache_dir is None:
      return None
    return os.path.join(self.cache_dir, f"wide-v{WIDE_FORMAT_VERSION}-"
                        f"{self.trie.fingerprint[:24]}-{self.num_words}-{key}.npz")

  def _load(self, key: str, **loop_info) -> LoopTerminal | None:
    data = self.load_arrays(key)
    if data is None:
      return None
    try:
      sub, full_node = None, None
      if "full_node" in data:
        sub = VocabTrie(**{f: data[f] for f in _SUBTRIE_FIELDS},
                        fingerprint=f"{self.trie.fingerprint}/{key}")
        full_node = data["full_node"]
      return LoopTerminal(key=key, bits=data["bits"], num_tokens=int(data["num_tokens"]),
                          subtrie=sub, full_node=full_node, **loop_info)
    except (KeyError, ValueError):
      return None

  def _save(self, terminal: LoopTerminal) -> None:
    path = self._path(terminal.key)
    if path is None:
      return
    arrays = {}
    if terminal.subtrie is not None:
      arrays = {name: getattr(terminal.subtrie, name) for name in _SUBTRIE_FIELDS}
      arrays["full_node"] = terminal.full_node
    self._write(path, bits=terminal.bits, num_tokens=terminal.num_tokens, **arrays)

  def _write(self, path: str, **arrays) -> None:
    """Writes `arrays` to `path` (best effort: see `write_cache_file`), then prunes."""
    if write_cache_file(self.cache_dir, path, arrays):
      prune_cache(self.cache_dir, self.max_cache_bytes)


def prune_cache(cache_dir: str, max_bytes: int) -> None:
  """Deletes terminal files of other format versions, then the least recently used ones
  until those left take at most 3/4 of `max_bytes` (when they exceed `max_bytes`).

  Tolerates files vanishing meanwhile (compilers in other processes share the cache).
  """
  current = f"wide-v{WIDE_FORMAT_VERSION}-"
  files = []
  for entry in os.scandir(cache_dir):
    if not entry.name.startswith("wide-v") or not entry.name.endswith(".npz"):
      continue
    try:
      if not entry.name.startswith(current):
        os.remove(entry.path)
      else:
        stat = entry.stat()
        files.append((stat.st_mtime, stat.st_size, entry.path))
    except OSError:
      pass
  total = sum(size for _, size, _ in files)
  if total <= max_bytes:
    return
  for _, size, path in sorted(files):
    if total <= max_bytes * 3 // 4:
      break
    try:
      os.remove(path)
    except OSError:
      pass
    total -= size

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

Public names:
  LoopTerminal                 bitmap + sub-trie for one loop shape.
  WideStates(trie, ...)        finds wide states of a byte DFA, with the cache; also
                               caches the bitmaps of the token classes (TEXT_TOKEN, ...).
"""

import dataclasses
import functools
import hashlib
import os
import tempfile

import numpy as np

from constrained_decoding.automata import _near_loop
from constrained_decoding.automata import _token_classes
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie

# Bump when the cached layout changes.
WIDE_FORMAT_VERSION = 4
# A state is a candidate when this many single bytes loop on it directly.
MIN_SELF_LOOP_BYTES = 16
# ... and becomes wide when its bitmap holds at least this many tokens.
MIN_TERMINAL_TOKENS = 1024
# Loops are cycles through the wide state of at most this many bytes: a backslash
# escape followed by a 4-byte character, or a `\uXXXX` escape.
MAX_LOOP_BYTES = 6
_SUBTRIE_FIELDS = ("child_start", "child_byte", "child_node", "node_depth", "token_start",
                   "token_ids")


@dataclasses.dataclass(frozen=True, eq=False)
class LoopTerminal:
  """The terminal of one loop shape.

  Attributes:
    key: Hex digest of the canonical loop automaton.
    bits: uint32 `[W]`; tokens whose path from the loop's state stays in the loop and
      returns to it.
    num_tokens: Number of bits set.
    subtrie: Trie of every other token with text (and their prefixes), to find the
      explicit edges of a wide state.
  """

  key: str
  bits: np.ndarray
  num_tokens: int
  subtrie: VocabTrie


def _loop_states(dfa: ByteDfa, q: int) -> list[int]:
  """States on short cycles through q, in canonical (BFS, byte order) order, q first.

  Only cycles of at most MAX_LOOP_BYTES bytes count (one character, or an escape and a
  character), so that the loop describes q's character class and nothing of the
  surrounding constraint: its terminal is then shared by every constraint that has the
  same class (every JSON string body, say).
  """
  n = dfa.num_states
  trans = dfa.transitions
  adjacent = np.zeros((n, n), bool)
  src, byte = np.nonzero(trans != NO_STATE)
  adjacent[src, trans[src, byte]] = True
  # Shortest distances from q and to q, up to the cycle bound.
  inf = MAX_LOOP_BYTES + 1
  ahead = np.full(n, inf)
  behind = np.full(n, inf)
  ahead[q] = behind[q] = 0
  front_ahead = np.zeros(n, bool)
  front_ahead[q] = True
  front_behind = front_ahead.copy()
  for step in range(1, MAX_LOOP_BYTES + 1):
    front_ahead = adjacent[front_ahead].any(axis=0) & (ahead == inf)
    front_behind = adjacent[:, front_behind].any(axis=1) & (behind == inf)
    ahead[front_ahead] = step
    behind[front_behind] = step
  in_loop = ahead + behind <= MAX_LOOP_BYTES
  in_loop[q] = True
  # Canonical numbering: BFS from q, successors in order of their first byte.
  order, k = [q], 0
  while k < len(order):
    row = trans[order[k]]
    k += 1
    targets, first = np.unique(row, return_index=True)
    for r in targets[np.argsort(first)].tolist():
      if r != NO_STATE and in_loop[r] and r not in order:
        order.append(r)
  return order


def _canonical_loop(dfa: ByteDfa, q: int) -> tuple[list[int], np.ndarray]:
  """The loop's states (q first) and its transitions renumbered canonically, -1 outside."""
  states = _loop_states(dfa, q)
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


def _subtrie(trie: VocabTrie, special: np.ndarray, fingerprint: str) -> VocabTrie:
  """The trie restricted to the tokens in bool `special` [num tokens] and their prefixes."""
  num_nodes = trie.num_nodes
  token_node = np.repeat(np.arange(num_nodes), np.diff(trie.token_start))
  keep_token = special[trie.token_ids]  # token_ids are grouped by node, in node order
  keep = np.zeros(num_nodes, bool)
  keep[token_node[keep_token]] = True
  parent = np.zeros(num_nodes, np.int64)
  parent[trie.child_node] = np.repeat(np.arange(num_nodes), np.diff(trie.child_start))
  # Mark ancestors, deepest level first.
  for depth in range(int(trie.node_depth.max()), 0, -1):
    at = np.nonzero(keep & (trie.node_depth == depth))[0]
    keep[parent[at]] = True
  keep[0] = True
  new_id = np.cumsum(keep) - 1
  slot_keep = keep[trie.child_node]
  child_counts = np.bincount(parent[trie.child_node][slot_keep], minlength=num_nodes)[keep]
  token_counts = np.bincount(token_node[keep_token], minlength=num_nodes)[keep]
  child_start = np.zeros(len(child_counts) + 1, np.int32)
  np.cumsum(child_counts, out=child_start[1:])
  token_start = np.zeros(len(token_counts) + 1, np.int32)
  np.cumsum(token_counts, out=token_start[1:])
  return VocabTrie(
      child_start=child_start,
      child_byte=trie.child_byte[slot_keep],
      child_node=new_id[trie.child_node[slot_keep]].astype(np.int32),
      node_depth=trie.node_depth[keep],
      token_start=token_start,
      token_ids=trie.token_ids[keep_token],
      fingerprint=fingerprint,
  )


def _token_first_bytes(trie: VocabTrie) -> np.ndarray:
  """int `[max token id + 1]`: the first byte of each token with bytes (-1 for others)."""
  token_node = np.repeat(np.arange(trie.num_nodes), np.diff(trie.token_start))
  roots = trie.child_node[trie.child_start[0]:trie.child_start[1]]
  # Trie nodes are numbered in depth-first order: a subtree is a contiguous range.
  which = np.searchsorted(roots, token_node, side="right") - 1
  first = np.full(int(trie.token_ids.max()) + 1 if len(trie.token_ids) else 0, -1)
  first[trie.token_ids] = trie.child_byte[trie.child_start[0] + which]
  return first


def build_loop_terminal(loop: np.ndarray, entry: int, trie: VocabTrie, num_words: int,
                        key: str, *, after_first_byte: bool = False,
                        first_bytes: np.ndarray | None = None) -> LoopTerminal:
  """Bitmap and sub-trie of tokens going from loop state `entry` to the anchor (state 0).

  With `after_first_byte`, a token's first byte is not read (it is the byte that led
  into the loop from outside). With `first_bytes` (bool `[256]`), the sub-trie keeps
  only tokens starting with one of them. Walks the whole trie once; the caller caches
  the result.
  """
  home = _walk_loop(loop, trie, entry, after_first_byte=after_first_byte)
  token_node = np.repeat(np.arange(trie.num_nodes), np.diff(trie.token_start))
  in_loop = home[token_node]
  tokens = trie.token_ids[in_loop].astype(np.int64)
  bits = np.zeros(num_words, np.uint32)
  np.bitwise_or.at(bits, tokens >> 5, np.uint32(1) << (tokens & 31).astype(np.uint32))
  special = np.ones(int(trie.token_ids.max()) + 1 if len(trie.token_ids) else 0, bool)
  special[tokens] = False
  if first_bytes is not None:
    first = _token_first_bytes(trie)
    special &= (first >= 0) & first_bytes[np.maximum(first, 0)]
  return LoopTerminal(key=key, bits=bits, num_tokens=len(tokens),
                      subtrie=_subtrie(trie, special, f"{trie.fingerprint}/{key}"))


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
  """

  parts: tuple[tuple[LoopTerminal, np.ndarray | None], ...]
  bits: np.ndarray
  target: int

  @property
  def first_bytes(self) -> np.ndarray:
    """bool `[256]`: first bytes whose tokens are handled by this edge's parts."""
    out = np.zeros(256, bool)
    for _, first in self.parts:
      out |= True if first is None else first
    return out


def _popcount(bits: np.ndarray) -> int:
  return int(np.unpackbits(bits.view(np.uint8)).sum())


class _FirstByteBits:
  """For each byte b, the bitmap of the tokens whose first byte is b."""

  def __init__(self, trie: VocabTrie, num_words: int):
    token_node = np.repeat(np.arange(trie.num_nodes), np.diff(trie.token_start))
    roots = trie.child_node[trie.child_start[0]:trie.child_start[1]]
    # Trie nodes are numbered in depth-first order: a subtree is a contiguous range.
    which = np.searchsorted(roots, token_node, side="right") - 1
    first = trie.child_byte[trie.child_start[0] + which].astype(np.int64)
    ids = trie.token_ids.astype(np.int64)
    self.rows = np.zeros((256, num_words), np.uint32)
    np.bitwise_or.at(self.rows, (first, ids >> 5), np.uint32(1) << (ids & 31).astype(np.uint32))
    # Tokens per first byte: the rows partition the tokens with bytes, so a union's
    # popcount is a sum of these (no 32 KiB row to unpack per query).
    self.counts = np.bincount(first, minlength=256)
    self.all = np.bitwise_or.reduce(self.rows, axis=0)

  def union(self, byte_mask: np.ndarray) -> np.ndarray:
    """uint32 `[W]`: tokens whose first byte is in bool `byte_mask` [256]."""
    if byte_mask.sum() > 128:  # Rows are disjoint: remove the complement from all.
      return self.all ^ self.union(~byte_mask)
    return np.bitwise_or.reduce(self.rows[byte_mask], axis=0, initial=np.uint32(0))


class WideStates:
  """Finds the wide states of byte DFAs for one vocabulary, caching their terminals.

  It is the per-vocabulary cache of every terminal bitmap: loop terminals here, and the
  token classes of `(?P<TEXT_TOKEN>)` and `(?P<PARAGRAPH_TOKEN>)` (`token_class_bits`).
  """

  def __init__(self, trie: VocabTrie, num_words: int, cache_dir: str | None):
    self.trie = trie
    self.num_words = num_words
    self.cache_dir = cache_dir
    self._memo: dict[str, LoopTerminal] = {}
    self._class_memo: dict[str, np.ndarray] = {}

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

  def find(self, dfa: ByteDfa) -> dict[int, "WideEdge"]:
    """State -> its terminal edge, for the wide states of `dfa` and their neighbours.

    * A wide state q (one looping on many bytes directly) gets a terminal back to itself.
    * Other states of its loop, such as the state after a backslash in a JSON string
      (`\\.` returns to q), get a terminal to q when enough tokens take that path.
    * A state p outside the loop whose bytes mostly lead to one loop state r (the
      opening of a string, a key that must differ from declared keys) gets an *entry*
      terminal: tokens whose first byte goes p -> r and whose rest goes r -> q.
    """
    states = np.arange(dfa.num_states)
    trans = dfa.transitions
    self_loops = (trans == states[:, None]).sum(axis=1)
    anchors = np.nonzero(self_loops >= MIN_SELF_LOOP_BYTES)[0].tolist()
    wide: dict[int, WideEdge] = {}
    loops = []
    for q in anchors:
      members, loop = _canonical_loop(dfa, q)
      terminal = self.terminal(loop, 0)
      if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
        wide[q] = WideEdge(((terminal, None),), terminal.bits, q)
        loops.append((q, members, loop))
    for q, members, loop in loops:
      for entry, p in enumerate(members[1:], start=1):
        if p not in wide:
          terminal = self.terminal(loop, entry)
          if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
            wide[p] = WideEdge(((terminal, None),), terminal.bits, q)
    # States that move like a loop state but for a few bytes (`_near_loop.py`).
    wide.update(_near_loop.near_loop_edges(self, dfa, loops, wide))
    for q, members, loop in loops:
      into_loop = np.isin(trans, members).sum(axis=1)
      for p in np.nonzero(into_loop >= MIN_SELF_LOOP_BYTES)[0].tolist():
        if p in wide or p in members:
          continue
        parts, bits = [], np.zeros(self.num_words, np.uint32)
        for entry, r in enumerate(members):
          first_bytes = trans[p] == r
          if first_bytes.any():
            tail = self.terminal(loop, entry, after_first_byte=True)
            parts.append((tail, first_bytes))
            # Tokens are partitioned by first byte: `& union(first)` is
            # `& ~union(~first)` for tokens with bytes, and reads far fewer rows.
            bits |= tail.bits & self.first_byte_bits.union(first_bytes)
        if _popcount(bits) >= MIN_TERMINAL_TOKENS:
          wide[p] = WideEdge(tuple(parts), bits, q)
    self._add_pre_entries(dfa, wide, loops)
    return wide

  def _add_pre_entries(self, dfa: ByteDfa, wide: dict, loops: list) -> None:
    """Terminals for states just before a wide region (after `Answer:`, before ` text`).

    A state p outside every loop whose bytes lead into the loop of anchor q, directly or
    through entry states (the first character of free text), gets a terminal to q when
    enough tokens take that way (` world` after `Answer:`: most tokens start with a
    space). Its automaton is the canonical loop plus p and those entry states, and its
    sub-trie holds p's other tokens, so the terminal is cached per local shape like the
    others, and p's remaining tokens keep explicit edges. Only tried when the tokens whose
    first byte leads that way are many, so this costs one cached trie walk per shape.
    """
    trans = dfa.transitions
    for q, members, loop in loops:
      size = len(members)
      index = np.full(dfa.num_states, NO_STATE, np.int32)
      index[members] = np.arange(size, dtype=np.int32)
      entries = [s for s, edge in wide.items() if edge.target == q and index[s] < 0]
      ways_in = np.isin(trans, members + entries)
      for p in np.nonzero(ways_in.any(axis=1))[0].tolist():
        if p in wide or index[p] >= 0 or (
            self.first_byte_bits.counts[ways_in[p]].sum() < MIN_TERMINAL_TOKENS):
          continue
        outside = [p] + sorted(set(trans[p][ways_in[p]].tolist()) - set(members))
        index[outside] = size + np.arange(len(outside), dtype=np.int32)
        rows = trans[outside]
        shape = np.concatenate([loop, np.where(rows >= 0, index[np.maximum(rows, 0)],
                                               NO_STATE)]).astype(np.int32)
        index[outside] = NO_STATE
        terminal = self.terminal(shape, size, first_bytes=trans[p] >= 0)
        if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
          wide[p] = WideEdge(((terminal, None),), terminal.bits, q)

  @functools.cached_property
  def first_byte_bits(self) -> "_FirstByteBits":
    """Token bitmaps by first byte (8 MB for a 262k vocabulary; built on first use)."""
    return _FirstByteBits(self.trie, self.num_words)

  def terminal(self, loop: np.ndarray, entry: int, *, after_first_byte: bool = False,
               first_bytes: np.ndarray | None = None) -> LoopTerminal:
    key = hashlib.sha1(loop.tobytes() + loop.shape[0].to_bytes(4, "little") +
                       entry.to_bytes(4, "little") + bytes([after_first_byte]) +
                       (b"" if first_bytes is None else np.packbits(first_bytes).tobytes())
                       ).hexdigest()[:20]
    if key in self._memo:
      return self._memo[key]
    terminal = self._load(key)
    if terminal is None:
      terminal = build_loop_terminal(loop, entry, self.trie, self.num_words, key,
                                     after_first_byte=after_first_byte,
                                     first_bytes=first_bytes)
      self._save(terminal)
    self._memo[key] = terminal
    return terminal

  def _path(self, key: str) -> str | None:
    if self.cache_dir is None:
      return None
    return os.path.join(self.cache_dir, f"wide-v{WIDE_FORMAT_VERSION}-"
                        f"{self.trie.fingerprint[:24]}-{self.num_words}-{key}.npz")

  def _load(self, key: str) -> LoopTerminal | None:
    path = self._path(key)
    if path is None or not os.path.exists(path):
      return None
    try:
      with np.load(path) as data:
        sub = VocabTrie(**{f: data[f] for f in _SUBTRIE_FIELDS},
                        fingerprint=f"{self.trie.fingerprint}/{key}")
        return LoopTerminal(key=key, bits=data["bits"], num_tokens=int(data["num_tokens"]),
                            subtrie=sub)
    except (OSError, KeyError, ValueError):
      return None

  def _save(self, terminal: LoopTerminal) -> None:
    path = self._path(terminal.key)
    if path is None:
      return
    self._write(path, bits=terminal.bits, num_tokens=terminal.num_tokens,
                **{name: getattr(terminal.subtrie, name) for name in _SUBTRIE_FIELDS})

  def _write(self, path: str, **arrays) -> None:
    """Writes `arrays` to `path` atomically (concurrent compilers may share the cache)."""
    os.makedirs(self.cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".npz")
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)

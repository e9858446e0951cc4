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
  WideStates(trie, ...)        finds wide states of a byte DFA, with the cache.
"""

import dataclasses
import hashlib
import os
import tempfile

import numpy as np

from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie

# Bump when the cached layout changes.
WIDE_FORMAT_VERSION = 3
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


def _walk_loop(loop: np.ndarray, trie: VocabTrie, entry: int) -> np.ndarray:
  """bool `[N]`: trie nodes whose bytes lead from loop state `entry` to state 0 in the loop."""
  back_home = np.zeros(trie.num_nodes, bool)
  node = np.zeros(1, np.int32)
  state = np.full(1, entry, np.int32)
  while len(node):
    first = trie.child_start[node]
    counts = trie.child_start[node + 1] - first
    total = int(counts.sum())
    if total == 0:
      break
    pair = np.repeat(np.arange(len(node), dtype=np.int32), counts)
    slot = np.arange(total, dtype=np.int32) + np.repeat(first - (np.cumsum(counts) - counts),
                                                       counts)
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


def build_loop_terminal(loop: np.ndarray, entry: int, trie: VocabTrie, num_words: int,
                        key: str) -> LoopTerminal:
  """Bitmap and sub-trie of tokens going from loop state `entry` to the anchor (state 0).

  Walks the whole trie once; the result is cached by the caller.
  """
  home = _walk_loop(loop, trie, entry)
  token_node = np.repeat(np.arange(trie.num_nodes), np.diff(trie.token_start))
  in_loop = home[token_node]
  tokens = trie.token_ids[in_loop].astype(np.int64)
  bits = np.zeros(num_words, np.uint32)
  np.bitwise_or.at(bits, tokens >> 5, np.uint32(1) << (tokens & 31).astype(np.uint32))
  special = np.ones(int(trie.token_ids.max()) + 1 if len(trie.token_ids) else 0, bool)
  special[tokens] = False
  return LoopTerminal(key=key, bits=bits, num_tokens=len(tokens),
                      subtrie=_subtrie(trie, special, f"{trie.fingerprint}/{key}"))


class WideStates:
  """Finds the wide states of byte DFAs for one vocabulary, caching their terminals."""

  def __init__(self, trie: VocabTrie, num_words: int, cache_dir: str | None):
    self.trie = trie
    self.num_words = num_words
    self.cache_dir = cache_dir
    self._memo: dict[str, LoopTerminal] = {}

  def find(self, dfa: ByteDfa) -> dict[int, tuple[LoopTerminal, int]]:
    """State -> (terminal, target) for the wide states of `dfa` and their loops.

    A wide state q (one looping on many bytes directly) gets a terminal back to itself.
    Other states of its loop, such as the state after a backslash in a JSON string
    (`\\.` returns to q), get a terminal to q too when enough tokens take that path.
    """
    states = np.arange(dfa.num_states)
    self_loops = (dfa.transitions == states[:, None]).sum(axis=1)
    anchors = np.nonzero(self_loops >= MIN_SELF_LOOP_BYTES)[0].tolist()
    wide: dict[int, tuple[LoopTerminal, int]] = {}
    loops = []
    for q in anchors:
      members, loop = _canonical_loop(dfa, q)
      loops.append((q, members, loop))
      terminal = self.terminal(loop, 0)
      if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
        wide[q] = (terminal, q)
    for q, members, loop in loops:
      if q not in wide:
        continue
      for entry, p in enumerate(members[1:], start=1):
        if p in wide:
          continue  # the state's own loop comes first
        terminal = self.terminal(loop, entry)
        if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
          wide[p] = (terminal, q)
    return wide

  def terminal(self, loop: np.ndarray, entry: int) -> LoopTerminal:
    key = hashlib.sha1(loop.tobytes() + loop.shape[0].to_bytes(4, "little") +
                       entry.to_bytes(4, "little")).hexdigest()[:20]
    if key in self._memo:
      return self._memo[key]
    terminal = self._load(key)
    if terminal is None:
      terminal = build_loop_terminal(loop, entry, self.trie, self.num_words, key)
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
    os.makedirs(self.cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".npz")
    with os.fdopen(fd, "wb") as f:
      np.savez(f, bits=terminal.bits, num_tokens=terminal.num_tokens,
               **{name: getattr(terminal.subtrie, name) for name in _SUBTRIE_FIELDS})
    os.replace(tmp, path)

"""Wide states: one terminal bitmap instead of ~255k token edges (Sec. 2.5.1, DESIGN.md).

A *wide* state q loops on a large class of bytes (JSON string bodies, free text). Its
*loop* L(q) is the set of states on cycles through q (q itself plus, e.g., the
intermediate states of multi-byte UTF-8 characters). A token whose byte path from q
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
WIDE_FORMAT_VERSION = 1
# A state is a candidate when this many single bytes loop on it directly.
MIN_SELF_LOOP_BYTES = 16
# ... and becomes wide when its bitmap holds at least this many tokens.
MIN_TERMINAL_TOKENS = 1024
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
  """States on cycles through q, in canonical (BFS, byte order) order, q first."""
  n = dfa.num_states
  trans = dfa.transitions
  adjacent = np.zeros((n, n), bool)
  src, byte = np.nonzero(trans != NO_STATE)
  adjacent[src, trans[src, byte]] = True
  not_q = np.ones(n, bool)
  not_q[q] = False
  # Reached from q, and reaching q, along paths that do not pass through q in between.
  ahead, behind = adjacent[q].copy(), adjacent[:, q].copy()
  while True:
    more_ahead = ahead | adjacent[ahead & not_q].any(axis=0)
    more_behind = behind | adjacent[:, behind & not_q].any(axis=1)
    if (more_ahead == ahead).all() and (more_behind == behind).all():
      break
    ahead, behind = more_ahead, more_behind
  in_loop = ahead & behind
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


def _canonical_loop(dfa: ByteDfa, q: int) -> np.ndarray:
  """int32 `[n, 256]`: the loop's transitions renumbered canonically, -1 outside it."""
  states = _loop_states(dfa, q)
  index = np.full(dfa.num_states, NO_STATE, np.int32)
  index[states] = np.arange(len(states), dtype=np.int32)
  trans = dfa.transitions[states]
  return np.where(trans == NO_STATE, NO_STATE, index[np.maximum(trans, 0)]).astype(np.int32)


def _walk_loop(loop: np.ndarray, trie: VocabTrie) -> np.ndarray:
  """bool `[N]`: trie nodes whose bytes lead from loop state 0 back to state 0 in the loop."""
  back_home = np.zeros(trie.num_nodes, bool)
  node = np.zeros(1, np.int32)
  state = np.zeros(1, np.int32)
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


def build_loop_terminal(loop: np.ndarray, trie: VocabTrie, num_words: int, key: str
                        ) -> LoopTerminal:
  """The bitmap and sub-trie of one canonical loop (walks the whole trie once)."""
  home = _walk_loop(loop, trie)
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

  def find(self, dfa: ByteDfa) -> dict[int, LoopTerminal]:
    """Wide states of `dfa` -> their terminal."""
    states = np.arange(dfa.num_states)
    self_loops = (dfa.transitions == states[:, None]).sum(axis=1)
    wide = {}
    for q in np.nonzero(self_loops >= MIN_SELF_LOOP_BYTES)[0].tolist():
      terminal = self.terminal(_canonical_loop(dfa, q))
      if terminal.num_tokens >= MIN_TERMINAL_TOKENS:
        wide[q] = terminal
    return wide

  def terminal(self, loop: np.ndarray) -> LoopTerminal:
    key = hashlib.sha1(loop.tobytes() + bytes([loop.shape[0] % 256])).hexdigest()[:20]
    if key in self._memo:
      return self._memo[key]
    terminal = self._load(key)
    if terminal is None:
      terminal = build_loop_terminal(loop, self.trie, self.num_words, key)
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

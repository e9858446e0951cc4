"""The lexer-state x token table of grammars with a lexer (issue 18; docs/lexer_runtime.md).

`build_token_table` composes a lexer DFA (`automata/_lexer.py`) with the vocabulary
trie: for every lexer state s and token t, the lexeme classes t completes from s and the
state it ends in, or dead. Tokens are grouped per state into *outcome classes* (same
completed sequence, same final state) whose token sets are deduplicated and packed as in
the design's hybrid encoding (bitmaps for sets of >= 256 tokens, id lists below).

Public:
  TokenTable, build_token_table(lexer, trie)   the lexer-state x token table.
  load_or_build_token_table(lexer, trie, cache_dir)   the same, cached on disk.
  ranges(lo, hi)                    the integers of several ranges, concatenated.
"""

import dataclasses
import hashlib
import itertools
import os

import numpy as np

from constrained_decoding import _arrays
from constrained_decoding import _cache
from constrained_decoding.automata import _lexer
from constrained_decoding.automata._detokenizer import VocabTrie, read_cache_file, write_cache_file
from constrained_decoding.automata._lexer import LexerDfa

TOKEN_TABLE_FORMAT_VERSION = _cache.FORMATS["lexer"].version  # Bumped there.
# Token sets of at least this many tokens are packed as bitmaps, smaller ones as lists.
BITMAP_MIN_TOKENS = 256


@dataclasses.dataclass(frozen=True, eq=False)
class TokenTable:
  """For every lexer state and token: the classes it completes and its final state.

  Per state s, the live tokens are grouped into outcome classes
  `class_start[s]:class_start[s+1]`, one per distinct (completed sequence, final state):
  outcome class k has the sequence `class_seq[k]`, the final lexer state
  `class_final[k]`, and the token set `class_set[k]`. Sequences (of lexeme class ids):
  `seq_items[seq_start[q]:seq_start[q+1]]` (sequence 0 is empty). Token sets: set j < `num_bitmaps` is row j of `set_bits`
  (uint32 `[M, ceil(V/32)]`, bit t of word t // 32), other sets are id lists
  `set_tokens[set_start[j - M]:set_start[j - M + 1]]`. Tokens not in any class of s are
  dead from s (ignored classes never appear in sequences).
  """
  class_start: np.ndarray
  class_seq: np.ndarray
  class_final: np.ndarray
  class_set: np.ndarray
  seq_start: np.ndarray
  seq_items: np.ndarray
  set_bits: np.ndarray
  set_start: np.ndarray
  set_tokens: np.ndarray
  vocab_size: int

  _FIELDS = ("class_start", "class_seq", "class_final", "class_set",
             "seq_start", "seq_items", "set_bits", "set_start", "set_tokens")

  @property
  def num_bitmaps(self) -> int:
    return int(self.set_bits.shape[0])

  @property
  def nbytes(self) -> int:
    return sum(int(getattr(self, f).nbytes) for f in self._FIELDS)

  def sequence(self, k: int) -> tuple[int, ...]:
    """The lexeme classes that a token of outcome class k completes."""
    seq = int(self.class_seq[k])
    return tuple(int(x) for x in self.seq_items[self.seq_start[seq]:self.seq_start[seq + 1]])

  def token_set(self, j: int) -> np.ndarray:
    if j < self.num_bitmaps:
      bits = np.unpackbits(self.set_bits[j].view(np.uint8), bitorder="little")
      return np.nonzero(bits[:self.vocab_size])[0].astype(np.int32)
    j -= self.num_bitmaps
    return self.set_tokens[self.set_start[j]:self.set_start[j + 1]]

  def row(self, state: int) -> np.ndarray:
    """int32 `[V]`: the outcome class of each token from `state`, -1 = dead."""
    out = np.full(self.vocab_size, -1, np.int32)
    for k in range(int(self.class_start[state]), int(self.class_start[state + 1])):
      out[self.token_set(int(self.class_set[k]))] = k
    return out

  def dense(self) -> np.ndarray:
    """int32 `[Q, V]`: `row` of every state (small vocabularies)."""
    return np.stack([self.row(s) for s in range(len(self.class_start) - 1)])


def _bit_sets(values: np.ndarray, words: int) -> np.ndarray:
  """uint64 `[n, words]`: each of `values` as a one-element set (bit v % 64 of word
  v // 64)."""
  v = values.astype(np.uint64)
  out = np.zeros((len(v), words), np.uint64)
  out[np.arange(len(v)), (v // np.uint64(64)).astype(np.int64)] = (
      np.uint64(1) << (v % np.uint64(64)))
  return out


def _subtrees(trie: VocabTrie, byte_class: np.ndarray, words: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """(end, below) per trie node n: nodes n..end[n]-1 are its subtree (nodes are numbered
  depth first, so its tokens are `token_ids[token_start[n]:token_start[end[n]]]`), and
  `below[n]` (uint64 `[N, words]`) the set of `byte_class[b]` of the bytes b on the
  edges under n.

  Built a level at a time from the deepest (each node sums/ORs its children's).
  """
  n = trie.num_nodes
  size = np.ones(n, np.int64)
  below = np.zeros((n, words), np.uint64)
  edge = _bit_sets(byte_class[trie.child_byte], words)
  counts = np.diff(trie.child_start)
  depth = trie.node_depth
  by_depth = np.argsort(depth, kind="stable")
  level = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
  for d in range(int(depth.max()) - 1, -1, -1):
    parents = by_depth[level[d]:level[d + 1]]
    parents = parents[counts[parents] > 0]
    if not len(parents):
      continue
    _, slot = trie.child_slots(parents)
    child = trie.child_node[slot]
    first = np.cumsum(counts[parents]) - counts[parents]
    size[parents] += np.add.reduceat(size[child], first)
    below[parents] = np.bitwise_or.reduceat(below[child] | edge[slot], first, axis=0)
  return np.arange(n) + size, below


def _walk_subtrees(lexer: LexerDfa, trie: VocabTrie, nodes: np.ndarray, states: np.ndarray):
  """Walks the trie below each (node, lexer state) root pair in lockstep.

  Returns (group, lo, hi, seq, final): runs of live tokens, positions `lo:hi` of
  `trie.token_ids`, reached from the root of `group` with the completed sequence `seq`
  and the final state; and the sequence trie (parent, item) of the `seq` ids. Where
  every byte below a node loops on its lexer state (string and comment bodies, NAME
  on letters), the node's whole subtree is one run and the walk stops there.
  """
  trans = lexer.transitions
  emitted = lexer.emitted
  accepting = lexer.state_class >= 0
  restart_of = lexer.restart_states
  # Bytes in classes by which states they loop on (17 classes for Python's lexer: one
  # word per node and state instead of 256 bits).
  loop = trans == np.arange(lexer.num_states)[:, None]
  loop_classes, byte_class = _arrays.unique_rows(loop.T, return_inverse=True)
  words = (len(loop_classes) + 63) // 64
  end_of, below = _subtrees(trie, byte_class.reshape(-1), words)
  src, cls = np.nonzero(loop_classes.T)
  loops = np.zeros((lexer.num_states, words), np.uint64)
  np.bitwise_or.at(loops, src, _bit_sets(cls, words))
  seq_parent, seq_item = [-1], [-1]
  seq_index: dict[int, int] = {}
  n_cls = max(len(lexer.classes), 1)
  out = []
  g = np.arange(len(nodes), dtype=np.int64)
  node = nodes.astype(np.int64)
  q = states.astype(np.int64)
  seq = np.zeros(len(nodes), np.int64)

  def record(g, node, q, seq):
    """Records the runs at these nodes; returns where the walk goes on below them."""
    whole = ~(below[node] & ~loops[q]).any(axis=1)
    lo = trie.token_start[node]
    hi = np.where(whole, trie.token_start[end_of[node]], trie.token_start[node + 1])
    # A whole subtree's run joins the next sibling's when their outcomes agree (leaves
    # of a node: 3.6M runs -> 1.6M for Python's lexer).
    join = (whole[:-1] & (hi[:-1] == lo[1:]) & (g[:-1] == g[1:]) & (q[:-1] == q[1:])
            & (seq[:-1] == seq[1:]))
    start = np.ones(len(node), bool)
    start[1:] = ~join
    first = np.nonzero(start)[0]
    last = np.append(first[1:], len(node))[:len(first)] - 1
    g, lo, hi, seq, q = g[first], lo[first], hi[last], seq[first], q[first]
    has = hi > lo
    out.append((g[has], lo[has], hi[has], seq[has], q[has]))
    return ~whole

  more = record(g, node, q, seq)
  g, node, q, seq = g[more], node[more], q[more], seq[more]
  while len(node):
    pair, slot = trie.child_slots(node)
    b = trie.child_byte[slot].astype(np.int64)
    child = trie.child_node[slot].astype(np.int64)
    cq = q[pair]
    nq = trans[cq, b].astype(np.int64)
    cs = seq[pair]
    end = nq < 0
    if end.any():
      idx = np.nonzero(end)[0]
      eq = cq[idx]
      restart = np.where(accepting[eq], trans[restart_of[eq], b[idx]], -1)
      nq[idx] = restart
      e = emitted[eq].astype(np.int64)
      grow = (restart >= 0) & (e >= 0)
      if grow.any():
        w = idx[grow]
        keys = cs[w] * n_cls + e[grow]
        uniq, inv = _arrays.sorted_unique(keys, return_inverse=True)
        ids = np.empty(len(uniq), np.int64)
        for j, key in enumerate(uniq.tolist()):
          k = seq_index.get(key)
          if k is None:
            k = seq_index[key] = len(seq_parent)
            seq_parent.append(key // n_cls)
            seq_item.append(key % n_cls)
          ids[j] = k
        cs[w] = ids[inv.reshape(-1)]
    live = nq >= 0
    g, node, q, seq = g[pair][live], child[live], nq[live], cs[live]
    more = record(g, node, q, seq)
    g, node, q, seq = g[more], node[more], q[more], seq[more]
  cols = [np.concatenate(c).astype(np.int64) for c in zip(*out)]
  return (*cols, np.array(seq_parent, np.int64), np.array(seq_item, np.int64))


def ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
  """The integers of the ranges `lo[i]:hi[i]`, concatenated in order."""
  n = hi - lo
  return np.repeat(lo - np.cumsum(n) + n, n) + np.arange(int(n.sum()))


def build_token_table(lexer: LexerDfa, trie: VocabTrie, vocab_size: int | None = None
                      ) -> TokenTable:
  """The lexer-state x token table of `lexer` over the vocabulary `trie`.

  The walk is shared: after a token's first byte b, the rest of its path depends only on
  (b, lexer state after b), so each distinct pair's subtree is walked once and every
  state s reuses it, with the lexeme pending in s as the sequence's lead when b ends it.
  """
  if vocab_size is None:
    vocab_size = int(trie.token_ids.max()) + 1 if len(trie.token_ids) else 0
  trans = lexer.transitions
  n_states = lexer.num_states
  root_lo, root_hi = int(trie.child_start[0]), int(trie.child_start[1])
  root_bytes = trie.child_byte[root_lo:root_hi].astype(np.int64)
  root_nodes = trie.child_node[root_lo:root_hi].astype(np.int64)
  # First step from every state: (state after the first byte, lead class or -1).
  q1 = trans[:, root_bytes].astype(np.int64)  # [Q, R]
  lead = np.full(q1.shape, -1, np.int64)
  ends = q1 < 0
  acc = lexer.state_class >= 0
  restart = trans[lexer.restart_states[:, None], root_bytes[None, :]].astype(np.int64)
  q1 = np.where(ends & acc[:, None], restart, q1)
  lead = np.where(ends & acc[:, None] & (restart >= 0),
                  lexer.emitted[:, None].astype(np.int64), -1)
  live = q1 >= 0
  r_idx = np.broadcast_to(np.arange(len(root_bytes)), q1.shape)
  pair_key = r_idx * n_states + np.maximum(q1, 0)
  roots, group_of = _arrays.sorted_unique(pair_key[live], return_inverse=True)
  group = np.full(q1.shape, -1, np.int64)
  group[live] = group_of.reshape(-1)
  g, lo, hi, seq, fin, seq_parent, seq_item = _walk_subtrees(
      lexer, trie, root_nodes[roots // n_states], roots % n_states)
  # Group outcome classes: per walked root, the token runs with the same (seq, final).
  n_fin = n_states + 1
  order = _lexer._stable_order((g * len(seq_parent) + seq) * n_fin + fin)
  g, lo, hi, seq, fin = g[order], lo[order], hi[order], seq[order], fin[order]
  cut = np.nonzero((g[1:] != g[:-1]) | (seq[1:] != seq[:-1]) | (fin[1:] != fin[:-1]))[0] + 1
  gc_lo = np.concatenate([[0], cut]).astype(np.int64) if len(g) else np.zeros(0, np.int64)
  gc_hi = np.append(gc_lo[1:], len(g))
  gc_group, gc_seq, gc_fin = g[gc_lo], seq[gc_lo], fin[gc_lo]
  # Token sets are identified by two additive 64-bit hashes (sum over the tokens, so a
  # union of disjoint sets hashes to the sum: classes of a state merge group classes of
  # different first bytes, which are disjoint); a run's sum is a difference of prefix
  # sums over the trie's token order.
  rng = np.random.default_rng(0)
  tok_h = rng.integers(0, 2**63, (2, vocab_size), dtype=np.int64).astype(np.uint64)
  with np.errstate(over="ignore"):
    prefix = [np.concatenate([[0], np.cumsum(h[trie.token_ids])]).astype(np.uint64)
              for h in tok_h]
    gc_h = [np.add.reduceat(p[hi] - p[lo], gc_lo) if len(gc_lo) else np.zeros(0, np.uint64)
            for p in prefix]
  grp_start = np.searchsorted(gc_group, np.arange(len(roots) + 1))

  # Every (state, live first byte) pair takes its group's classes, with its lead.
  ps, pr = np.nonzero(live)
  pg = group[ps, pr]
  cnt = grp_start[pg + 1] - grp_start[pg]
  e_pair = np.repeat(np.arange(len(ps)), cnt)
  e_gc = np.repeat(grp_start[pg] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
  e_state = ps[e_pair]
  e_lead = lead[ps, pr][e_pair]
  e_seq = gc_seq[e_gc].copy()

  # Sequences as tuples (from the sequence trie, root first); a lead prepended to a
  # sequence makes another (interned) sequence, so outcome = (sequence, final state).
  seqs = [()]
  for k in range(1, len(seq_parent)):
    seqs.append(seqs[seq_parent[k]] + (int(seq_item[k]),))
  seq_id = {t: k for k, t in enumerate(seqs)}
  has_lead = e_lead >= 0
  if has_lead.any():
    pair_keys, inv = _arrays.sorted_unique(e_lead[has_lead] * len(seqs) + e_seq[has_lead],
                                           return_inverse=True)
    mapped = np.empty(len(pair_keys), np.int64)
    n_old = len(seqs)
    for j, key in enumerate(pair_keys.tolist()):
      t = (key // n_old,) + seqs[key % n_old]
      k = seq_id.get(t)
      if k is None:
        k = seq_id[t] = len(seqs)
        seqs.append(t)
      mapped[j] = k
    e_seq[has_lead] = mapped[inv.reshape(-1)]

  # Outcome classes of each state: (state, sequence, final) keys, state major.
  e_fin = gc_fin[e_gc]
  n_fin = n_states + 1
  ekey = (e_state * len(seqs) + e_seq) * n_fin + e_fin
  eo = _lexer._stable_order(ekey)
  ekey, e_gc = ekey[eo], e_gc[eo]
  firsts = (np.concatenate([[0], np.nonzero(ekey[1:] != ekey[:-1])[0] + 1])
            if len(ekey) else np.zeros(0, np.int64))
  k0 = ekey[firsts]
  c_final = k0 % n_fin
  c_seq = (k0 // n_fin) % len(seqs)
  c_state = k0 // n_fin // len(seqs)
  class_start = np.searchsorted(c_state, np.arange(n_states + 1))
  with np.errstate(over="ignore"):
    c_h = [np.add.reduceat(h[e_gc], firsts) if len(firsts) else np.zeros(0, np.uint64)
           for h in gc_h]
  rep, c_set = _lexer._unique_pairs(*c_h)
  # One representative class per distinct token set: its token runs, its size.
  bounds = np.append(firsts, len(ekey))
  part_of = np.repeat(np.arange(len(rep)), bounds[rep + 1] - bounds[rep])
  parts = e_gc[ranges(bounds[rep], bounds[rep + 1])]
  run_of = np.repeat(part_of, gc_hi[parts] - gc_lo[parts])
  runs = ranges(gc_lo[parts], gc_hi[parts])
  size = np.bincount(run_of, hi[runs] - lo[runs], minlength=len(rep)).astype(np.int64)
  run_start = np.searchsorted(run_of, np.arange(len(rep) + 1))
  # Pack: big sets as bitmaps first (a row at a time: 332 rows of 262k bits for
  # Python, 22M tokens, never listed), then the others as sorted lists.
  big = np.nonzero(size >= BITMAP_MIN_TOKENS)[0]
  small = np.nonzero(size < BITMAP_MIN_TOKENS)[0]
  new_id = np.empty(len(rep), np.int64)
  new_id[big] = np.arange(len(big))
  new_id[small] = len(big) + np.arange(len(small))
  words = (vocab_size + 31) // 32
  set_bits = np.zeros((len(big), words), np.uint32)
  row = np.zeros(words * 32, np.uint8)
  for r, j in enumerate(big.tolist()):
    mine = runs[run_start[j]:run_start[j + 1]]
    row[:] = 0
    row[trie.token_ids[ranges(lo[mine], hi[mine])]] = 1
    set_bits[r] = np.packbits(row, bitorder="little").view(np.uint32)
  listed = np.isin(run_of, small)
  mine = runs[listed]
  owner = np.repeat(new_id[run_of[listed]] - len(big), hi[mine] - lo[mine])
  key = np.sort(owner * vocab_size + trie.token_ids[ranges(lo[mine], hi[mine])])
  set_tokens = (key % max(vocab_size, 1)).astype(np.int32)
  set_start = np.zeros(len(small) + 1, np.int32)
  np.cumsum(size[small], out=set_start[1:])
  seq_start = np.zeros(len(seqs) + 1, np.int64)
  np.cumsum(np.fromiter(map(len, seqs), np.int64, len(seqs)), out=seq_start[1:])
  seq_items = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(seq_start[-1]))
  return TokenTable(
      class_start=class_start.astype(np.int32),
      class_seq=c_seq.astype(np.int32),
      class_final=c_final.astype(np.int32),
      class_set=new_id[c_set].astype(np.int32) if len(c_set) else np.zeros(0, np.int32),
      seq_start=seq_start.astype(np.int32), seq_items=seq_items,
      set_bits=set_bits, set_start=set_start, set_tokens=set_tokens,
      vocab_size=vocab_size)


def load_or_build_token_table(lexer: LexerDfa, trie: VocabTrie, cache_dir: str | None,
                              vocab_size: int | None = None) -> TokenTable:
  """`build_token_table`, cached in `cache_dir` by (lexer fingerprint, vocabulary)."""
  if cache_dir is None:
    return build_token_table(lexer, trie, vocab_size)
  key = hashlib.sha256(f"{lexer.fingerprint}-{trie.fingerprint}-{vocab_size}".encode())
  path = os.path.join(cache_dir,
                      f"lexer-v{TOKEN_TABLE_FORMAT_VERSION}-{key.hexdigest()[:32]}.npz")
  arrays = read_cache_file(path, TokenTable._FIELDS + ("vocab_size",))
  if arrays is not None:
    vocab_size = int(arrays.pop("vocab_size"))
    return TokenTable(**arrays, vocab_size=vocab_size)
  table = build_token_table(lexer, trie, vocab_size)
  arrays = {f: getattr(table, f) for f in TokenTable._FIELDS}
  arrays["vocab_size"] = np.array(table.vocab_size)
  write_cache_file(cache_dir, path, arrays)
  return table

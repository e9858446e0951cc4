"""Near-loop states: terminal edges for states that act like a wide loop but for a few bytes.

`_wide.py` gives every state of a wide loop L (a JSON string body, say) one terminal
bitmap and walks only the tokens outside it. A state p *outside* L can behave almost
like a state e of L: in the keys that must differ from declared ones (JSON Schema's
default `additionalProperties`, `_json_values.string_except`), the state after `"Fi`
moves exactly like the string body, except that `n` continues the declared key
"Final Answer" instead of staying in the body. Composed naively, p has an explicit edge
for every token that starts with `n` (thousands; `" "` after `"Final` starts ~137k
tokens), and `_wide.py`'s entry terminals cover only tokens that enter L at their first
byte.

Here such a p gets e's cached terminal (its bitmap and its sub-trie of the other
tokens), corrected by a *disagreement walk*. Walk the vocabulary trie from the pair
(p, e), p in the byte DFA and e in L, pruning a branch as soon as either

* the two states agree (the DFA state equals L's state), after which every longer token
  behaves identically from both, or
* L's walk leaves L (such tokens are not in e's bitmap; the sub-trie walk of `_compose`
  handles them from p exactly).

The tokens met on the remaining branches whose L-walk ends at L's anchor are in e's
bitmap but may behave differently from p: they are removed from p's bitmap and given
explicit edges by walking a small trie of just those tokens from p (another part of the
edge). Exact: a token in p's bitmap either agrees with e at some prefix and then ends at
the anchor from both, or was removed. Those ending at another loop state that e's
`_loops.InsideCover` turns into a terminal edge are likewise left out of the cover's
bitmaps and kept explicit (`_compose` meets them on the same branches). The walk only
follows declared-key prefixes, so it visits a handful of trie nodes.

Public functions:
  near_loop_edges(wide_states, dfa, loops, wide, skip, predecessors)  near-loop terminals
                                                  (called by `WideStates.find`).
"""

import hashlib
import weakref
from typing import Any

import numpy as np

from constrained_decoding.automata import _compose
from constrained_decoding.automata import _loops
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie

# A state is a candidate when this many bytes lead from it straight to an anchor.
MIN_BYTES_TO_ANCHOR = 16  # As `_loops.MIN_SELF_LOOP_BYTES`.
# ... and is near-loop when it disagrees with a loop state on at most this many bytes.
MAX_DISAGREEING_BYTES = 16
# Most (node, state) pairs one disagreement walk may visit before the loop is left to
# the ordinary entry terminals (a guard for automata unlike key exclusion).
MAX_WALK_PAIRS = 50_000
# Fix terminals kept per trie (`_fix_terminal`; ~32 KiB each for a 262k vocabulary).
_FIX_MEMO_SIZE = 256
_FIX_MEMO: "weakref.WeakKeyDictionary[VocabTrie, dict]" = weakref.WeakKeyDictionary()


def _candidates(dfa: ByteDfa, anchors: list[int], wide: dict, skip: np.ndarray,
                predecessors: _loops.Predecessors | None) -> dict[int, list[int]]:
  """Anchor -> states without a terminal yet, not skipped, that have >=
  MIN_BYTES_TO_ANCHOR bytes to it (`predecessors[q]`: the states with an arc to q)."""
  table, _, size = dfa.byte_classes
  out: dict[int, list[int]] = {}
  for q in anchors:
    states = predecessors[q]
    bytes_to_q = (table.take(states, axis=0) == q) @ size  # Bytes leading to q, per state.
    for p in states[(bytes_to_q >= MIN_BYTES_TO_ANCHOR) & ~skip[states]].tolist():
      if p != q and p not in wide:
        out.setdefault(q, []).append(p)
  return out


def _partners(dfa: ByteDfa, members: np.ndarray, loop: np.ndarray,
              states: list[int]) -> list[tuple[int, int] | None]:
  """For each state p, (the loop state it agrees with on the most bytes that stay in L,
  the number of such bytes it disagrees on), or None.

  Counted over the bytes that keep each loop state in L: p must agree on at least
  MIN_BYTES_TO_ANCHOR of them and disagree on at most MAX_DISAGREEING_BYTES (else None).
  """
  table, first, size = dfa.byte_classes  # Bytes of a class agree: count classes.
  loop = loop[:, first]
  inside = loop >= 0  # [M, C]
  same = (table.take(states, axis=0)[:, None, :]
          == members.take(np.maximum(loop, 0))[None])  # [P, M, C]
  same &= inside
  # Byte counts as float32 (sums of at most 256 are exact): a BLAS product, ~10x faster
  # than numpy's integer matmul on [P, M, C].
  agree = (same.astype(np.float32) @ size.astype(np.float32)).astype(np.int64)
  disagree = (inside @ size)[None] - agree  # The other bytes that stay in L.
  agree[disagree > MAX_DISAGREEING_BYTES] = -1
  best = agree.argmax(axis=1)
  rows = np.arange(len(states))
  ok = agree[rows, best] >= MIN_BYTES_TO_ANCHOR
  return [(int(e), int(d)) if good else None
          for e, d, good in zip(best.tolist(), disagree[rows, best].tolist(), ok.tolist())]


def _disagreement_walk(trie: VocabTrie, dfa: ByteDfa, members: np.ndarray,
                       loop: np.ndarray, origins: np.ndarray, entries: np.ndarray):
  """Trie nodes of tokens in their entry's bitmap that may behave differently from
  their origin.

  Each level looks up, per (node, origin state, loop state) pair, the byte classes on
  which the two states disagree (a few: a declared key's next byte), then the trie
  children on their bytes: a node's other children agree, and are not walked.

  Returns:
    (origin index, trie node, loop state) int arrays, one triple per node found (each
    of its tokens is such a token; loop state 0 is the anchor, for the bitmap, others
    for `_loops.InsideCover`), or None when the walk exceeds MAX_WALK_PAIRS.
  """
  table, first, size = dfa.byte_classes
  loop = loop[:, first]  # Classes of the DFA: the loop's states treat their bytes alike.
  member_of = np.concatenate([members, [-2]]).astype(np.int64)  # -2 matches no state.
  node = np.zeros(len(origins), np.int64)
  true_state = origins.astype(np.int64)
  loop_state = entries.astype(np.int64)
  origin = np.arange(len(origins))
  child_key = trie.child_key
  found_origin, found_node, found_state, visited = [], [], [], 0
  while len(node):
    # Row gathers by `take(axis=0)`, and by the int32 loop states `take`: ~2x faster
    # than indexing (numpy 2.4's casting iterator for int32 indices).
    nxt_loop = loop.take(loop_state, axis=0)  # [P, C]
    nxt_true = table.take(np.maximum(true_state, 0), axis=0)
    nxt_true[true_state < 0] = NO_STATE  # The dead state stays dead (no [Q + 1] copy).
    # Flat positions (pair * C + class) of the disagreeing pairs: one index per lookup.
    at = np.flatnonzero((nxt_loop >= 0) & (nxt_true != member_of.take(nxt_loop)))
    pair, klass = np.divmod(at, nxt_loop.shape[1])
    # Each disagreeing class's bytes.
    lo = first[klass]
    which, byte = _compose._ranges(lo, lo + size[klass])  # pylint: disable=protected-access
    at, pair = at[which], pair[which]
    query = node[pair] * 256 + byte
    slot = np.minimum(np.searchsorted(child_key, query), len(child_key) - 1)
    child = np.flatnonzero(child_key[slot] == query)
    at, pair, slot = at[child], pair[child], slot[child]
    node = trie.child_node[slot].astype(np.int64)
    true_state, loop_state = nxt_true.reshape(-1)[at], nxt_loop.reshape(-1)[at]
    origin = origin[pair]
    visited += len(node)
    if visited > MAX_WALK_PAIRS:
      return None
    hit = trie.token_start[node + 1] > trie.token_start[node]
    found_origin.append(origin[hit])
    found_node.append(node[hit])
    found_state.append(loop_state[hit])
  return (np.concatenate(found_origin), np.concatenate(found_node),
          np.concatenate(found_state))


def _fix_trie(trie: VocabTrie, nodes: np.ndarray, fingerprint: str) -> VocabTrie:
  """The trie of the tokens spelled by full-trie `nodes` (sorted, distinct), in
  `VocabTrie` layout: those nodes and their ancestors, depth-first as in `trie`.

  Work ~ the nodes kept (a few hundred), not the vocabulary.
  """
  kept, front = [nodes], nodes
  while len(front):  # Ancestors, one level up at a time.
    front = np.unique(trie.parent[front[front > 0]])
    kept.append(front)
  kept = np.unique(np.concatenate(kept + [np.zeros(1, nodes.dtype)])).astype(np.int32)
  pair, slot = trie.child_slots(kept)
  child = trie.child_node[slot]
  index = np.minimum(np.searchsorted(kept, child), len(kept) - 1)
  is_kept = kept[index] == child
  pair, slot, index = pair[is_kept], slot[is_kept], index[is_kept]
  child_start = np.zeros(len(kept) + 1, np.int32)
  np.cumsum(np.bincount(pair, minlength=len(kept)), out=child_start[1:])
  counts = np.zeros(len(kept), np.int32)
  at = np.searchsorted(kept, nodes)
  counts[at] = trie.token_start[nodes + 1] - trie.token_start[nodes]
  token_start = np.zeros(len(kept) + 1, np.int32)
  np.cumsum(counts, out=token_start[1:])
  return VocabTrie(
      child_start=child_start,
      child_byte=trie.child_byte[slot],
      child_node=index.astype(np.int32),
      node_depth=trie.node_depth[kept],
      token_start=token_start,
      token_ids=_tokens_of(trie, nodes),
      fingerprint=fingerprint,
  )


def _fix_terminal(trie: VocabTrie, nodes: np.ndarray, num_words: int
                  ) -> "_loops.LoopTerminal":
  """The terminal of the tokens spelled by full-trie `nodes` (sorted, distinct): their
  bitmap and `_fix_trie`. Memoized per trie and nodes (bounded): the same declared keys
  recur in the objects of one schema and of many (half of the corpus's are repeats)."""
  key = "near-" + hashlib.sha1(nodes.astype(np.int64).tobytes()).hexdigest()[:20]
  memo = _FIX_MEMO.setdefault(trie, {})
  fix = memo.get(key)
  if fix is None or fix.bits.shape[0] != num_words:
    fixes = _tokens_of(trie, nodes)
    fix = _loops.LoopTerminal(key=key, bits=_loops.token_bits(fixes, num_words),
                              num_tokens=len(fixes),
                              subtrie=_fix_trie(trie, nodes, f"{trie.fingerprint}/{key}"))
    fix.bits.setflags(write=False)
    if len(memo) >= _FIX_MEMO_SIZE:
      memo.pop(next(iter(memo)))
    memo[key] = fix
  return fix


def _enters_loop_only(row: np.ndarray, in_loop: np.ndarray) -> bool:
  """Whether every byte a state reads (its transition `row`) leads into the loop."""
  read = row[row != NO_STATE]
  return bool(len(read)) and bool(in_loop[read].all())


def _tokens_of(trie: VocabTrie, nodes: np.ndarray) -> np.ndarray:
  """The token ids spelled by `nodes`, node by node."""
  _, slots = _compose._ranges(trie.token_start[nodes], trie.token_start[nodes + 1])  # pylint: disable=protected-access
  return trie.token_ids[slots]


def near_loop_edges(wide_states: Any, dfa: ByteDfa, loops: list,
                    wide: dict, skip: np.ndarray,
                    predecessors: _loops.Predecessors | None) -> dict:
  """Terminal edges of the near-loop states of `dfa` (see the module doc).

  Args:
    wide_states: The per-vocabulary terminal cache (a `_wide.WideStates`: its `trie`,
      `may_hold_many`, `terminal` and `with_subtrie`; not imported, as it calls this).
    dfa: The byte DFA.
    loops: (anchor, members, canonical loop, its `_loops.loop_digest`) of each wide
      loop, as `WideStates.find` computes them.
    wide: The edges found so far (loop states); their states are not candidates.
    skip: bool `[Q]`; states that are not candidates either.
    predecessors: Per state, the states with an arc into it.

  Returns:
    State -> `_loops.WideEdge` for each near-loop state.
  """
  candidates = _candidates(dfa, [q for q, *_ in loops], wide, skip, predecessors)
  trans, trie = dfa.transitions, wide_states.trie
  out = {}
  for q, members_list, loop, digest in loops:
    if q not in candidates:
      continue
    members = np.asarray(members_list, np.int64)
    inside = set(members_list)  # L's own states are not near it (they are in it).
    # A state whose every byte enters the loop (after `\uD800\uDC0` in a key, say) is
    # left to `WideStates.find`'s entry terminals, which cover all of its tokens that
    # stay in the loop; a near partner may lack some of its bytes (6,519 explicit edges).
    in_loop = _loops.member_mask(dfa.num_states, members_list)
    states = [p for p in candidates[q] if p not in out and p not in inside
              and not _enters_loop_only(trans[p], in_loop)]
    chosen, entries, walk = [], [], []
    for p, partner in zip(states, _partners(dfa, members, loop, states) if states else ()):
      if partner is not None:
        walk.append(partner[1] > 0)  # No disagreeing byte: nothing to correct.
        chosen.append(p)
        entries.append(partner[0])
    if not chosen:
      continue
    walked = np.nonzero(walk)[0]
    found_entry = found_node = found_state = np.zeros(0, np.int64)
    if len(walked):
      found = _disagreement_walk(trie, dfa, members, loop, np.asarray(chosen)[walked],
                                 np.asarray(entries)[walked])
      if found is None:
        continue
      found_entry = np.asarray(entries)[walked][found[0]]
      found_node, found_state = found[1], found[2]
    for e in sorted(set(entries)):
      if not wide_states.may_hold_many(loop, e, digest):
        continue
      terminal = wide_states.terminal(loop, e, digest=digest)
      if terminal.num_tokens < _loops.MIN_TERMINAL_TOKENS:
        continue
      group = {i for i, entry in enumerate(entries) if entry == e}
      # The sub-trie needs only the tokens some state of the group can start with.
      readable = (trans[[chosen[i] for i in sorted(group)]] != NO_STATE).any(axis=0)
      terminal = wide_states.with_subtrie(terminal, readable)
      # One fix trie per (loop, entry): every origin walks the fixes of all of them,
      # so none of those tokens stays in any bitmap of the group (no double edges).
      in_group = found_entry == e
      nodes = np.unique(found_node[in_group & (found_state == 0)])
      # Tokens ending inside the loop on those branches stay explicit for the group
      # (`_compose` finds them there); the others take the cover's terminals.
      cover = _loops.inside_cover(terminal, _tokens_of(
          trie, np.unique(found_node[in_group & (found_state != 0)])))
      parts = [(terminal, None)]
      part_states = [members.astype(np.int32)]
      bits = terminal.bits
      if len(nodes):
        fix = _fix_terminal(trie, nodes, len(bits))
        parts.append((fix, None))
        part_states.append(None)
        bits = bits & ~fix.bits
      for i in group:
        out[chosen[i]] = _loops.WideEdge(tuple(parts), bits, q, tuple(part_states), cover)
  return out

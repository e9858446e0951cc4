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
explicit edges by walking a tiny trie of just those tokens from p (another part of the
edge). Exact: a token in p's bitmap either agrees with e at some prefix and then ends at
the anchor from both, or was removed. The walk only follows declared-key prefixes, so
it visits a handful of trie nodes.

Public functions:
  near_loop_edges(wide_states, dfa, loops, wide, skip)  terminal edges of near-loop states
                                                  (called by `WideStates.find`).
"""

import hashlib

import numpy as np

from constrained_decoding.automata import _wide
from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._detokenizer import VocabTrie

# A state is a candidate when this many bytes lead from it straight to an anchor.
MIN_BYTES_TO_ANCHOR = 16  # As `_wide.MIN_SELF_LOOP_BYTES`.
# ... and is near-loop when it disagrees with a loop state on at most this many bytes.
MAX_DISAGREEING_BYTES = 16
# Most (node, state) pairs one disagreement walk may visit before the loop is left to
# the ordinary entry terminals (a guard for automata unlike key exclusion).
MAX_WALK_PAIRS = 50_000


def _candidates(dfa: ByteDfa, anchors: list[int], wide: dict, skip: np.ndarray
                ) -> dict[int, list[int]]:
  """Anchor -> states without a terminal yet, not skipped, that have >=
  MIN_BYTES_TO_ANCHOR bytes to it."""
  table, _, size = dfa.byte_classes
  out: dict[int, list[int]] = {}
  for q in anchors:
    bytes_to_q = (table == q) @ size  # [n]: bytes leading to q, per state.
    for p in np.flatnonzero((bytes_to_q >= MIN_BYTES_TO_ANCHOR) & ~skip).tolist():
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
  same = table[states][:, None, :] == members[np.maximum(loop, 0)][None]  # [P, M, C]
  agree = (inside & same) @ size
  disagree = (inside & ~same) @ size
  agree[disagree > MAX_DISAGREEING_BYTES] = -1
  best = agree.argmax(axis=1)
  rows = np.arange(len(states))
  ok = agree[rows, best] >= MIN_BYTES_TO_ANCHOR
  return [(int(e), int(d)) if good else None
          for e, d, good in zip(best.tolist(), disagree[rows, best].tolist(), ok.tolist())]


def _disagreement_walk(trie: VocabTrie, trans: np.ndarray, members: np.ndarray,
                       loop: np.ndarray, origins: np.ndarray, entries: np.ndarray):
  """Tokens in their entry's bitmap that may behave differently from their origin.

  Returns:
    (origin index, token id, token bytes) per token found, or None when the walk
    exceeds MAX_WALK_PAIRS.
  """
  dead_row = np.full((1, trans.shape[1]), NO_STATE, trans.dtype)
  trans_ext = np.concatenate([trans, dead_row])  # Row -1: the dead state stays dead.
  member_of = np.concatenate([members, [-2]]).astype(np.int64)  # -2 matches no state.
  node = np.zeros(len(origins), np.int64)
  true_state = origins.astype(np.int64)
  loop_state = entries.astype(np.int64)
  origin = np.arange(len(origins))
  levels, found, visited = [], [], 0  # levels[k]: (parent index, byte) of frontier k.
  while len(node):
    pair, slot = trie.child_slots(node)
    byte = trie.child_byte[slot]
    nxt_loop = loop[loop_state[pair], byte]
    nxt_true = trans_ext[true_state[pair], byte]
    keep = np.nonzero((nxt_loop >= 0) & (nxt_true != member_of[nxt_loop]))[0]
    node = trie.child_node[slot[keep]].astype(np.int64)
    true_state, loop_state, origin = nxt_true[keep], nxt_loop[keep], origin[pair[keep]]
    levels.append((pair[keep].tolist(), byte[keep].tolist()))
    visited += len(node)
    if visited > MAX_WALK_PAIRS:
      return None
    for i in np.nonzero((loop_state == 0) & (trie.token_start[node + 1] >
                                             trie.token_start[node]))[0].tolist():
      found.append((len(levels) - 1, i, int(origin[i]), int(node[i])))
  out = []
  for level, i, o, n in found:
    path = []
    for parents, data in reversed(levels[:level + 1]):
      path.append(data[i])
      i = parents[i]
    text = bytes(reversed(path))
    for t in trie.token_ids[trie.token_start[n]:trie.token_start[n + 1]].tolist():
      out.append((o, t, text))
  return out


def _tiny_trie(items: list[tuple[bytes, int]], fingerprint: str) -> VocabTrie:
  """The prefix trie of a few (bytes, token id) pairs, in `VocabTrie` layout."""
  items = sorted(set(items))
  children: list[dict[int, int]] = [{}]
  tokens: list[list[int]] = [[]]
  depth = [0]
  for data, token in items:
    node = 0
    for b in data:
      nxt = children[node].get(b)
      if nxt is None:
        nxt = children[node][b] = len(children)
        children.append({})
        tokens.append([])
        depth.append(depth[node] + 1)
      node = nxt
    tokens[node].append(token)
  # Renumber depth-first, children by byte, as `build_trie` does.
  order, stack = [], [0]
  while stack:
    node = stack.pop()
    order.append(node)
    stack.extend(children[node][b] for b in sorted(children[node], reverse=True))
  new_id = {old: new for new, old in enumerate(order)}
  child_start, child_byte, child_node, token_start, token_ids = [0], [], [], [0], []
  for old in order:
    for b in sorted(children[old]):
      child_byte.append(b)
      child_node.append(new_id[children[old][b]])
    child_start.append(len(child_byte))
    token_ids.extend(tokens[old])
    token_start.append(len(token_ids))
  return VocabTrie(
      child_start=np.asarray(child_start, np.int32),
      child_byte=np.asarray(child_byte, np.uint8),
      child_node=np.asarray(child_node, np.int32),
      node_depth=np.asarray([depth[old] for old in order], np.int32),
      token_start=np.asarray(token_start, np.int32),
      token_ids=np.asarray(token_ids, np.int32),
      fingerprint=fingerprint,
  )


def _bits_of(tokens: np.ndarray, num_words: int) -> np.ndarray:
  bits = np.zeros(num_words, np.uint32)
  np.bitwise_or.at(bits, tokens >> 5, np.uint32(1) << (tokens & 31).astype(np.uint32))
  return bits


def near_loop_edges(wide_states: "_wide.WideStates", dfa: ByteDfa, loops: list,
                    wide: dict, skip: np.ndarray) -> dict:
  """Terminal edges of the near-loop states of `dfa` (see the module doc).

  Args:
    wide_states: The per-vocabulary terminal cache.
    dfa: The byte DFA.
    loops: (anchor, members, canonical loop, its `_wide.loop_digest`) of each wide
      loop, as `WideStates.find` computes them.
    wide: The edges found so far (loop states); their states are not candidates.
    skip: bool `[Q]`; states that are not candidates either.

  Returns:
    State -> `_wide.WideEdge` for each near-loop state.
  """
  candidates = _candidates(dfa, [q for q, *_ in loops], wide, skip)
  trans, trie = dfa.transitions, wide_states.trie
  out = {}
  for q, members_list, loop, digest in loops:
    if q not in candidates:
      continue
    members = np.asarray(members_list, np.int64)
    inside = set(members_list)  # L's own states are not near it (they are in it).
    states = [p for p in candidates[q] if p not in out and p not in inside]
    chosen, entries, walk = [], [], []
    for p, partner in zip(states, _partners(dfa, members, loop, states) if states else ()):
      if partner is not None:
        walk.append(partner[1] > 0)  # No disagreeing byte: nothing to correct.
        chosen.append(p)
        entries.append(partner[0])
    if not chosen:
      continue
    walked = np.nonzero(walk)[0]
    found = []
    if len(walked):
      found = _disagreement_walk(trie, trans, members, loop, np.asarray(chosen)[walked],
                                 np.asarray(entries)[walked])
      if found is None:
        continue
      found = [(int(walked[o]), t, text) for o, t, text in found]
    for e in sorted(set(entries)):
      if not wide_states.may_hold_many(loop, e, digest):
        continue
      terminal = wide_states.terminal(loop, e, digest=digest)
      if terminal.num_tokens < _wide.MIN_TERMINAL_TOKENS:
        continue
      group = {i for i, entry in enumerate(entries) if entry == e}
      # The sub-trie needs only the tokens some state of the group can start with.
      readable = (trans[[chosen[i] for i in sorted(group)]] != NO_STATE).any(axis=0)
      terminal = wide_states.with_subtrie(terminal, readable)
      # One tiny trie per (loop, entry): every origin walks the fixes of all of them,
      # so none of those tokens stays in any bitmap of the group (no double edges).
      items = sorted({(text, t) for o, t, text in found if o in group})
      parts = [(terminal, None)]
      part_states = [members.astype(np.int32)]
      bits = terminal.bits
      if items:
        key = "near-" + hashlib.sha1(repr(items).encode()).hexdigest()[:20]
        fixes = np.asarray([t for _, t in items], np.int64)
        fix_bits = _bits_of(fixes, len(bits))
        parts.append((_wide.LoopTerminal(
            key=key, bits=fix_bits, num_tokens=len(items),
            subtrie=_tiny_trie(items, f"{trie.fingerprint}/{key}")), None))
        part_states.append(None)
        bits = bits & ~fix_bits
      for i in group:
        out[chosen[i]] = _wide.WideEdge(tuple(parts), bits, q, tuple(part_states))
  return out

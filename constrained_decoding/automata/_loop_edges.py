"""Explicit edges of wide states read from their loop terminal's cached walk.

A wide state's terminal (`_wide.py`) keeps its sub-trie pre-walked in the loop automaton
(`_loops.LoopExits`): the tokens that end inside the loop and the nodes where tokens
leave it. `_loop_part_edges` reads a wide state's explicit edges from those arrays and
returns only the walks past the loop's exits, which `_compose.token_edges` then walks
together with every other state's.
"""

import weakref

import numpy as np

from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._trie_walk import _emit, _ranges, _views

_EXIT_GROUPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _exit_groups(exits) -> tuple[np.ndarray, np.ndarray]:
  """(loop state, byte) of each exit's group, aligned with `exits.group_full_node`.

  Per cached `LoopExits` (long-lived, like the trie): computed once.
  """
  pair = _EXIT_GROUPS.get(exits)
  if pair is None:
    group = np.repeat(np.arange(len(exits.group_from)), np.diff(exits.group_start))
    pair = _EXIT_GROUPS[exits] = (exits.group_from[group], exits.group_byte[group])
  return pair


def _explicit_inside(exits, cover) -> tuple[np.ndarray, np.ndarray]:
  """(token, loop state) of the inside tokens of `exits` that stay explicit edges: all
  of them, or those a `_loops.InsideCover` keeps."""
  if cover is None:
    return exits.inside_token, exits.inside_state
  return exits.inside_token[cover.keep], exits.inside_state[cover.keep]


def _resolved_at_root(trans: np.ndarray, exits, origins: np.ndarray, phi: np.ndarray,
                      cover=None):
  """`_loop_part_edges` when every origin is its part's entry state (loop states and
  pre-entries): all (explicit) inside tokens of `exits`, and the exits' frontier (a DFA
  lookup per exit: fewer numpy calls than one per group expanded to its exits)."""
  inside_token, inside_state = _explicit_inside(exits, cover)
  edges = (np.repeat(origins, len(inside_token)), np.tile(inside_token, len(origins)),
           phi.take(inside_state, axis=1).ravel())
  exit_from, exit_byte = _exit_groups(exits)
  # Flat positions and int64 indices: 1-D gathers (see `_loop_part_edges`).
  nxt = trans.reshape(-1).take(phi.take(exit_from, axis=1) * np.int64(trans.shape[1])
                               + exit_byte)  # [O, exits]
  at = np.flatnonzero(nxt != NO_STATE)
  row, column = np.divmod(at, nxt.shape[1])
  frontier = (exits.group_full_node[column], nxt.reshape(-1)[at], origins[row])
  return edges, frontier


def _resolved_at_root_once(trans: np.ndarray, exits, origin: int, phi: np.ndarray,
                           cover=None):
  """`_resolved_at_root` for a single origin (the usual case): one-dimensional lookups,
  a third fewer numpy calls."""
  inside_token, inside_state = _explicit_inside(exits, cover)
  edges = (np.full(len(inside_token), origin, np.int32), inside_token, phi.take(inside_state))
  exit_from, exit_byte = _exit_groups(exits)
  nxt = trans[phi.take(exit_from), exit_byte]
  keep = (nxt != NO_STATE).nonzero()[0]
  frontier = (exits.group_full_node[keep], nxt[keep], np.full(len(keep), origin, np.int32))
  return edges, frontier


def _loop_part_edges(dfa: ByteDfa, group: list):
  """Explicit edges of the states whose wide edges share one loop terminal's part.

  The sub-trie is walked in lockstep from each state p (in the DFA) and from the part's
  entry in the loop automaton, as far as the two disagree: read through the loop's
  states phi, a walk that reaches loop state i in DFA state phi(i) agrees with the
  cached walk of `LoopTerminal.exits` below that node, so its tokens and exits are read
  from those arrays (for loop and entry states that is at once, at the root). Exits and
  pairs that leave the loop automaton while disagreeing are walked in the DFA alone.
  Exact: the same edges as walking the whole sub-trie from p, less the inside tokens
  that the group's `_loops.InsideCover` turns into terminal edges.

  Returns:
    (edges found, frontier): the edges (source, token, target) read so far, and the
    pairs still to walk in the DFA alone as (full-trie node, state, origin) arrays
    (`LoopExits.full_node`: below them the full trie is the sub-trie).
  """
  terminal, cover = group[0][1], group[0][4]
  exits, sub, loop = terminal.exits, terminal.subtrie, terminal.loop
  trans = dfa.transitions
  at_root = not terminal.after_first_byte and all(states[terminal.entry] == s
                                                  for s, _, _, states, _ in group)
  if at_root and len(group) == 1:
    origin, _, _, states, _ = group[0]
    return _resolved_at_root_once(trans, exits, int(origin), np.asarray(states, np.int32),
                                  cover)
  origins = np.array([s for s, *_ in group], np.int32)
  phi = np.array([states for _, _, _, states, _ in group], np.int32)  # [O, L]
  if at_root:
    return _resolved_at_root(trans, exits, origins, phi, cover)
  views = _views(sub)
  if terminal.after_first_byte:
    lo, hi = sub.child_start[0], sub.child_start[1]
    first = np.stack([np.ones(256, bool) if f is None else f for _, _, f, *_ in group])
    root_bytes = sub.child_byte[lo:hi]
    true = trans[origins][:, root_bytes]
    which, column = np.nonzero(first[:, root_bytes] & (true != NO_STATE))
    node, state = sub.child_node[lo + column], true[which, column]
  else:
    which = np.arange(len(origins))
    node, state = np.zeros(len(origins), np.int32), origins
  loop_state = np.full(len(node), terminal.entry, np.int32)
  # 2-D lookups read flat arrays at row * width + column (int64) with `take`: indexing
  # by int32 arrays goes through numpy 2.4's casting iterator, 2-4x slower on large ones.
  flat_trans, flat_phi = trans.reshape(-1), phi.reshape(-1)
  width, num_loop = np.int64(trans.shape[1]), phi.shape[1]
  if loop is not None:  # (Read in the walk below only.)
    flat_loop, loop_width = loop.reshape(-1), np.int64(loop.shape[1])
  found, plain, resolved = [], [], []
  if (phi[which, terminal.entry] == state).all():  # Loop and entry states: at once.
    resolved.append((node, which))
    node = node[:0]
  while len(node):
    agree = loop_state >= 0
    agree[agree] = flat_phi.take(which[agree] * num_loop + loop_state[agree]) == state[agree]
    resolved.append((node[agree], which[agree]))
    alone = ~agree & (loop_state < 0)
    plain.append((node[alone], state[alone], origins[which[alone]]))
    walk = np.flatnonzero(~agree & (loop_state >= 0))
    if not len(walk):
      break
    node, state, loop_state, which = node[walk], state[walk], loop_state[walk], which[walk]
    edges = _emit(sub, views, node, state, origins[which])
    if edges is not None:
      found.append(edges)
    pair, slot = sub.child_slots(node)
    byte = sub.child_byte[slot]
    nxt = flat_trans.take(state[pair] * width + byte)
    keep = np.flatnonzero(nxt != NO_STATE)
    pair, byte = pair[keep], byte[keep]
    node, state = sub.child_node[slot[keep]], nxt[keep]
    loop_state, which = flat_loop.take(loop_state[pair] * loop_width + byte), which[pair]
  node, which = (np.concatenate(c) for c in zip(*resolved))
  end = exits.node_end.take(node)
  k, i = _ranges(np.searchsorted(exits.inside_node, node), np.searchsorted(exits.inside_node, end))
  if cover is not None:
    explicit = cover.keep[i]
    k, i = k[explicit], i[explicit]
  o = which[k]
  found.append((origins[o], exits.inside_token[i],
                flat_phi.take(o * num_loop + exits.inside_state[i])))
  k, i = _ranges(np.searchsorted(exits.exit_node, node), np.searchsorted(exits.exit_node, end))
  o = which[k]
  nxt = flat_trans.take(flat_phi.take(o * num_loop + exits.exit_from[i]) * width
                        + exits.exit_byte[i])
  keep = np.flatnonzero(nxt != NO_STATE)
  plain.append((exits.exit_node[i[keep]], nxt[keep], origins[o[keep]]))
  node, state, origin = (np.concatenate(c).astype(np.int32) for c in zip(*plain))
  edges = tuple(np.concatenate(column).astype(np.int32) for column in zip(*found))
  return edges, (exits.full_node.take(node), state, origin)


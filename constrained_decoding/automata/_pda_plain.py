"""The plain part of a push-down composition: token paths with no call, return or
register operation, walked as a regular language.

Most token paths of a grammar stay inside one rule (corpus schemas under
`free_form_depth=None`: ~97% of the edges): their configuration is (state, nothing
pushed, nothing popped) all along, and they are exactly the byte DFA's. `_pda.py` walks
those with `_trie_walk`'s regular walks (numpy over the DFA table, no interning) and
keeps its push-down walk for the rest: origins that may call, return or cross an
operation themselves, and the walks that reach such a state mid-token, continued from
there (`stopped`).

A state is *special* when its configuration (state, ()) has more moves than its byte
arcs: it has a call arc, it is final in its rule (a return), or one of its byte arcs
reads register operations (`Rtn.contracted`). A path that never leaves a non-special
state before its last byte has no other path for the same token (the DFA is
deterministic and every other move starts at a special state), so plain edges need no
determinism check either.

Public names (to `_pda.py`):
  PlainStates(rtn)   the special states and the byte DFA renumbered for stopping walks.
"""


import numpy as np

from constrained_decoding.automata._byte_dfa import NO_STATE, ByteDfa
from constrained_decoding.automata._rtn import Rtn
from constrained_decoding.automata._trie_walk import _root_frontier
from constrained_decoding.automata._trie_walk import _walk_frontier


def special_states(rtn: Rtn) -> np.ndarray:
  """bool `[Q]`: the states whose configuration (state, ()) moves otherwise than by its
  byte arcs alone (calls, returns, register operations)."""
  special = rtn.accepting.astype(bool).copy()
  special |= np.array([bool(c) for c in rtn.calls], bool)
  if rtn.contracted is not None and rtn.contracted.arc_ops:
    special[np.fromiter((s for s, _ in rtn.contracted.arc_ops), np.int64)] = True
  return special


class PlainStates:
  """The RTN's byte arcs renumbered with its special states last, so that a regular
  walk stops where one is reached (`_walk_frontier(stop_at=...)`).

  Attributes:
    special: bool `[Q]` (`special_states`).
  """

  def __init__(self, rtn: Rtn):
    self.special = special_states(rtn)
    # Plain states first, special ones after: new id = position in `old_of`.
    self._old_of = np.concatenate([np.flatnonzero(~self.special),
                                   np.flatnonzero(self.special)]).astype(np.int32)
    new_of = np.empty(rtn.num_states, np.int32)
    new_of[self._old_of] = np.arange(rtn.num_states, dtype=np.int32)
    self._new_of = new_of
    table = rtn.transitions.take(self._old_of, axis=0)
    self._table = ByteDfa(
        transitions=np.where(table != NO_STATE, new_of.take(np.maximum(table, 0)),
                             NO_STATE).astype(np.int32),
        accepting=rtn.accepting.take(self._old_of), start=int(new_of[rtn.start]))
    self._stop_at = int((~self.special).sum())

  def walk(self, trie, origins: np.ndarray, first_bytes: np.ndarray, *, max_edges: int,
           deadline: float, what: str):
    """(edges, stopped) of the plain walks from non-special `origins` in `trie`, each
    limited to the first bytes `first_bytes` (bool `[len(origins), 256]`) allows.

    Returns:
      edges: (origin, token, state) int64 arrays: every token path that reaches its
        last byte without leaving a special state.
      stopped: (node, state, origin) int64 arrays: the walks that reached a special
        state (the node spelling the bytes so far), neither emitted nor walked further.
    """
    frontier = _root_frontier(self._table, trie, self._new_of.take(origins), first_bytes)
    edges, stopped = _stopping_walk(self._table.transitions, trie, *frontier,
                                    stop_at=self._stop_at, max_edges=max_edges,
                                    deadline=deadline, what=what)
    old = self._old_of
    return ((old.take(edges[0]).astype(np.int64), edges[1], old.take(edges[2]).astype(np.int64)),
            (stopped[0], old.take(stopped[1]).astype(np.int64),
             old.take(stopped[2]).astype(np.int64)))


def _stopping_walk(transitions: np.ndarray, trie, node, state, origin, *, stop_at: int,
                   max_edges: int, deadline: float, what: str):
  """The lockstep walk of `trie` and the DFA from a frontier (node, state, origin),
  stopping the pairs that reach a state >= `stop_at` (`_trie_walk._walk_frontier`).

  Returns:
    (origin, token, state) and (node, state, origin) int64 arrays: the edges, and the
    pairs stopped (neither emitted nor walked further).
  """
  stopped = []  # Arrays, or (node, state, origin) tuples from the Python steps.
  parts = _walk_frontier(transitions, trie, node, state, origin, max_edges=max_edges,
                         deadline=deadline, what=what, stop_at=stop_at, stopped=stopped)
  singles = [s for s in stopped if not np.ndim(s[0])]
  stopped = [s for s in stopped if np.ndim(s[0])]
  if singles:
    stopped.append(np.array(singles, np.int64).reshape(-1, 3).T)
  return _columns(parts, 3), _columns(stopped, 3)


def _columns(parts: list, width: int) -> tuple[np.ndarray, ...]:
  """Column-wise concatenation of array tuples as int64 (empty columns without parts)."""
  if not parts:
    return tuple(np.zeros(0, np.int64) for _ in range(width))
  return tuple(np.concatenate(column).astype(np.int64) for column in zip(*parts))

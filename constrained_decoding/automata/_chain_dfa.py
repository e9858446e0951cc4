"""The byte DFA of a compressed counted chain, built directly in numpy.

A counted chain `P X{n,m} S` (`_counting.py`) is composed as its compressed chain
`P X{n', m'} S` (n', m' at most ~2L). Its minimal byte DFA has a fixed shape: the bytes
of P, then per position j = 0..m' one copy of X's own minimal DFA (its start is the
position's boundary, its inner states are slots 1..stride-1, finishing X leads to the
next boundary), then the bytes of S from every boundary j >= n'. OpenFst (determinize
and minimize of the whole NFA) took ~11 ms of a new shape's ~37 ms compile with Gemma 3;
laying the copies out here costs well under a millisecond.

States are numbered P's states first (the start is 0), then the chain position by
position (slot order within a position as `_counting._chain_layout` numbers slots), then
S's states. `canonical` renumbers an OpenFst DFA of the same chain that way, so both
give identical arrays and the tables built from them do not depend on OpenFst's internal
numbering. An unbounded chain (`X{n,}`) has positions 0..n; the last reads X back to
itself and its inner states are those of position n - 1 (both lead to boundary n).

`tests/automata/chain_dfa_test.py` checks, over random classes, escapes, bounds and
affixes, that the result equals OpenFst's minimal DFA (canonically renumbered), class
edges included.

Public names:
  BodySlots, body_slots(body)   X's DFA as slots: inner states in topological order and
                                the slot each (slot, byte) moves to.
  build(...)                    the compressed chain's DFA and cell layout, or None.
  canonical(dfa, cell, ...)     an equal DFA renumbered as `build` numbers states.
"""

import dataclasses

import numpy as np

from constrained_decoding.automata import _byte_dfa
from constrained_decoding.automata._byte_dfa import NO_STATE


@dataclasses.dataclass(frozen=True, eq=False)
class BodySlots:
  """X's minimal DFA `body` as slots: slot 0 is its start, slot k >= 1 the inner state
  `inner[k - 1]` (non-accepting, in topological order: by longest path from the start,
  then id); `moves[k, b]` is the slot byte b leads to from slot k, `stride` when it
  finishes X, -1 when b is not read."""

  body: _byte_dfa.ByteDfa
  inner: list
  stride: int
  moves: np.ndarray  # int64 [stride, 256]


def inner_states(body: _byte_dfa.ByteDfa) -> list | None:
  """X's non-start, non-accepting states in topological order (by longest path from the
  start, then id), so every move forward has a non-negative relative offset; None when
  X's DFA has a cycle (X is not finite)."""
  depth = {body.start: 0}
  frontier = [body.start]
  for _ in range(body.num_states):
    nxt = set()
    for x in frontier:
      for x2 in set(body.transitions[x][body.transitions[x] != NO_STATE].tolist()):
        depth[x2] = depth[x] + 1
        nxt.add(x2)
    if not nxt:
      break
    frontier = list(nxt)
  else:
    return None  # A cycle: X is not finite.
  return sorted((x for x in depth if x != body.start and not body.accepting[x]),
                key=lambda x: (depth[x], x))


def body_slots(body: _byte_dfa.ByteDfa) -> BodySlots | None:
  """X's slots, or None when X is not finite, non-empty and prefix-free (one accepting
  state without moves), or reads token classes or fragments."""
  if (body.num_states == 0 or len(body.token_arcs) or len(body.fragment_arcs)
      or len(body.marker_arcs)):
    return None
  finals = np.flatnonzero(body.accepting)
  if len(finals) != 1 or (body.transitions[finals] != NO_STATE).any() \
      or body.accepting[body.start]:
    return None
  inner = inner_states(body)
  if inner is None:
    return None
  stride = len(inner) + 1
  slot = np.full(body.num_states + 1, -1, np.int64)  # Index -1 (no state): -1.
  slot[body.start] = 0
  slot[inner] = np.arange(1, stride)
  slot[finals[0]] = stride
  rows = np.array([body.start] + inner, np.int64)
  return BodySlots(body=body, inner=inner, stride=stride, moves=slot[body.transitions[rows]])


def build(prefix: bytes, slots: BodySlots, suffix: bytes, n2: int, m2: int,
          unbounded: bool):
  """(dfa, cell): the minimal DFA of `prefix X{n2,m2} suffix` (`X{n2,}` when
  `unbounded`) and `cell[j, k]`, its state at position j, slot k (-1 for none: the
  last position of a bounded chain has no inner states); None when the bytes after a
  boundary would be ambiguous (S starts with a byte X starts with) or there is no
  position before the last (m2 = 0)."""
  stride, moves = slots.stride, slots.moves
  if suffix and moves[0, suffix[0]] != -1:
    return None
  if m2 < 1:  # `X{0}`: no chain.
    return None
  p = len(prefix)
  # Cell ids, position by position; the last position of a bounded chain is a boundary
  # only, that of an unbounded one shares position n2 - 1's inner states.
  own = np.ones((m2 + 1, stride), bool)
  own[m2, 1:] = False
  num_cells = int(own.sum())
  cell = np.full((m2 + 1, stride), -1, np.int64)
  cell[own] = p + np.arange(num_cells)
  if unbounded:
    cell[m2, 1:] = cell[m2 - 1, 1:]
  q = p + num_cells + len(suffix)
  trans = np.full((q, 256), NO_STATE, np.int32)
  accepting = np.zeros(q, bool)
  # Prefix: a line into boundary 0.
  for i, b in enumerate(prefix):
    trans[i, b] = i + 1 if i + 1 < p else cell[0, 0]
  # The chain: slot k of position j reads as X's state; a finished X goes to boundary
  # j + 1 (to itself at an unbounded chain's last position).
  # Positions 0..m2-1 own all their slots (ids p + j * stride + k), so slot k of
  # position j moves on byte b to p + j * stride + moves[k, b]: a finished X (moves =
  # stride) lands on boundary j + 1.
  flat = moves.reshape(-1).astype(np.int32)
  block = trans[p:p + m2 * stride].reshape(m2, stride * 256)
  np.add(np.arange(p, p + m2 * stride, stride, dtype=np.int32)[:, None], flat[None, :],
         out=block)
  np.copyto(block, NO_STATE, where=flat[None, :] < 0)
  if unbounded:  # The last boundary reads X back to itself (its inner states: m2 - 1's).
    last = moves[0]
    trans[cell[m2, 0]] = np.where(last < 0, NO_STATE, np.where(
        last == stride, cell[m2, 0], cell[m2, np.minimum(last, stride - 1)]))
  # Boundaries from n2 on end the chain: S's first byte, or accepting.
  ends = cell[n2:, 0]
  first_suffix = p + num_cells
  if suffix:
    trans[ends, suffix[0]] = first_suffix
    for i, b in enumerate(suffix[1:]):
      trans[first_suffix + i, b] = first_suffix + i + 1
    accepting[q - 1] = True
  else:
    accepting[ends] = True
  edges = np.asarray(slots.body.class_edges if slots.body.class_edges is not None
                     else np.arange(257))
  affix = np.frombuffer(prefix + suffix, np.uint8).astype(np.int64)
  edges = np.union1d(edges, np.concatenate([affix, affix + 1]))
  dfa = _byte_dfa.ByteDfa(transitions=trans, accepting=accepting, start=0,
                          class_edges=edges)
  return dfa, cell


def canonical(dfa: _byte_dfa.ByteDfa, cell: np.ndarray, prefix: bytes, suffix: bytes,
              n2: int) -> tuple[_byte_dfa.ByteDfa, np.ndarray]:
  """(dfa, cell) renumbered as `build` numbers states: the prefix's states from the
  start, the cells position by position (-1 and repeated ones skipped), the suffix's
  states from boundary n2, then any other state in its old order."""
  trans = dfa.transitions
  order: dict[int, None] = {}  # Insertion-ordered; a state met again keeps its place.
  q = dfa.start
  for b in prefix:
    order.setdefault(q)
    q = int(trans[q, b])
  for c in cell.reshape(-1).tolist():
    if c >= 0:
      order.setdefault(c)
  q = int(cell[n2, 0])
  for b in suffix:
    q = int(trans[q, b])
    if q < 0:
      break
    order.setdefault(q)
  order = list(order)
  rest = np.setdiff1d(np.arange(dfa.num_states), np.array(order, np.int64))
  order = np.concatenate([np.array(order, np.int64), rest])
  new = np.empty(dfa.num_states, np.int64)
  new[order] = np.arange(dfa.num_states)
  table = trans[order]
  table = np.where(table >= 0, new[np.maximum(table, 0)], NO_STATE).astype(np.int32)
  out = dataclasses.replace(dfa, transitions=table, accepting=dfa.accepting[order],
                            start=int(new[dfa.start]))
  return out, np.where(cell >= 0, new[np.maximum(cell, 0)], -1)

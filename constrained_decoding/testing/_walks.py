"""Random strings of a byte DFA's language, for soundness tests.

Public functions:
  distances_to_accept(dfa)                 fewest bytes from each state to acceptance.
  random_accepted_bytes(dfa, rng, ...)     a random accepted byte string.
"""

import collections
import random

import numpy as np


def distances_to_accept(dfa) -> list[int | None]:
  """Fewest bytes from each state to an accepting state (BFS on reversed arcs)."""
  sources = [[] for _ in range(dfa.num_states)]
  src, byte = np.nonzero(dfa.transitions >= 0)
  for s, t in set(zip(src.tolist(), dfa.transitions[src, byte].tolist())):
    sources[t].append(s)
  distance: list[int | None] = [None] * dfa.num_states
  queue = collections.deque(np.nonzero(dfa.accepting)[0].tolist())
  for q in queue:
    distance[q] = 0
  while queue:
    q = queue.popleft()
    for s in sources[q]:
      if distance[s] is None:
        distance[s] = distance[q] + 1
        queue.append(s)
  return distance


def random_accepted_bytes(dfa, rng: random.Random, *, stop: float = 0.25,
                          soft_limit: int = 80) -> bytes:
  """A random accepted byte string: a uniformly chosen next *state* at each step.

  Choosing states rather than bytes lets a closing bracket compete with a whole class of
  letters. In accepting states the walk stops with probability `stop`; past
  `soft_limit` bytes it only takes moves that get closer to acceptance, so it ends.
  """
  if len(getattr(dfa, "marker_arcs", ())):
    return _random_register_bytes(dfa, rng, stop=stop, soft_limit=soft_limit)
  distance = distances_to_accept(dfa)
  state, out = dfa.start, bytearray()
  while True:
    row = dfa.transitions[state]
    if dfa.accepting[state] and (rng.random() < stop or len(out) >= soft_limit
                                 or (row < 0).all()):
      return bytes(out)
    targets = sorted(set(row[row >= 0].tolist()))
    if len(out) >= soft_limit:
      targets = [t for t in targets if distance[t] < distance[state]]
    target = rng.choice(targets)
    out.append(rng.choice(np.nonzero(row == target)[0].tolist()))
    state = target


def _random_register_bytes(dfa, rng: random.Random, *, stop: float, soft_limit: int) -> bytes:
  """`random_accepted_bytes` for a DFA with register markers (`automata/_registers.py`):
  only moves whose operations pass and that leave a live position; past `soft_limit`
  the shortest completion (a breadth-first search over (state, registers), since a
  failing `need` may send the shortest byte path away from acceptance)."""
  walker = dfa.register_walker
  position, out = walker.start(), bytearray()
  while True:
    moves = walker.moves(position)
    if walker.accepting(position) and (rng.random() < stop or len(out) >= soft_limit
                                       or not moves):
      return bytes(out)
    if len(out) >= soft_limit:
      return bytes(out) + walker.shortest_completion(position)
    target = rng.choice(sorted({nxt for _, nxt in moves}))
    out.append(rng.choice([b for b, nxt in moves if nxt == target]))
    position = target

"""Intersection of text languages given as IR, for JSON Schema strings.

A JSON Schema string may carry several constraints on its content at once: a `pattern`
with `minLength`/`maxLength` (pydantic's `Field(min_length=1, max_length=20,
pattern=...)`), or a `pattern` with a `format`. Each is a regular language over
characters, and so is their intersection; the IR has no intersection node, so it is
built here as a product automaton over characters and returned as an `ir.Graph` whose
arcs are character classes (the ranges both sides allow). `_json_values.encode_text`
then maps it to JSON text like any other text IR.

Public functions:
  intersect_text(a, b)                       L(a) ∩ L(b) as an `ir.Graph`.
  complement_text(a)                         the texts not in L(a), as an `ir.Graph`.
  text_of_length(min_length, max_length)     any text of that many code points.
"""

from constrained_decoding.constraints import _ir as ir

_ANY_CHAR = ir.char_class([(0, ir.MAX_CODE_POINT)])


def text_of_length(min_length: int, max_length: int | None) -> ir.Node:
  """Any text of `min_length..max_length` code points (None: no upper bound)."""
  return ir.repeat(_ANY_CHAR, min_length, max_length)


class _CharNfa:
  """A character-level NFA: arcs are (target, ranges) or (target, None) for epsilon."""

  def __init__(self):
    self.arcs: list[list[tuple[int, tuple | None]]] = []

  def state(self) -> int:
    self.arcs.append([])
    return len(self.arcs) - 1

  def add(self, node: ir.Node, src: int, dst: int) -> None:
    """Adds paths src -> dst spelling the language of `node`."""
    match node:
      case ir.Bytes(data):
        try:
          text = data.decode("utf-8")
        except UnicodeDecodeError as e:
          raise ValueError(f"IR bytes {data!r} are not UTF-8 text. Expected whole "
                           "characters.") from e
        here = src
        for k, ch in enumerate(text):
          there = dst if k == len(text) - 1 else self.state()
          self.arcs[here].append((there, ((ord(ch), ord(ch)),)))
          here = there
        if not text:
          self.arcs[src].append((dst, None))
      case ir.CharClass(ranges):
        if ranges:
          self.arcs[src].append((dst, tuple(ranges)))
      case ir.Concat(parts):
        here = src
        for k, part in enumerate(parts):
          there = dst if k == len(parts) - 1 else self.state()
          self.add(part, here, there)
          here = there
      case ir.Union(alternatives):
        for alternative in alternatives:
          a, b = self.state(), self.state()
          self.arcs[src].append((a, None))
          self.add(alternative, a, b)
          self.arcs[b].append((dst, None))
      case ir.Repeat(body, lo, hi):
        here = src
        for _ in range(lo):
          there = self.state()
          self.add(body, here, there)
          here = there
        if hi is None:
          loop = self.state()
          self.arcs[here].append((loop, None))
          back = self.state()
          self.add(body, loop, back)
          self.arcs[back].append((loop, None))
          self.arcs[loop].append((dst, None))
        else:
          self.arcs[here].append((dst, None))
          for _ in range(hi - lo):
            there = self.state()
            self.add(body, here, there)
            self.arcs[there].append((dst, None))
            here = there
      case ir.Graph(num_states, arcs, finals):
        states = [src] + [self.state() for _ in range(num_states - 1)]
        for a, label, b in arcs:
          self.add(label, states[a], states[b])
        for f in finals:
          self.arcs[states[f]].append((dst, None))
      case _:
        raise ValueError(f"IR node {type(node).__name__} does not denote text. Expected "
                         "Bytes, CharClass, Concat, Union, Repeat or Graph.")

  def closed(self, finals: set[int]) -> tuple[list[list[tuple[int, tuple]]], set[int]]:
    """Epsilon-free arcs (each state gets those of its epsilon closure) and finals."""
    out, new_finals = [], set()
    for s in range(len(self.arcs)):
      closure, stack = {s}, [s]
      while stack:
        for t, label in self.arcs[stack.pop()]:
          if label is None and t not in closure:
            closure.add(t)
            stack.append(t)
      out.append([(t, label) for c in closure for t, label in self.arcs[c]
                  if label is not None])
      if closure & finals:
        new_finals.add(s)
    return out, new_finals


def _nfa(node: ir.Node):
  nfa = _CharNfa()
  start, final = nfa.state(), nfa.state()
  nfa.add(node, start, final)
  arcs, finals = nfa.closed({final})
  return arcs, finals, start


def _common_ranges(a: tuple, b: tuple) -> tuple:
  """The intersection of two sorted, disjoint lists of (lo, hi) code point ranges."""
  out, i, j = [], 0, 0
  while i < len(a) and j < len(b):
    lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
    if lo <= hi:
      out.append((lo, hi))
    if a[i][1] < b[j][1]:
      i += 1
    else:
      j += 1
  return tuple(out)


def intersect_text(a: ir.Node, b: ir.Node, *, max_states: int = 100_000) -> ir.Node:
  """The texts in both L(a) and L(b) (IR over characters), as an `ir.Graph`.

  The product of the two character NFAs, reachable part only; arcs carry the ranges
  both sides' arcs allow.

  Raises:
    ValueError: a side holds something other than text (raw non-UTF-8 bytes, byte
      classes, terminals, rule references), or the product exceeds `max_states`.
  """
  arcs_a, finals_a, start_a = _nfa(a)
  arcs_b, finals_b, start_b = _nfa(b)
  index = {(start_a, start_b): 0}
  pairs = [(start_a, start_b)]
  ranges_between: dict[tuple[int, int], list] = {}  # (source, target) -> ranges.
  finals = []
  k = 0
  while k < len(pairs):
    p, q = pairs[k]
    if p in finals_a and q in finals_b:
      finals.append(k)
    for p_next, p_ranges in arcs_a[p]:
      for q_next, q_ranges in arcs_b[q]:
        ranges = _common_ranges(p_ranges, q_ranges)
        if not ranges:
          continue
        target = index.get((p_next, q_next))
        if target is None:
          target = index[p_next, q_next] = len(pairs)
          pairs.append((p_next, q_next))
          if len(pairs) > max_states:
            raise ValueError(f"the intersection needs more than {max_states} states")
        ranges_between.setdefault((k, target), []).extend(ranges)
    k += 1
  if not finals:
    return ir.NOTHING
  arcs = tuple((source, ir.char_class(ranges), target)
               for (source, target), ranges in ranges_between.items())
  return ir.Graph(num_states=len(pairs), arcs=arcs, finals=tuple(finals))


def _cells(range_lists: list[tuple]) -> list[tuple[int, int]]:
  """The coarsest split of the code points into ranges that no given range cuts."""
  bounds = {0, ir.MAX_CODE_POINT + 1}
  for ranges in range_lists:
    for lo, hi in ranges:
      bounds.update((lo, hi + 1))
  edges = sorted(bounds)
  return [(lo, hi - 1) for lo, hi in zip(edges, edges[1:])]


def _covers(ranges: tuple, cell: tuple[int, int]) -> bool:
  return any(lo <= cell[0] and cell[1] <= hi for lo, hi in ranges)


def complement_text(a: ir.Node, *, max_states: int = 100_000) -> ir.Node:
  """The texts (over all code points) not in L(a), as an `ir.Graph`.

  Subset construction of the character NFA over the cells of code points its arcs do
  not split, with a sink for "no state left", then the finals flipped. JSON Schema
  negation (`not: {pattern: ...}`) uses it: regular languages are closed under
  complement.

  Raises:
    ValueError: `a` holds something other than text, or the DFA exceeds `max_states`.
  """
  arcs, finals, start = _nfa(a)
  start_set = frozenset((start,))
  index = {start_set: 0}
  sets = [start_set]
  ranges_between: dict[tuple[int, int], list] = {}
  k = 0
  while k < len(sets):
    current = sets[k]
    out = [(t, r) for q in current for t, r in arcs[q]]
    for cell in _cells([r for _, r in out]):
      target_set = frozenset(t for t, r in out if _covers(r, cell))
      target = index.get(target_set)
      if target is None:
        target = index[target_set] = len(sets)
        sets.append(target_set)
        if len(sets) > max_states:
          raise ValueError(f"the complement needs more than {max_states} states")
      ranges_between.setdefault((k, target), []).append(cell)
    k += 1
  accepting = [i for i, states in enumerate(sets) if not states & finals]
  if not accepting:
    return ir.NOTHING
  graph_arcs = tuple((source, ir.char_class(ranges), target)
                     for (source, target), ranges in ranges_between.items())
  return ir.Graph(num_states=len(sets), arcs=graph_arcs, finals=tuple(accepting))

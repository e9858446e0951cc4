"""Free-form calls aligned with their competitors (`JsonSchema(free_form_depth=None)`).

Public functions:
  align_free_form(node, ws, free_rule, scope)  `node` with the calls of `free_rule`
                                     inlined where they compete.
  ALIGN_SCOPES                       the values of `scope` (`SchemaOptions.free_form_align`).

With `free_form_depth=None` every free-form value is a call of one rule
(`FREE_FORM_RULE`). A call is an epsilon move that a deterministic push-down automaton
must take or not on the next byte. Where a free-form value and an inline value of
another branch may start at the same point (`{"contains": {"minimum": 5}}`: an item is
a number >= 5 or any value, both may start with `7`), it cannot choose, and the
compiler raises `NondeterministicGrammarError`.

The same language is written differently here: a free-form value may be *inline k
levels, then calls*, `E(k)`: `E(0)` is the call, `E(k)` the scalars, `[E(k-1), ...]` and
`{"key": E(k-1), ...}` (`_json_values.json_value_inline`). At a *competition point* (a
union whose alternatives may start alike, a graph state whose arcs may, a part of a
concatenation that may repeat or be skipped where what follows may start alike), let
`K` be one more than the deepest container level (counted from the point) where a byte
that may start a value is read inline. Every free-form value at level `d < K` becomes
`E(K - d)`: then all values below level `K` are inline (the byte automaton of the rule
determinizes them together, as the bounded default does), and every value at level
`K` or deeper is a free-form call, so two paths alike up to a value either both call
the one rule (one call arc) or both read inline. The levels are counted by following
the IR's bytes as a JSON lexer would (inside or outside a string, after a backslash;
`[`/`{` open a level, `]`/`}` close one), so shared sub-trees and graphs are placed
wherever they sit (a byte class that may open a string or a level leads to every state
it may). Where the lexer cannot follow (a token terminal, levels past `_MAX_LEVEL`, a
free-form call reached at several levels), the point is left as it is.

Scopes: `"points"` aligns each outermost competition point that holds a free-form call
(inner points are aligned with it); `"rule"` aligns each rule body as one point (every
free-form value inlined down to the body's deepest inline value: bigger tables, for
conflicts that no local point shows, such as a repeated item against what follows the
whole construct). The compiler tries them in that order, only after the plain calls
raised `NondeterministicGrammarError` (`_compiler.py`), so schemas that compile with
plain calls keep their tables. Keys count as values (a level of only free-form values
still gets one inline level where its keys are read): a small over-approximation.
"""

import functools

from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_values as jv

ALIGN_SCOPES = ("none", "points", "rule")

_VALUE, _STRING, _ESCAPE = 0, 1, 2  # Lexer modes: outside strings, inside, after `\`.
_MAX_LEVEL = 64  # Levels followed from a point before giving up on it.
_MAX_STATES = 64  # Lexer states in one set before giving up.
# Bytes outside strings that start no value: separators, closers and whitespace.
_NOT_VALUE_START = frozenset(b",:]} \t\n\r")
_OPENERS, _CLOSERS = frozenset(b"[{"), frozenset(b"]}")
# Bytes a free-form value may start with (what `json_value_rule` begins with).
_FREE_FIRST = frozenset(b'"-0123456789tfn[{')
_ALL_BYTES = frozenset(range(256))
_UTF8_LEADS = frozenset(range(0xC2, 0xF5))


class _Lost(Exception):
  """The lexer cannot follow the IR from here (see the module docstring)."""


def align_free_form(node: ir.Node, ws: jv.Whitespace, free_rule: str, scope: str
                    ) -> ir.Node:
  """`node` (a rule body) with the free-form calls of `free_rule` inlined at its
  competition points (`scope="points"`) or through the whole body (`"rule"`), as the
  module docstring says; the same language. `scope="none"` returns `node`."""
  if scope == "none":
    return node
  aligner = _Aligner(ws, free_rule)
  if scope == "rule":
    return aligner.align_point(node)
  return ir.transform(node, before=aligner.point_or_none)


class _Aligner:
  """The analyses of one call of `align_free_form`, memoized by node identity."""

  def __init__(self, ws: jv.Whitespace, free_rule: str):
    self.ws = ws
    self.free = ir.RuleRef(free_rule)
    self.firsts: dict = {}
    self.holds_free: dict = {}
    self.scans: dict = {}

  # ---- Finding points. ----

  def point_or_none(self, node: ir.Node) -> ir.Node | None:
    """`node` aligned if it is a competition point holding a free-form call, else None
    (`ir.transform` then looks inside)."""
    if not self._holds_free(node) or not self._competes(node):
      return None
    aligned = self.align_point(node)
    return aligned if aligned is not node else None

  def _holds_free(self, node: ir.Node) -> bool:
    return ir.fold(node, lambda n, kids: n == self.free or any(kids), memo=self.holds_free)

  def _competes(self, node: ir.Node) -> bool:
    """Whether two ways through `node` may read the same first byte."""
    if isinstance(node, ir.Union):
      return _overlap([self._first(a)[0] for a in node.alternatives])
    if isinstance(node, ir.Graph):
      by_state: dict[int, list[frozenset]] = {}
      for source, label, _ in node.arcs:
        first, nullable = self._first(label)
        by_state.setdefault(source, []).append(_ALL_BYTES if nullable else first)
      return any(_overlap(firsts) for firsts in by_state.values())
    if isinstance(node, ir.Concat):  # A part that may end or go on, against the rest.
      after = frozenset()  # First bytes of the parts after the current one.
      for part in reversed(node.parts):
        first, nullable = self._first(part)
        optional = nullable or isinstance(part, ir.Repeat) and part.max != part.min
        if optional and first & after:
          return True
        after = first | after if nullable else first
    return False

  def _first(self, node: ir.Node) -> tuple[frozenset, bool]:
    """(Bytes a text of `node` may start with, whether it may be empty)."""
    return ir.fold(node, self._first_of, memo=self.firsts)

  def _first_of(self, node: ir.Node, kids: tuple) -> tuple[frozenset, bool]:
    match node:
      case ir.Bytes(data):
        return frozenset(data[:1]), not data
      case ir.CharClass(ranges):
        low = {b for lo, hi in ranges for b in range(lo, min(hi, 0x7F) + 1)}
        wide = any(hi > 0x7F for _, hi in ranges)
        return frozenset(low) | (_UTF8_LEADS if wide else frozenset()), False
      case ir.ByteClass(ranges):
        return frozenset(b for lo, hi in ranges for b in range(lo, hi + 1)), False
      case ir.Concat():
        out = frozenset()
        for first, nullable in kids:
          out |= first
          if not nullable:
            return out, False
        return out, True
      case ir.Union():
        return frozenset().union(*(f for f, _ in kids)), any(n for _, n in kids)
      case ir.Repeat():
        return kids[0][0], kids[0][1] or node.min == 0
      case ir.RuleRef():
        return (_FREE_FIRST, False) if node == self.free else (_ALL_BYTES, True)
      case ir.Marker():
        return frozenset(), True
      case ir.Graph():
        return frozenset().union(*(f for f, _ in kids)), 0 in node.finals
      case ir.Fragment():
        return kids[0] if kids else (_ALL_BYTES, True)
    return _ALL_BYTES, False  # A terminal: any token.

  # ---- Aligning one point. ----

  def align_point(self, node: ir.Node) -> ir.Node:
    """`node` with every free-form call at level `d < K` replaced by `E(K - d)`, where
    `K` is one more than the deepest level of a value read inline (levels counted from
    `node`'s start); `node` itself where the lexer cannot follow it."""
    start = frozenset([(_VALUE, 0)])
    try:
      _, deepest = self._scan(node, start)
      if deepest is None:
        return node  # Nothing read inline: free-form calls only.
      return self._rewrite(node, start, deepest + 1, {})
    except _Lost:
      return node

  def _scan(self, node: ir.Node, states: frozenset) -> tuple[frozenset, int | None]:
    """(Lexer states after `node` from `states`, deepest level where `node` reads a byte
    that may start a value, None if none; free-form calls read nothing)."""
    key = (id(node), states)
    hit = self.scans.get(key)
    if hit is not None:
      return hit[1]
    out = self._scan_node(node, states)
    if len(out[0]) > _MAX_STATES or any(abs(d) > _MAX_LEVEL for _, d in out[0]):
      raise _Lost()
    self.scans[key] = (node, out)  # Keeps `node` alive so that its id stays unique.
    return out

  def _scan_node(self, node: ir.Node, states: frozenset) -> tuple[frozenset, int | None]:
    match node:
      case ir.Bytes(data):
        deepest = None
        for byte in data:
          states, level = _step(states, (byte,))
          deepest = _deeper(deepest, level)
        return states, deepest
      case ir.CharClass(ranges) | ir.ByteClass(ranges):
        low = [b for lo, hi in ranges for b in range(lo, min(hi, 0x7F) + 1)]
        if any(hi > 0x7F for _, hi in ranges):
          low.append(0x80)  # Any non-ASCII byte: string content.
        return _step(states, tuple(low))
      case ir.Concat(parts):
        deepest = None
        for part in parts:
          states, level = self._scan(part, states)
          deepest = _deeper(deepest, level)
        return states, deepest
      case ir.Union(alternatives):
        outs, deepest = frozenset(), None
        for alternative in alternatives:
          out, level = self._scan(alternative, states)
          outs, deepest = outs | out, _deeper(deepest, level)
        return outs, deepest
      case ir.Repeat(body, lo, _):
        _, ends, deepest = self._repeat_states(body, lo, states)
        return ends, deepest
      case ir.Graph():
        at, deepest = self._graph_states(node, states)
        return frozenset().union(*(at[f] for f in node.finals)), deepest
      case ir.RuleRef():
        return states, None  # A JSON value: as many levels closed as opened.
      case ir.Marker():
        return states, None
      case ir.Fragment(_, body):
        return self._scan(body, states)
    raise _Lost()  # A terminal: bytes unknown.

  def _repeat_states(self, body: ir.Node, lo: int, states: frozenset):
    """(States where an iteration of `body` may start, states after `lo` or more
    iterations, deepest level read): iterates to a fixpoint (bodies are balanced, so it
    comes at once)."""
    deepest = None
    starts = frozenset()
    for _ in range(lo):
      starts |= states
      states, level = self._scan(body, states)
      deepest = _deeper(deepest, level)
    ends = states
    while True:
      starts |= states
      states, level = self._scan(body, states)
      deepest = _deeper(deepest, level)
      if states <= ends:
        return starts, ends, deepest
      ends |= states
      if len(ends) > _MAX_STATES:
        raise _Lost()

  def _graph_states(self, graph: ir.Graph, states: frozenset):
    """(Lexer states at each graph state, deepest level read on any arc): a fixpoint."""
    at = [frozenset() for _ in range(graph.num_states)]
    at[0] = states
    deepest = None
    changed = True
    while changed:
      changed = False
      for source, label, target in graph.arcs:
        if not at[source]:
          continue
        out, level = self._scan(label, at[source])
        deepest = _deeper(deepest, level)
        if not out <= at[target]:
          at[target] |= out
          changed = True
          if len(at[target]) > _MAX_STATES:
            raise _Lost()
    return at, deepest

  def _rewrite(self, node: ir.Node, states: frozenset, levels: int, memo: dict) -> ir.Node:
    """`node` read from `states`, each free-form call at level `d < levels` replaced
    by `E(levels - d)`."""
    key = (id(node), states)
    hit = memo.get(key)
    if hit is not None:
      return hit[1]
    out = self._rewrite_node(node, states, levels, memo)
    memo[key] = (node, out)
    return out

  def _rewrite_node(self, node: ir.Node, states: frozenset, levels: int, memo: dict
                    ) -> ir.Node:
    if node == self.free:
      shallow = {d for mode, d in states if d < levels}
      if not shallow:
        return node
      if len(states) != 1 or next(iter(states))[0] != _VALUE:
        raise _Lost()  # Reached at several levels: no one expansion fits.
      return jv.json_value_inline(self.ws, self.free.name, levels - shallow.pop())
    match node:
      case ir.Concat(parts):
        new = []
        for part in parts:
          new.append(self._rewrite(part, states, levels, memo))
          states = self._scan(part, states)[0]
        return ir.rebuild(node, new)
      case ir.Union(alternatives):
        return ir.rebuild(node, [self._rewrite(a, states, levels, memo)
                                 for a in alternatives])
      case ir.Repeat(body, lo, _):
        starts = self._repeat_states(body, lo, states)[0]
        return ir.rebuild(node, [self._rewrite(body, starts, levels, memo)])
      case ir.Graph():
        at = self._graph_states(node, states)[0]
        return ir.rebuild(node, [self._rewrite(label, at[source], levels, memo)
                                 for source, label, _ in node.arcs])
    return node  # Leaves, other rules' calls, fragments (none under free_form_depth=None).


def _overlap(firsts: list[frozenset]) -> bool:
  """Whether two of `firsts` share a byte."""
  seen = frozenset()
  for first in firsts:
    if seen & first:
      return True
    seen |= first
  return False


def _deeper(a: int | None, b: int | None) -> int | None:
  return b if a is None else a if b is None else max(a, b)


@functools.lru_cache(maxsize=65536)
def _step(states: frozenset, data) -> tuple[frozenset, int | None]:
  """(Lexer states after reading one of the bytes `data` (0x80: any non-ASCII byte)
  from one of `states`, the deepest level where one of them may start a value)."""
  out, deepest = set(), None
  for mode, level in states:
    for byte in data:
      if mode == _ESCAPE:
        out.add((_STRING, level))
      elif mode == _STRING:
        out.add((_ESCAPE if byte == 0x5C else _VALUE if byte == 0x22 else _STRING, level))
      else:
        if byte not in _NOT_VALUE_START:
          deepest = _deeper(deepest, level)
        if byte == 0x22:
          out.add((_STRING, level))
        else:
          out.add((_VALUE, level + (byte in _OPENERS) - (byte in _CLOSERS)))
  return frozenset(out), deepest

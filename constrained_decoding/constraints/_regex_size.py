"""Regex front end, part: the size of an IR's expansion, estimated before expanding it.

`estimate_size` bounds the states and determinization work that expanding counted
repeats would cost, linear in the IR, so that a hostile `a{100000000}` or
`(?:a?){10000}` is refused in microseconds (`_regex._check_budget`).
"""

import dataclasses
import typing

from constrained_decoding.constraints import _ir as ir


# --- Size estimate before expansion -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Size:
  """What expanding one IR node into a byte automaton costs, estimated without doing it.

  Attributes:
    states: Automaton states the expansion creates (each counted repeat copies its body).
    min_len, max_len: Shortest and longest matching byte string (None: no longest).
    char_len: The length in characters when every match has the same one, else None.
      Copies of a fixed-length body stay in step while matching; copies of a
      variable-length one drift apart, and the determinizer then tracks sets of them.
    work: Extra work, beyond the states, of removing epsilons and determinizing: a run
      of k optional parts, or k copies of a variable-length body, puts O(k) positions in
      every subset, so it costs O(k * states) rather than O(states).
    empty: The node matches nothing (then the lengths mean nothing).
    exits: States inside the node with an epsilon path to its end (optional copies of
      a counted repeat): in an epsilon chain, each of them reaches every later copy.
  """

  states: int
  min_len: int
  max_len: int | None
  char_len: int | None
  work: int
  empty: bool = False
  exits: int = 0


_EMPTY_SIZE = _Size(0, 0, 0, None, 0, empty=True)


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _utf8_width(code_point: int) -> int:
  return 1 if code_point < 0x80 else 2 if code_point < 0x800 else 3 if code_point < 0x10000 else 4


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _leaf_size(node) -> _Size:
  """The size of a node without IR children."""
  kind = type(node)
  if kind is ir.Bytes:
    data = node.data
    return _Size(len(data), len(data), len(data), len(data.decode("utf-8", "replace")), 0)
  if kind is ir.CharClass:
    if not node.ranges:
      return _EMPTY_SIZE
    lo, hi = _utf8_width(node.ranges[0][0]), _utf8_width(node.ranges[-1][1])
    # ASCII: one arc; otherwise a few states per UTF-8 length (shared suffixes).
    return _Size(1 + 3 * (hi - 1) + min(len(node.ranges), 16), lo, hi, 1, 0)
  if kind is ir.ByteClass:
    return _Size(1, 1, 1, 1, 0) if node.ranges else _EMPTY_SIZE
  return _Size(1, 1, 1, 1, 0)  # A Terminal: one token-class arc.


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _children(node) -> tuple:
  kind = type(node)
  if kind is ir.Concat:
    return node.parts
  if kind is ir.Union:
    return node.alternatives
  if kind is ir.Repeat:
    return (node.node,)
  if kind is ir.Graph:
    return tuple(label for _, label, _ in node.arcs)
  if kind is ir.Fragment:
    return (node.body,)
  return ()


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _concat_size(sizes: list[_Size]) -> _Size:
  """A concatenation; each run of consecutive optional parts adds run length x states."""
  if any(s.empty for s in sizes):
    return _EMPTY_SIZE
  work = sum(s.work for s in sizes)
  run_length = run_states = 0
  for s in sizes + [_Size(0, 1, 1, 1, 0)]:  # A sentinel ends the last run.
    if s.min_len == 0:
      run_length += 1
      run_states += s.states + 1
    else:
      if run_length > 1:
        work += run_length * run_length * run_states
      run_length = run_states = 0
  lengths = [s.char_len for s in sizes]
  exits = 0
  for s in reversed(sizes):  # The last part's exits, and those of any nullable tail.
    exits += s.exits
    if s.min_len:
      break
  return _Size(sum(s.states for s in sizes) + len(sizes), sum(s.min_len for s in sizes),
               None if any(s.max_len is None for s in sizes) else sum(s.max_len for s in sizes),
               None if None in lengths else sum(lengths), work, exits=exits)


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _union_size(sizes: list[_Size]) -> _Size:
  sizes = [s for s in sizes if not s.empty]
  if not sizes:
    return _EMPTY_SIZE
  lengths = {s.char_len for s in sizes}
  return _Size(sum(s.states for s in sizes), min(s.min_len for s in sizes),
               None if any(s.max_len is None for s in sizes) else max(s.max_len for s in sizes),
               lengths.pop() if len(lengths) == 1 else None, sum(s.work for s in sizes),
               exits=sum(s.exits for s in sizes))


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _repeat_size(node: ir.Repeat, body: _Size) -> _Size:
  """`body{min,max}`: one copy of the body per count (`x{m,}` is m copies, one looping)."""
  low, high = node.min, node.max
  if body.empty:
    return _EMPTY_SIZE if low else _Size(0, 0, 0, 0, 0)
  copies = high if high is not None else max(low, 1)
  states = copies * (body.states + 1) + 2
  work = copies * body.work
  if body.min_len == 0:  # An epsilon chain through every copy: each subset spans all.
    work += copies ** 3 * (body.states + 1) * max(1, body.exits)
  elif body.char_len is None:  # Copies drift apart (see `_Size.work`).
    work += copies * copies * (body.states + 1)
  max_len = None if high is None and body.max_len != 0 or body.max_len is None else (
      (high or 0) * body.max_len)
  char_len = low * body.char_len if low == high and body.char_len is not None else None
  exits = (copies - low if high is not None else 1) + body.exits
  return _Size(states, low * body.min_len, max_len, char_len, work, exits=exits)


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _graph_size(node: ir.Graph, labels: list[_Size]) -> _Size:
  """An embedded automaton: its states and labels; lengths are not computed (0, None)."""
  return _Size(node.num_states + sum(s.states for s in labels), 0, None, None,
               sum(s.work for s in labels) + len(labels))


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def estimate_size(node: ir.Node) -> _Size:
  """The `_Size` of `node`, in time linear in the IR (not in its expansion).

  Iterative (an explicit stack), so that deeply nested IR cannot exhaust Python's
  recursion limit; shared sub-nodes are sized once.
  """
  sizes: dict[int, _Size] = {}
  stack = [(node, False)]
  while stack:
    current, expanded = stack.pop()
    key = id(current)
    if key in sizes:
      continue
    children = _children(current)
    if not expanded and children:
      stack.append((current, True))
      stack.extend((child, False) for child in children if id(child) not in sizes)
      continue
    kind = type(current)
    parts = [sizes[id(child)] for child in children]
    if kind is ir.Concat:
      sizes[key] = _concat_size(parts)
    elif kind is ir.Union:
      sizes[key] = _union_size(parts)
    elif kind is ir.Repeat:
      sizes[key] = _repeat_size(current, parts[0])
    elif kind is ir.Graph:
      sizes[key] = _graph_size(current, parts)
    elif kind is ir.Fragment:
      sizes[key] = parts[0]
    else:
      sizes[key] = _leaf_size(current)
  return sizes[id(node)]

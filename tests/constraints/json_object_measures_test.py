"""`_json_objects.ir_size` and `wide_parts` (folds with fast paths by node type) against
plain recursive definitions, over the corpus's IR and hand-made trees."""

import pytest

import constrained_decoding as cd
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_objects as jo


def _memoized(fn):
  """`fn` remembering its answers by node identity (shared sub-trees measured once)."""
  memo = {}

  def once(n):
    if id(n) not in memo:
      memo[id(n)] = (n, fn(n))
    return memo[id(n)][1]

  return once


def _reference_size(n) -> int:
  if isinstance(n, ir.Fragment):
    return 1
  kids = ir.children(n)
  if isinstance(n, ir.Repeat):
    copies = max(1, n.min if n.max is None else n.max)
    if copies > jo.COUNTED_REPEAT_COPIES and jo._is_counted(n):  # pylint: disable=protected-access
      copies = jo.COUNTED_REPEAT_COPIES
    return 1 + _reference_size(n.node) * copies
  return 1 + sum(_reference_size(k) for k in kids)


def _reference_wide(n) -> tuple[int, int]:
  if isinstance(n, ir.Fragment):
    return 1, 0
  if isinstance(n, ir.CharClass):
    return 0, int(sum(hi - lo + 1 for lo, hi in n.ranges) >= jo.NARROW_CLASS)
  if isinstance(n, ir.Repeat):
    if n.max is None and jo._is_wide(n.node):  # pylint: disable=protected-access
      return 1, 0
    copies = max(1, n.min if n.max is None else n.max)
    w, k = _reference_wide(n.node)
    return w * copies, k * copies
  parts = [_reference_wide(k) for k in ir.children(n)]
  return sum(w for w, _ in parts), sum(k for _, k in parts)


def _check(node) -> int:
  """Compares every distinct sub-tree of `node`; returns how many were compared."""
  global _reference_size, _reference_wide  # pylint: disable=global-statement
  plain = _reference_size, _reference_wide
  _reference_size, _reference_wide = map(_memoized, plain)
  try:
    return _compare_all(node)
  finally:
    _reference_size, _reference_wide = plain


def _compare_all(node) -> int:
  seen, todo, size_memo, wide_memo = set(), [node], {}, {}
  while todo:
    n = todo.pop()
    if id(n) in seen:
      continue
    seen.add(id(n))
    assert jo.ir_size(n, size_memo) == _reference_size(n), n
    w, k = _reference_wide(n)
    assert jo.wide_parts(n, wide_memo) == w + k / jo.NARROW_PER_WIDE, n
    if not isinstance(n, ir.Fragment):
      todo.extend(ir.children(n))
  return len(seen)


_WIDE = ir.char_class([(0x20, 0x10FFFF)])
_NARROW = ir.char_class([(ord("a"), ord("z")), (ord("A"), ord("Z"))])
_FRAGMENT = ir.Fragment("any", ir.concat(ir.Bytes(b"x"), ir.repeat(_WIDE, 0, None)))
_HAND_MADE = [
    ir.Bytes(b"abc"), _WIDE, _NARROW, ir.char_class([(48, 57)]), _FRAGMENT, ir.EPSILON,
    ir.NOTHING, ir.Marker("set", 0, 1),
    ir.repeat(_WIDE, 0, None), ir.repeat(_NARROW, 2, 5), ir.repeat(_WIDE, 3, 1000),
    ir.repeat(ir.union(_WIDE, ir.Bytes(b"\\n")), 0, None),
    ir.concat(ir.Bytes(b"{"), _FRAGMENT, ir.repeat(ir.concat(_NARROW, _FRAGMENT), 1, 3)),
    ir.union(ir.repeat(_NARROW, 0, 300), ir.concat(_NARROW, ir.Bytes(b"-"), _NARROW)),
]


@pytest.mark.parametrize("index", range(len(_HAND_MADE)))
def test_hand_made_trees(index):
  assert _check(_HAND_MADE[index]) >= 1


def test_corpus_schemas():
  from benchmarks.schema_corpus import load_corpus  # pylint: disable=g-import-not-at-top

  checked = 0
  for entry in list(load_corpus().values())[::11]:
    try:
      checked += _check(cd.JsonSchema(entry["schema"]).to_ir())
    except cd.ConstraintError:
      continue
  assert checked > 1000

"""`ir.fold`: values against a plain recursion (no memo), one call per distinct node,
fragments entered only when asked, memos shared between calls, the collector restored."""

import gc
import random

import pytest

from constrained_decoding.constraints import _ir as ir


def _random_node(rng: random.Random, depth: int, pool: list) -> ir.Node:
  """A random IR of every node type, reusing earlier sub-trees (shared by identity)."""
  if pool and rng.random() < 0.2:
    return rng.choice(pool)
  kind = rng.randrange(9 if depth else 4)
  if kind == 0:
    node = ir.Bytes(bytes(rng.choice(b"ab") for _ in range(rng.randrange(3))))
  elif kind == 1:
    node = ir.char_class([(0x61, 0x61 + rng.randrange(900))])
  elif kind == 2:
    node = rng.choice([ir.RuleRef("r"), ir.Marker("set", 0, 1), ir.Terminal("TEXT_TOKEN"),
                       ir.byte_class([(0, 3)])])
  elif kind == 3:
    node = ir.Fragment("f", ir.Concat((ir.Bytes(b"x"), ir.RuleRef("in_fragment"))))
  elif kind == 4:
    node = ir.Concat(tuple(_random_node(rng, depth - 1, pool) for _ in range(3)))
  elif kind == 5:
    node = ir.Union(tuple(_random_node(rng, depth - 1, pool) for _ in range(2)))
  elif kind == 6:
    node = ir.Repeat(_random_node(rng, depth - 1, pool), 1, rng.choice([None, 3]))
  elif kind == 7:
    node = ir.Graph(2, ((0, _random_node(rng, depth - 1, pool), 1),
                        (1, _random_node(rng, depth - 1, pool), 0)), (1,))
  else:
    node = ir.Fragment("g", _random_node(rng, depth - 1, pool))
  pool.append(node)
  return node


def _measure(n: ir.Node, values: tuple) -> tuple:
  """(nodes counted per occurrence, RuleRef names seen), from the children's values."""
  names = frozenset().union(*(v[1] for v in values))
  if isinstance(n, ir.RuleRef):
    names |= {n.name}
  return 1 + sum(v[0] for v in values), names


def _plain(n: ir.Node, enter_fragments: bool) -> tuple:
  """`_measure` folded by plain recursion over the node types (the oracle)."""
  if isinstance(n, ir.Fragment):
    kids = (n.body,) if enter_fragments else ()
  elif isinstance(n, ir.Concat):
    kids = n.parts
  elif isinstance(n, ir.Union):
    kids = n.alternatives
  elif isinstance(n, ir.Repeat):
    kids = (n.node,)
  elif isinstance(n, ir.Graph):
    kids = tuple(label for _, label, _ in n.arcs)
  else:
    kids = ()
  return _measure(n, tuple(_plain(k, enter_fragments) for k in kids))


def _distinct(node: ir.Node, enter_fragments: bool, seen: dict) -> None:
  if id(node) in seen:
    return
  seen[id(node)] = node
  if isinstance(node, ir.Fragment) and not enter_fragments:
    return
  for child in ir.children(node):
    _distinct(child, enter_fragments, seen)


@pytest.mark.parametrize("enter_fragments", [False, True])
def test_fold_equals_plain_recursion_calling_fn_once_per_distinct_node(enter_fragments):
  rng = random.Random(7)
  for _ in range(200):
    node = _random_node(rng, 4, [])
    calls = []

    def fn(n, values):
      calls.append(n)
      return _measure(n, values)

    assert ir.fold(node, fn, enter_fragments=enter_fragments) == _plain(node,
                                                                        enter_fragments)
    seen = {}
    _distinct(node, enter_fragments, seen)
    assert sorted(map(id, calls)) == sorted(seen)


def test_fragment_bodies_are_leaves_unless_entered():
  node = ir.concat(ir.Bytes(b"a"), ir.Fragment("f", ir.RuleRef("x")))
  assert ir.fold(node, _measure)[1] == frozenset()
  assert ir.fold(node, _measure, enter_fragments=True)[1] == {"x"}


def test_a_fragment_subclass_is_a_fragment():
  class Named(ir.Fragment):  # pylint: disable=too-few-public-methods
    pass

  node = ir.Union((Named("n", ir.RuleRef("x")), ir.Bytes(b"b")))
  assert ir.fold(node, _measure)[1] == frozenset()
  assert ir.fold(node, _measure, enter_fragments=True)[1] == {"x"}


def test_a_shared_memo_measures_each_node_once_across_calls():
  shared = ir.concat(ir.Bytes(b"ab"), ir.char_class([(0x30, 0x39)]))
  first, second = ir.Repeat(shared, 0, None), ir.Union((shared, ir.Bytes(b"c")))
  memo, calls = {}, []

  def fn(n, values):
    calls.append(n)
    return _measure(n, values)

  assert ir.fold(first, fn, memo=memo) == _plain(first, False)
  before = len(calls)
  assert ir.fold(second, fn, memo=memo) == _plain(second, False)
  assert [c for c in calls[before:]] == [ir.Bytes(b"c"), second]  # `shared` memoized.


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_restored_even_when_fn_raises(enabled):
  was = gc.isenabled()
  try:
    (gc.enable if enabled else gc.disable)()
    assert ir.fold(ir.concat(ir.Bytes(b"a"), ir.Bytes(b"b")), _measure)[0] == 3
    assert gc.isenabled() == enabled

    def boom(n, values):
      raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
      ir.fold(ir.Bytes(b"a"), boom)
    assert gc.isenabled() == enabled
  finally:
    (gc.enable if was else gc.disable)()


def test_a_non_node_is_refused():
  with pytest.raises(TypeError):  # "Expected an IR node" (or the test-time type check)
    ir.fold(ir.Concat((ir.Bytes(b"a"), 3)), _measure)

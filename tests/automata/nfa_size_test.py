"""`_nfa.nfa_size`, the byte-NFA budget estimate, against the NFA that `build_nfa` builds.

Oracles: the number of states of the built NFA (exact for IR without repeats when no
state is shared, where the estimate counts what the adders create; an upper bound with repeats, which the estimate
counts as more copies than `build_nfa` needs), and the estimate's formula spelled out
here as a plain recursion over the tree (no memo, no shared walk).
"""

import random

import pytest

from constrained_decoding.automata import _nfa
from constrained_decoding.constraints import _ir as ir

_FRAGMENT_BODY = ir.concat(ir.Bytes(b"fr"), ir.char_class([(0x61, 0x62), (0x400, 0x4FF)]))


def _random_node(rng: random.Random, depth: int, shared: list, repeats: bool) -> ir.Node:
  """A random IR with every node type the byte NFA takes, sub-trees reused (shared)."""
  if shared and rng.random() < 0.15:
    return rng.choice(shared)
  kind = rng.randrange(10 if depth else 5)
  if kind == 0:
    node = ir.Bytes(bytes(rng.choice(b"abc") for _ in range(rng.randrange(0, 4))))
  elif kind == 1:
    lo = rng.choice([0x61, 0x100, 0x800, 0x10000])
    node = ir.char_class([(lo, lo + rng.randrange(300))])
  elif kind == 2:
    node = rng.choice([ir.byte_class([(0, 9)]), ir.Terminal("TEXT_TOKEN"),
                       ir.Marker("set", 0, 1)])
  elif kind == 3:
    node = ir.Fragment("f", _FRAGMENT_BODY)
  elif kind == 4:
    node = ir.EPSILON
  elif kind in (5, 6):
    node = ir.Concat(tuple(_random_node(rng, depth - 1, shared, repeats)
                           for _ in range(rng.randrange(0, 4))))
  elif kind == 7:
    node = ir.Union(tuple(_random_node(rng, depth - 1, shared, repeats)
                          for _ in range(rng.randrange(1, 4))))
  elif kind == 8 and repeats:
    low = rng.randrange(3)
    node = ir.Repeat(_random_node(rng, depth - 1, shared, repeats), low,
                     rng.choice([None, low, low + 2]))
  else:
    n = rng.randrange(1, 4)
    arcs = tuple((rng.randrange(n), _random_node(rng, depth - 1, shared, repeats),
                  rng.randrange(n)) for _ in range(rng.randrange(0, 5)))
    node = ir.Graph(n, arcs, (n - 1,))
  shared.append(node)
  return node


def _formula(node: ir.Node, fragments: bool) -> int:
  """The estimate, node by node, written out (`nfa_size` without its leading 2)."""
  if isinstance(node, ir.Bytes):
    return max(len(node.data) - 1, 0)
  if isinstance(node, ir.CharClass):
    ranges = node.ranges
    return 0 if not ranges or ranges[-1][1] < 0x80 else len(
        _nfa.build_nfa(node).arcs) - 2
  if isinstance(node, ir.Concat):
    return max(len(node.parts) - 1, 0) + sum(_formula(p, fragments) for p in node.parts)
  if isinstance(node, ir.Union):
    return sum(_formula(a, fragments) for a in node.alternatives)
  if isinstance(node, ir.Repeat):
    copies = max(node.min, 1) if node.max is None else node.max
    return 2 + copies * (_formula(node.node, fragments) + 1)
  if isinstance(node, ir.Graph):
    return node.num_states + sum(_formula(label, fragments) for _, label, _ in node.arcs)
  if isinstance(node, ir.Fragment):
    return 0 if fragments else _formula(node.body, fragments)
  return 0


@pytest.mark.parametrize("fragments", [False, True])
def test_estimate_counts_the_states_built_without_repeats(fragments):
  rng = random.Random(3)
  nodes = [_random_node(rng, 4, [], repeats=False) for _ in range(300)]
  fewer = 0
  for node in nodes:
    # Exact when no state is shared (`Nfa.cons`); sharing only builds fewer.
    built = len(_nfa.build_nfa(node, fragments, share=False).arcs)
    shared = len(_nfa.build_nfa(node, fragments).arcs)
    assert _nfa.nfa_size(node, fragments) == built >= shared, node
    fewer += built > shared
  assert fewer


@pytest.mark.parametrize("fragments", [False, True])
def test_estimate_bounds_the_states_built_and_follows_its_formula(fragments):
  rng = random.Random(4)
  for _ in range(300):
    node = _random_node(rng, 4, [], repeats=True)
    size = _nfa.nfa_size(node, fragments)
    assert size == 2 + _formula(node, fragments), node
    assert size >= len(_nfa.build_nfa(node, fragments).arcs), node


def test_shared_subtrees_count_once_per_occurrence():
  inner = ir.concat(ir.Bytes(b"abc"), ir.char_class([(0x61, 0x7A)]))
  node = ir.Concat((inner,) * 50)
  assert _nfa.nfa_size(node) == 2 + 49 + 50 * 3 == len(_nfa.build_nfa(node).arcs)


def test_nested_bounded_repeats_multiply_in_linear_time():
  node = ir.Bytes(b"ab")
  for _ in range(40):  # 1000^40 copies: the estimate must not enumerate them.
    node = ir.Repeat(node, 0, 1000)
  size = _nfa.nfa_size(node)
  assert size > 1000 ** 40


def test_subclassed_nodes_are_sized_like_their_base():
  class MyConcat(ir.Concat):  # pylint: disable=too-few-public-methods
    pass

  node = ir.union(MyConcat((ir.Bytes(b"xy"), ir.Bytes(b"z"))), ir.Bytes(b"q"))
  assert _nfa.nfa_size(node) == 2 + _formula(node, False) == 2 + (1 + 1 + 0) + 0


def test_a_non_node_is_refused():
  with pytest.raises(TypeError):  # "Expected an IR node" (or the test-time type check)
    _nfa.nfa_size(ir.Concat((ir.Bytes(b"a"), "b")))

"""Byte DFAs are numbered canonically (`_fsa.breadth_first`): equal languages, equal tables.

The oracle is an independent breadth-first numbering written here (a queue over bytes
0..255, then token-class, fragment and marker arcs in index order), and languages that
are equal by construction but built from different IR (so different NFAs, byte classes
and OpenFst numberings).
"""

import random

import numpy as np
import pytest

from constrained_decoding.automata import _byte_dfa
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _regex


def _columns(dfa: _byte_dfa.ByteDfa) -> list[list[int]]:
  """Each state's targets in label order: bytes, token classes, fragments, markers."""
  rows = [list(map(int, row)) for row in dfa.transitions]
  for arcs, width in ((dfa.token_arcs, len(ir.TOKEN_CLASSES)),
                      (dfa.fragment_arcs, len(dfa.fragments)),
                      (dfa.marker_arcs, len(dfa.markers))):
    extra = [[-1] * width for _ in rows]
    for state, index, target in arcs.tolist():
      extra[state][index] = target
    for row, more in zip(rows, extra):
      row += more
  return rows


def _is_breadth_first(dfa: _byte_dfa.ByteDfa) -> bool:
  """Whether a queue from state 0, arcs in label order, numbers states 0, 1, 2, ..."""
  rows = _columns(dfa)
  seen, queue = {0}, [0]
  for state in queue:
    for target in rows[state]:
      if target >= 0 and target not in seen:
        seen.add(target)
        queue.append(target)
  return queue == list(range(dfa.num_states))


def _assert_same(a: _byte_dfa.ByteDfa, b: _byte_dfa.ByteDfa) -> None:
  np.testing.assert_array_equal(a.transitions, b.transitions)
  np.testing.assert_array_equal(a.accepting, b.accepting)
  np.testing.assert_array_equal(a.token_arcs, b.token_arcs)


_PATTERNS = [
    r"Red|Orange|Yellow|Green|Blue|Indigo|Violet",
    r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    r"[^\"\\]*\"(?:,[^\"\\]*\")*",
    r"(?:a|bc)*d?",
    r".{0,3}é",
    r"(?:\u4e00|[😀-🙏])+x",
]


@pytest.mark.parametrize("pattern", _PATTERNS)
def test_fast_and_plain_pipelines_give_identical_tables(pattern):
  # Different NFAs (byte classes against single bytes, epsilons removed by OpenFst or
  # not): the minimal DFAs are isomorphic, so canonical numbering makes them equal.
  node = _regex.parse_regex(pattern)
  fast = _fsa.compile_byte_dfa(node)
  plain = _fsa.fst_to_byte_dfa(_fsa.ir_to_fst(node))
  _assert_same(fast, plain)
  assert _is_breadth_first(fast)


@pytest.mark.parametrize("left, right", [
    (r"ab|ac", r"a[bc]"),
    (r"(?:a|b)*", r"(?:a*b*)*"),
    (r"x{2,3}", r"xx|xxx"),
    (r"(?:ab)*a", r"a(?:ba)*"),
    (r"[0-9]+(?:\.[0-9]+)?", r"[0-9]+|[0-9]+\.[0-9]+"),
    (r"é|è", r"\xc3[\xa8\xa9]"),
])
def test_equal_languages_written_differently_give_identical_tables(left, right):
  if "\\x" in right:  # Raw bytes: the UTF-8 of é (c3 a9) and è (c3 a8).
    node = ir.concat(ir.Bytes(b"\xc3"), ir.byte_class([(0xA8, 0xA9)]))
  else:
    node = _regex.parse_regex(right)
  _assert_same(_fsa.compile_byte_dfa(_regex.parse_regex(left)), _fsa.compile_byte_dfa(node))


def test_start_is_zero_and_unreachable_states_are_dropped():
  # 3 -a-> 1 -b-> 2 (final); state 0 is unreachable from the start 3.
  dfa = _fsa._dfa_from_arcs(3, np.array([False, False, True, False]),
                            np.array([3, 1, 0]), np.array([ord("a") + 1, ord("b") + 1,
                                                           ord("c") + 1]),
                            np.array([1, 2, 2]), _nfa.BYTE_EDGES)
  assert dfa.num_states == 3 and dfa.start == 0
  assert dfa.transitions[0, ord("a")] == 1 and dfa.transitions[1, ord("b")] == 2
  assert dfa.accepts(b"ab") and not dfa.accepts(b"cb")


def test_token_class_arcs_are_numbered_after_bytes():
  # From the start: byte 'z' and TEXT_TOKEN lead to different states; 'z' comes first.
  node = ir.union(ir.concat(ir.Bytes(b"z"), ir.Bytes(b"1")),
                  ir.concat(ir.Terminal("TEXT_TOKEN"), ir.Bytes(b"22")))
  dfa = _fsa.compile_byte_dfa(node)
  assert _is_breadth_first(dfa)
  assert dfa.transitions[0, ord("z")] == 1
  assert [tuple(a) for a in dfa.token_arcs.tolist()] == [(0, 1, 2)]


def _random_node(rng: random.Random, depth: int) -> ir.Node:
  """A random IR over a small alphabet (so that unions overlap and DFAs merge states)."""
  kind = rng.randrange(6 if depth else 2)
  if kind == 0:
    return ir.Bytes(bytes(rng.choice(b"abc") for _ in range(rng.randrange(1, 3))))
  if kind == 1:
    lo = rng.choice(b"abcd")
    return ir.char_class([(lo, lo + rng.randrange(3))])
  if kind == 2:
    return ir.concat(*(_random_node(rng, depth - 1) for _ in range(rng.randrange(2, 4))))
  if kind == 3:
    return ir.union(*(_random_node(rng, depth - 1) for _ in range(rng.randrange(2, 4))))
  if kind == 4:
    low = rng.randrange(3)
    return ir.repeat(_random_node(rng, depth - 1), low, rng.choice([None, low + 2]))
  return ir.concat(_random_node(rng, depth - 1), ir.Terminal("TEXT_TOKEN"))


def _rewritten(node: ir.Node) -> ir.Node:
  """The same language through other constructors: unions in reverse order, empty
  strings between the parts of a concatenation, x* as (empty | x{1,})."""
  def rewrite(n: ir.Node) -> ir.Node:
    if isinstance(n, ir.Union):
      return ir.Union(n.alternatives[::-1])
    if isinstance(n, ir.Concat):
      return ir.Concat(tuple(x for part in n.parts for x in (part, ir.EPSILON)))
    if isinstance(n, ir.Repeat) and n.min == 0 and n.max is None:
      return ir.Union((ir.EPSILON, ir.Repeat(n.node, 1, None)))
    return n
  return ir.transform(node, rewrite)


def test_random_equal_languages_give_identical_tables():
  rng = random.Random(15)
  different = 0
  for _ in range(150):
    node = _random_node(rng, 3)
    other = _rewritten(node)
    a, b = _fsa.compile_byte_dfa(node), _fsa.compile_byte_dfa(other)
    _assert_same(a, b)
    assert _is_breadth_first(a)
    # The test would be empty if the rewrites never changed the NFA.
    different += _nfa.build_nfa(other).arcs != _nfa.build_nfa(node).arcs
  assert different > 50

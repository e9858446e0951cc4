"""Shared suffix states in the byte NFA (`_nfa._add_concat`, `Nfa.cons`).

A concatenation shares the state before its part i with every concatenation whose parts
from i on are equal (by value: equal sub-trees built as separate objects too) into the
same state.
Oracles: Python's `re` on every string up to length 5 over the alphabet, the minimal DFA
of the same NFA built without sharing (`build_nfa(share=False)`), and the order in which
pseudo-bytes (fragments) appear in the IR.
"""

import copy
import functools
import itertools
import random
import re

import numpy as np
import pytest

from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa
from constrained_decoding.constraints import _ir as ir

_ALPHABET = "abc"
_TEXTS = ["".join(t) for n in range(6) for t in itertools.product(_ALPHABET, repeat=n)]


def _random_pair(rng: random.Random, depth: int, pool: list) -> tuple[ir.Node, str]:
  """(IR node, equivalent Python regex); earlier pairs are reused as they are (one object
  in several places) or as equal copies, so concatenations often end in equal parts."""
  if pool and rng.random() < 0.35:
    node, pattern = rng.choice(pool)
    return (node if rng.random() < 0.5 else copy.deepcopy(node)), pattern
  kind = rng.randrange(5 if depth else 2)
  if kind == 0:
    text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(4)))
    pair = ir.Bytes(text.encode()), f"(?:{re.escape(text)})"
  elif kind == 1:
    chars = sorted(rng.sample(_ALPHABET, rng.randint(1, 2)))
    pair = ir.char_class([(ord(c), ord(c)) for c in chars]), f"[{''.join(chars)}]"
  elif kind == 2:
    parts = [_random_pair(rng, depth - 1, pool) for _ in range(rng.randint(2, 4))]
    pair = ir.Concat(tuple(p for p, _ in parts)), "(?:" + "".join(r for _, r in parts) + ")"
  elif kind == 3:
    alts = [_random_pair(rng, depth - 1, pool) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:  # Alternatives ending in one tail (one object): `X t | Y t`.
      tail, tail_pattern = _random_pair(rng, depth - 1, pool)
      alts = [(ir.Concat((p, tail)), r + tail_pattern) for p, r in alts]
    pair = ir.Union(tuple(p for p, _ in alts)), "(?:" + "|".join(r for _, r in alts) + ")"
  else:
    body, pattern = _random_pair(rng, depth - 1, pool)
    low, high = rng.choice([(0, None), (1, None), (2, None), (0, 1), (1, 2), (2, 2)])
    pair = ir.Repeat(body, low, high), f"(?:{pattern}){{{low},{'' if high is None else high}}}"
  pool.append(pair)
  return pair


_BUILD_NFA = _nfa.build_nfa


def _unshared(monkeypatch):
  """Makes `_fsa` build its NFAs without shared states."""
  monkeypatch.setattr(_nfa, "build_nfa", functools.partial(_BUILD_NFA, share=False))


def test_shared_states_keep_the_language(monkeypatch):
  rng = random.Random(7)
  shared_somewhere = 0
  for _ in range(150):
    pool = []
    node, pattern = _random_pair(rng, 4, pool)
    dfa = _fsa.compile_byte_dfa(node)
    oracle = re.compile(pattern)
    for text in _TEXTS:
      assert dfa.accepts(text.encode()) == bool(oracle.fullmatch(text)), (pattern, text)
    with monkeypatch.context() as m:
      _unshared(m)
      plain = _fsa.compile_byte_dfa(node)
    shared_somewhere += (len(_nfa.build_nfa(node, share=False).arcs)
                         > len(_nfa.build_nfa(node).arcs))
    np.testing.assert_array_equal(dfa.transitions, plain.transitions)
    np.testing.assert_array_equal(dfa.accepting, plain.accepting)
  assert shared_somewhere > 20, "too few NFAs share a state: the test would be vacuous"


def test_alternatives_with_equal_tails_share_them():
  tail = ir.char_class([(0x30, 0x39)])
  node = ir.Union(tuple(ir.Concat((ir.Bytes(bytes([c])), tail, tail, ir.Bytes(b"!")))
                        for c in b"abcdef"))
  shared = len(_nfa.build_nfa(node).arcs)
  plain = len(_nfa.build_nfa(node, share=False).arcs)
  # Unshared: 3 states inside each of the 6 alternatives; shared: 3 in all.
  assert (plain, shared) == (2 + 6 * 3, 2 + 3)


def test_equal_tails_built_as_separate_objects_share_them():
  def tail():  # A new object at each call, equal to the others.
    return ir.Concat((ir.Bytes(b":"), ir.Repeat(ir.char_class([(0x30, 0x39)]), 1, None),
                      ir.Bytes(b"}")))

  assert tail() == tail() and tail() is not tail()
  copies = ir.Union(tuple(ir.Concat((ir.Bytes(bytes([c])), tail(), ir.Bytes(b"!")))
                          for c in b"abc"))
  one = tail()
  same = ir.Union(tuple(ir.Concat((ir.Bytes(bytes([c])), one, ir.Bytes(b"!")))
                        for c in b"abc"))
  assert len(_nfa.build_nfa(copies).arcs) == len(_nfa.build_nfa(same).arcs)
  assert len(_nfa.build_nfa(copies).arcs) < len(_nfa.build_nfa(copies, share=False).arcs)
  dfa = _fsa.compile_byte_dfa(copies)
  oracle = re.compile(r"[abc]:[0-9]+}!")
  texts = ["".join(t) for n in range(7) for t in itertools.product("ab:1}!", repeat=n)]
  assert sum(bool(oracle.fullmatch(t)) for t in texts) == 4  # a:1}! ... b:11}!
  for text in texts:
    assert dfa.accepts(text.encode()) == bool(oracle.fullmatch(text)), text


def test_literals_share_their_suffixes_into_one_state():
  node = ir.Union((ir.Bytes(b"xyz"), ir.Bytes(b"wyz"), ir.Bytes(b"vz"), ir.Bytes(b"yz")))
  assert len(_nfa.build_nfa(node).arcs) == 2 + 2  # The states before "yz" and "z".
  assert len(_nfa.build_nfa(node, share=False).arcs) == 2 + 2 + 2 + 1 + 1


def test_unicode_classes_into_one_state_share_their_continuation_bytes():
  wide, narrow = ir.char_class([(0x41, 0x41), (0x80, 0x10FFFF)]), ir.char_class([(0x100, 0x7FF)])
  node = ir.Repeat(ir.Union((ir.Concat((ir.Bytes(b"x"), wide)),
                             ir.Concat((ir.Bytes(b"y"), narrow)))), 1, None)
  assert len(_nfa.build_nfa(node).arcs) < len(_nfa.build_nfa(node, share=False).arcs)
  dfa = _fsa.compile_byte_dfa(node)
  oracle = re.compile("(?:x[A\x80-\U0010ffff]|y[\u0100-\u07ff])+")
  rng = random.Random(5)
  chars = ["x", "y", "A", "\x7f", "\x80", "\xff", "\u0100", "\u07ff", "\u0800", "\uffff",
           "\U00010000", "\U0010ffff"]
  texts = ["".join(rng.choice(chars) for _ in range(rng.randrange(5))) for _ in range(3000)]
  assert sum(bool(oracle.fullmatch(t)) for t in texts) > 20
  for text in texts:
    assert dfa.accepts(text.encode()) == bool(oracle.fullmatch(text)), text


def test_loops_inside_a_concatenation_start_at_its_state():
  # `"a*"`: the state after the quote loops on `a` itself (no entry and exit states).
  node = ir.Concat((ir.Bytes(b"q"), ir.Repeat(ir.Bytes(b"a"), 0, None), ir.Bytes(b"q")))
  nfa = _nfa.build_nfa(node)
  assert len(nfa.arcs) == 2 + 2
  assert [len(v) for v in nfa.epsilons.values()] == [1]  # Out of the loop only.


def test_separated_lists_loop_on_their_own_states_only():
  item, comma = ir.Bytes(b"a"), ir.Bytes(b",")
  items = ir.Concat((item, ir.Repeat(ir.Concat((comma, item)), 0, None)))
  node = ir.Union((items, ir.Bytes(b"b"),
                   ir.Concat((ir.Bytes(b"["), item, ir.Repeat(ir.Concat((comma, item)), 0, None),
                              ir.Bytes(b"]")))))
  assert _nfa._separated_lists(items.parts)  # pylint: disable=protected-access
  dfa = _fsa.compile_byte_dfa(node)
  oracle = re.compile(r"a(?:,a)*|b|\[a(?:,a)*\]")
  texts = ["".join(t) for n in range(7) for t in itertools.product("ab,[]", repeat=n)]
  assert sum(bool(oracle.fullmatch(t)) for t in texts) > 5
  for text in texts:
    assert dfa.accepts(text.encode()) == bool(oracle.fullmatch(text)), text


def test_pseudo_bytes_are_numbered_in_order_of_appearance():
  def fragment(name):
    return ir.Fragment(name, ir.Bytes(name.encode()))

  tail = ir.Concat((fragment("x"), fragment("z")))
  node = ir.Union((ir.Concat((fragment("a"), tail)), ir.Concat((fragment("b"), tail)),
                   ir.Concat((fragment("c"), fragment("x"), fragment("z")))))
  dfa = _fsa.compile_byte_dfa(node, fragments=True)
  assert [f.name for f in dfa.fragments] == ["a", "x", "z", "b", "c"]


@pytest.mark.parametrize("fragments", [False, True])
def test_a_shared_part_is_built_once(fragments):
  built = []
  body = ir.Bytes(b"q")
  shared = ir.Fragment("f", body)
  node = ir.Union((ir.Concat((ir.Bytes(b"a"), shared)), ir.Concat((ir.Bytes(b"b"), shared))))
  adders = dict(_nfa._ADDERS)  # pylint: disable=protected-access

  def counting(nfa, part, src, dst):
    built.append(part)
    adders[ir.Fragment](nfa, part, src, dst)

  _nfa._ADDERS[ir.Fragment] = counting  # pylint: disable=protected-access
  try:
    dfa = _fsa.compile_byte_dfa(node, fragments=fragments)
  finally:
    _nfa._ADDERS[ir.Fragment] = adders[ir.Fragment]  # pylint: disable=protected-access
  assert built == [shared]
  if not fragments:
    assert dfa.accepts(b"aq") and dfa.accepts(b"bq") and not dfa.accepts(b"q")

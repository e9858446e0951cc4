"""`_intersect.intersect_text` against Python's `re`: a text is in the intersection of
two regexes' languages exactly when both `re.fullmatch` it."""

import itertools
import random
import re

import hypothesis
from hypothesis import strategies as st
import pytest

from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_formats
from constrained_decoding.constraints import _regex

_ATOMS = ["a", "b", "é", "[ab]", "[^a]", ".", "(a|bé)", "x?"]


@st.composite
def _regexes(draw, depth=2):
  """Small random regexes over a few atoms (with a non-ASCII character)."""
  if depth == 0 or draw(st.booleans()):
    return draw(st.sampled_from(_ATOMS))
  kind = draw(st.sampled_from(["concat", "union", "star", "repeat"]))
  left = draw(_regexes(depth - 1))
  if kind == "star":
    return f"(?:{left})*"
  if kind == "repeat":
    lo = draw(st.integers(0, 2))
    return f"(?:{left}){{{lo},{lo + draw(st.integers(0, 2))}}}"
  right = draw(_regexes(depth - 1))
  return f"(?:{left})(?:{right})" if kind == "concat" else f"(?:{left}|{right})"


def _texts(max_length=4):
  for n in range(max_length + 1):
    for chars in itertools.product("abéx", repeat=n):
      yield "".join(chars)


_ALL_TEXTS = list(_texts())


def _accepts(node, texts):
  dfa = compile_byte_dfa(node)
  return [dfa.accepts(t.encode()) for t in texts]


@hypothesis.settings(max_examples=80, deadline=None)
@hypothesis.given(a=_regexes(), b=_regexes())
def test_intersection_matches_re(a, b):
  node = _intersect.intersect_text(_regex.parse_regex(a, unicode=True),
                                   _regex.parse_regex(b, unicode=True))
  expected = [bool(re.fullmatch(a, t, re.S) and re.fullmatch(b, t, re.S))
              for t in _ALL_TEXTS]
  if node == ir.NOTHING:
    assert not any(expected)
  else:
    assert _accepts(node, _ALL_TEXTS) == expected, (a, b)


@pytest.mark.parametrize("lo,hi", [(0, 0), (1, 3), (2, None), (0, None)])
def test_length_is_counted_in_code_points(lo, hi):
  node = _intersect.intersect_text(_regex.parse_regex("[aé]*", unicode=True),
                                   _intersect.text_of_length(lo, hi))
  texts = [t for t in _ALL_TEXTS if set(t) <= {"a", "é"}]
  expected = [lo <= len(t) and (hi is None or len(t) <= hi) for t in texts]
  assert _accepts(node, texts) == expected


def test_disjoint_languages_give_nothing():
  assert _intersect.intersect_text(ir.Bytes(b"ab"), ir.Bytes(b"ba")) == ir.NOTHING


def test_non_text_is_refused():
  with pytest.raises(ValueError, match="not UTF-8 text"):
    _intersect.intersect_text(ir.Bytes(b"\xff"), ir.Bytes(b"a"))
  with pytest.raises(ValueError, match="does not denote text"):
    _intersect.intersect_text(ir.byte_class([(0, 255)]), ir.Bytes(b"a"))


def test_state_budget():
  with pytest.raises(ValueError, match="more than 50 states"):
    _intersect.intersect_text(_regex.parse_regex("a*", unicode=True),
                              _intersect.text_of_length(0, 200), max_states=50)


@pytest.mark.parametrize("pattern", ["^a", "b$", "^[a-z]+$", "x|yz", "^(ab)*$", "é", "^$"])
def test_complement_text_is_the_complement(pattern):
  # Oracle: `re.search` on random texts over an alphabet that crosses every class.
  dfa = compile_byte_dfa(_intersect.complement_text(_json_formats.pattern_ir(pattern)))
  rng = random.Random(pattern)
  for _ in range(500):
    text = "".join(rng.choice("abxyzé \u4e2d") for _ in range(rng.randint(0, 6)))
    assert dfa.accepts(text.encode()) == (re.search(pattern, text) is None), text

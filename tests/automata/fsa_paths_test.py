"""The fast paths of `automata/_fsa.py` against the plain ones and against `re`.

`_nfa_pack.pack_bytes` packs large epsilon-free NFAs with numpy and `_nfa` builds
non-ASCII classes from a cached template; both must give the very same bytes / language.
`_nfa_pack.pack_const` must give the same automaton in the `const` format, and
`_fsa.fst_arcs` the arcs that pywrapfst lists.
"""

import random
import re

import numpy as np
import pytest
import pywrapfst

import constrained_decoding as cd
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa
from constrained_decoding.automata import _nfa_pack

_PATTERNS = [
    r'"([^"\\]|\\.)*"',
    r"[\x00\x01é-ë]+x",
    r"(?:[\x00-\x7f]|[^\x00-\x7f]{2})*\x01",
    r"\d+(\.\d+)?([eE][+-]?\d+)?",
    r"(?:Red|Orange|Yellow|Green|Blue|Indigo|Violet){1,3}",
    r"[^\n]*\n[^\n]*",
    r"[😀-🙏a-c\x00]{2,4}",
]


def _packed(nfa, edges, finals, *, plain):
  saved = nfa.epsilons
  if plain:  # A dummy epsilon entry sends `pack_bytes` down its loop over arcs.
    nfa.epsilons = {len(nfa.arcs) + 10: []}
  try:
    return _nfa_pack.pack_bytes(nfa, edges, finals)[0]
  finally:
    nfa.epsilons = saved


# Regexes and an object whose key needs UTF-8 and a control escape.
_PACKING_SPECS = [cd.Regex(p) for p in _PATTERNS] + [
    cd.JsonSchema({"type": "object", "properties": {"é\x01": {"type": "string"},
                                                    "n": {"type": "integer"}}}),
]


def _epsilon_free(spec):
  """(nfa, finals, byte-class edges) of `spec`, epsilons removed: what the packers take."""
  nfa = _nfa.build_nfa(spec.to_ir())
  finals = _nfa.remove_epsilons(nfa)
  return nfa, finals, _nfa.byte_classes(nfa.bounds)


@pytest.mark.parametrize("spec", _PACKING_SPECS)
def test_numpy_packing_equals_the_loop(spec):
  nfa, finals, edges = _epsilon_free(spec)
  fast, deterministic = _nfa_pack._pack_bytes_numpy(  # pylint: disable=protected-access
      nfa, edges, finals)
  assert fast == _packed(nfa, edges, finals, plain=True)
  # Deterministic iff no state has two arcs with one label.
  labels = {}
  for state, arcs in enumerate(nfa.arcs):
    for k in range(0, len(arcs), 3):
      first = edges.index(arcs[k])
      last = edges.index(arcs[k + 1] + 1)
      for label in range(first, last):
        labels[state, label] = labels.get((state, label), 0) + 1
  assert deterministic == all(v == 1 for v in labels.values())


def _arc_lists(fst) -> list:
  """Every state's finality and arcs, read through pywrapfst's own API."""
  return [(fst.final(s) == pywrapfst.Weight.one(fst.weight_type()),
           [(a.ilabel, a.olabel, a.nextstate) for a in fst.arcs(s)]) for s in fst.states()]


@pytest.mark.parametrize("spec", _PACKING_SPECS)
def test_const_packing_equals_the_vector_packing(spec):
  nfa, finals, edges = _epsilon_free(spec)
  vector, deterministic = _nfa_pack.pack_bytes(nfa, edges, finals)
  expected = _arc_lists(pywrapfst.Fst.read_from_string(vector))
  const, const_deterministic = _nfa_pack.pack_const(nfa, edges, finals)
  fst = pywrapfst.Fst.read_from_string(const)
  assert fst.fst_type() == "const"
  assert _arc_lists(fst) == expected
  assert const_deterministic == deterministic
  # Both ways of writing it: numpy for 64 states and more, a loop below.
  small = _nfa.Nfa()
  small.arcs = nfa.arcs[:60]
  small.arcs = [[x if i % 3 != 2 or x < 60 else 1 for i, x in enumerate(a)]
                for a in small.arcs]
  small_vector, small_deterministic = _nfa_pack.pack_bytes(small, edges, finals)
  small_const, small_const_deterministic = _nfa_pack.pack_const(small, edges, finals)
  assert (_arc_lists(pywrapfst.Fst.read_from_string(small_const))
          == _arc_lists(pywrapfst.Fst.read_from_string(small_vector)))
  assert small_const_deterministic == small_deterministic


def test_const_packing_refuses_epsilons():
  nfa = _nfa.build_nfa(cd.Regex("a*b").to_ir())
  with pytest.raises(ValueError, match="epsilon"):
    _nfa_pack.pack_const(nfa, _nfa.byte_classes(nfa.bounds), {1})


def test_fst_arcs_leaves_the_properties_of_its_input():
  nfa = _fsa.ir_to_fst(cd.Regex("(ab|ac)*d").to_ir()).rmepsilon()
  dfa = pywrapfst.determinize(nfa).minimize()
  every = pywrapfst.FstProperties.FST_PROPERTIES
  before = dfa.properties(every, False)
  start, accepting, src, labels, dst = _fsa.fst_arcs(dfa)
  assert dfa.properties(every, False) == before
  assert sorted(zip(src.tolist(), labels.tolist(), dst.tolist())) == sorted(
      (s, a.ilabel, a.nextstate) for s in dfa.states() for a in dfa.arcs(s))
  assert start == dfa.start()
  assert accepting.tolist() == [dfa.final(s) == pywrapfst.Weight.one("tropical")
                                for s in dfa.states()]


def _sample(rng: random.Random) -> str:
  alphabet = ["\x00", "\x01", "x", "a", "\n", "é", "ê", "ë", "ì", "\u4e00", "😀", "\"", "\\"]
  return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))


@pytest.mark.parametrize("pattern", _PATTERNS[1:3] + [r"[^\x00\x01]?[\x00-\x01\u0100-\uffff]"])
def test_cached_class_templates_match_re(pattern):
  for _ in range(2):  # The second compile reads the cached templates.
    dfa = _fsa.compile_byte_dfa(cd.Regex(pattern).to_ir())
    oracle = re.compile(pattern, re.DOTALL)
    rng = random.Random(pattern)
    texts = [_sample(rng) for _ in range(400)]
    matched = [t for t in texts if oracle.fullmatch(t)]
    assert matched, "no sample matches: the test would be vacuous"
    for text in texts:
      assert dfa.accepts(text.encode()) == bool(oracle.fullmatch(text)), text


def test_byte_dfa_table_is_row_major():
  dfa = _fsa.compile_byte_dfa(cd.Regex(r"[a-f]+[0-9]").to_ir())
  assert dfa.transitions.flags.c_contiguous
  table, first, size = dfa.byte_classes
  np.testing.assert_array_equal(table, dfa.transitions[:, first])
  assert size.sum() == 256

"""The fast paths of `automata/_fsa.py` against the plain ones and against `re`.

`_nfa.pack_bytes` packs large epsilon-free NFAs with numpy and builds non-ASCII classes
from a cached template; both must give the very same bytes / language.
"""

import random
import re

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa

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
    return _nfa.pack_bytes(nfa, edges, finals)[0]
  finally:
    nfa.epsilons = saved


@pytest.mark.parametrize("spec", [cd.Regex(p) for p in _PATTERNS] + [
    cd.JsonSchema({"type": "object", "properties": {"é\x01": {"type": "string"},
                                                    "n": {"type": "integer"}}}),
])
def test_numpy_packing_equals_the_loop(spec):
  nfa = _nfa.build_nfa(spec.to_ir())
  finals = _nfa.remove_epsilons(nfa)
  edges = _nfa.byte_classes(nfa.bounds)
  fast, deterministic = _nfa._pack_bytes_numpy(nfa, edges, finals)  # pylint: disable=protected-access
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

"""Separated lists `X (Y X)*` built as one loop (`_nfa._add_concat_with_loops`).

The language must not change: against `re.fullmatch` over every short string of the
alphabet, and against the DFA built without the loop (the minimal DFA is unique, so the
two must be equal up to state numbering) for JSON Schemas whose objects and arrays are
separated lists, nested.
"""

import itertools
import random
import re

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _fsa
from constrained_decoding.automata import _nfa
from constrained_decoding.constraints import _ir as ir

# (IR of a part, its regex) over the alphabet "ab,;".
_PIECES = [(ir.Bytes(b"a"), "a"), (ir.Bytes(b"ab"), "ab"),
           (ir.char_class([(ord("a"), ord("b"))]), "[ab]"),
           (ir.union(ir.Bytes(b"b"), ir.Bytes(b"ba")), "(?:b|ba)"),
           (ir.repeat(ir.Bytes(b"a"), 0, None), "a*"),
           (ir.repeat(ir.Bytes(b"b"), 1, 2), "b{1,2}")]
_SEPARATORS = [(ir.char_class([(ord(","), ord(","))]), ","),
               (ir.char_class([(ord(","), ord(",")), (ord(";"), ord(";"))]), "[,;]")]


def _random_list(rng: random.Random) -> tuple[ir.Node, str]:
  """`;X(YX)*,` with X of 1-3 parts (flattened into the outer concat) and Y a separator
  class, maybe followed by a part (classes keep `ir.concat` from merging bytes across
  the borders, which would hide the list from `_separated_lists`)."""
  x = [rng.choice(_PIECES) for _ in range(rng.randint(1, 3))]
  y = [rng.choice(_SEPARATORS)] + [rng.choice(_PIECES[2:])] * rng.randint(0, 1)
  x_ir, x_re = ir.concat(*(n for n, _ in x)), "".join(r for _, r in x)
  y_ir, y_re = ir.concat(*(n for n, _ in y)), "".join(r for _, r in y)
  semicolon, comma = _SEPARATORS[1][0], _SEPARATORS[0][0]
  node = ir.concat(semicolon, x_ir, ir.repeat(ir.concat(y_ir, x_ir), 0, None), comma)
  return node, f"[,;](?:{x_re})(?:(?:{y_re})(?:{x_re}))*,"


@pytest.mark.parametrize("seed", range(8))
def test_loop_language_equals_regex(seed):
  node, pattern = _random_list(random.Random(seed))
  assert _nfa._separated_lists(node.parts)  # pylint: disable=protected-access
  dfa = _fsa.compile_byte_dfa(node)
  for n in range(7):
    for chars in itertools.product("ab,;", repeat=n):
      text = "".join(chars)
      assert dfa.accepts(text.encode()) == bool(re.fullmatch(pattern, text)), (pattern, text)


def _canonical(dfa) -> tuple[bytes, bytes]:
  """The DFA renumbered breadth-first from its start, with its token-class, fragment and
  marker arcs as extra columns (pseudo-bytes) of the table."""
  columns = [dfa.transitions]
  for arcs in (dfa.token_arcs, dfa.fragment_arcs, dfa.marker_arcs):
    column = np.full((dfa.num_states, 1 + int(arcs[:, 1].max(initial=-1))), -1)
    column[arcs[:, 0], arcs[:, 1]] = arcs[:, 2]
    columns.append(column)
  table = np.concatenate(columns, axis=1)
  order, index = [dfa.start], {dfa.start: 0}
  for state in order:
    for target in table[state].tolist():
      if target >= 0 and target not in index:
        index[target] = len(order)
        order.append(target)
  assert len(order) == dfa.num_states  # Trimmed: every state is reached.
  renumber = np.full(dfa.num_states + 1, -1)
  renumber[order] = np.arange(len(order))
  return (renumber[table[order]].tobytes(), dfa.accepting[order].tobytes())


_ITEM = {"type": "object", "additionalProperties": False, "required": ["id"],
         "properties": {"id": {"type": "integer"}, "tags": {"type": "array",
                                                            "items": {"type": "string"}},
                        **{f"k{i}": {"type": "boolean"} for i in range(8)}}}
_SCHEMAS = [
    {"type": "array", "items": {"type": "integer"}},
    {"type": "object", "properties": {"items": {"type": "array", "items": _ITEM},
                                      "next": _ITEM}},
]


@pytest.mark.parametrize("schema", _SCHEMAS)
def test_same_minimal_dfa_as_without_loops(schema, monkeypatch):
  node = cd.JsonSchema(schema).to_ir()
  with_loops = _fsa.compile_byte_dfa(node, fragments=True)
  monkeypatch.setattr(_nfa, "_separated_lists", lambda parts: {})
  without = _fsa.compile_byte_dfa(node, fragments=True)
  assert with_loops.num_states == without.num_states
  assert _canonical(with_loops) == _canonical(without)
  assert with_loops.markers == without.markers and with_loops.fragments == without.fragments

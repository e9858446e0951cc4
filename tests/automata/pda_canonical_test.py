"""Rule DFAs of grammars are numbered canonically (`_rtn._rule_dfa`, `_fsa.breadth_first`):
equal rule bodies give equal tables, however they were written.

Oracles: an independent breadth-first numbering written here (a queue over bytes 0..255,
then call columns in rule order), and grammars whose rules are equal by construction
but written differently (so different IR, NFAs, byte classes and OpenFst numberings).
"""

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding.automata import _pda
from constrained_decoding.automata import _rtn as rtn_lib
from constrained_decoding.constraints import _ir as ir


def _rtn(text: str) -> _pda.Rtn:
  return _pda.build_rtn(cd.Grammar(text).grammar_ir())


def _is_breadth_first(rtn: _pda.Rtn) -> bool:
  """Whether each rule's states, numbered by a queue from the rule's start (bytes in
  order, then calls in rule order), are the rule's own states in order."""
  for rule, start in enumerate(rtn.rule_start):
    states = np.flatnonzero(rtn.rule_of_state == rule)
    seen, queue = {start}, [start]
    for state in queue:
      calls = dict(rtn.calls[state])
      row = rtn.transitions[state].tolist() + [calls.get(j, -1)
                                               for j in range(len(rtn.rules))]
      for target in row:
        if target >= 0 and target not in seen:
          seen.add(target)
          queue.append(target)
    if queue != states.tolist():
      return False
  return True


def _assert_same(a: _pda.Rtn, b: _pda.Rtn) -> None:
  assert a.rules == b.rules
  np.testing.assert_array_equal(a.transitions, b.transitions)
  np.testing.assert_array_equal(a.accepting, b.accepting)
  np.testing.assert_array_equal(a.rule_of_state, b.rule_of_state)
  assert a.calls == b.calls
  assert a.rule_start == b.rule_start
  assert a.tops == b.tops


# Pairs of grammars whose rules match the same strings, written differently.
_EQUAL = [
    ('root ::= "x" ("y" | "z") root?',
     'root ::= ("xz" | "xy") root?'),
    ('root ::= "[" (root ("," root)*)? "]" | [0-9]+',
     'root ::= [0-9] [0-9]* | "[" "]" | "[" (root ",")* root "]"'),
    ('root ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" root ")"',
     'root ::= (term ("-" | "+"))* term\nterm ::= "(" root ")" | [0-4] [0-9]* | [5-9] [0-9]*'),
    ('root ::= "(" (root | "a" | "b")* ")"',
     'root ::= "(" ")" | "(" ([a-b] | root)+ ")"'),
]


@pytest.mark.parametrize("left, right", _EQUAL)
def test_equal_rule_bodies_written_differently_give_identical_tables(left, right):
  a, b = _rtn(left), _rtn(right)
  _assert_same(a, b)
  assert _is_breadth_first(a)


@pytest.mark.parametrize("name", ["json", "arithmetic", "sexpr", "sql_select"])
def test_builtin_grammar_rules_are_numbered_breadth_first(name):
  rtn = _pda.build_rtn(cd.Grammar.builtin(name).grammar_ir())
  assert len(rtn.rules) > 1 or name == "sexpr"
  assert _is_breadth_first(rtn)


def test_rule_dfa_of_the_empty_language_has_no_states():
  empty = ir.Concat((ir.Bytes(b"a"), ir.ByteClass(())))
  table, accepting, markers = rtn_lib._rule_dfa(empty, 2)  # pylint: disable=protected-access
  assert table.shape == (0, 258) and accepting.shape == (0,) and markers == []

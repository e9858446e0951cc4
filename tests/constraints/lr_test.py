"""LR tables over terminals (`constraints/_lr.py`) against Lark's LALR and Earley parsers."""

import os
import random
import re
import sys
from pathlib import Path

import lark
import numpy as np
import pytest

from constrained_decoding import errors
from constrained_decoding.constraints import _lr
from constrained_decoding.testing import random_derivation

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # The Python subset grammar lives in benchmarks/lr_tables.py.
from benchmarks import lr_tables  # noqa: E402  # pylint: disable=g-import-not-at-top

_GRAMMARS = Path(__file__).resolve().parents[2] / "constrained_decoding/constraints/grammars"

# Terminals are rendered as these texts (others: their literal), separated by spaces.
_RENDER = {"NUMBER": "7", "STRING": '"s"', "NAME": "x"}

EXPR = r"""
start: expr
?expr: expr ("+" | "-") term | term
?term: term ("*" | "/") factor | factor
?factor: "-" factor | power
?power: atom "^" factor | atom
?atom: NUMBER | NAME | "(" expr ")" | NAME "(" [expr ("," expr)*] ")"
NUMBER: /[0-9]+/
NAME: /[a-z]+/
%ignore " "
"""

JSON = r"""
start: value
?value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" [pair ("," pair)*] "}"
pair: STRING ":" value
array: "[" [value ("," value)*] "]"
STRING: /"[a-z]*"/
NUMBER: /[0-9]+/
%ignore " "
"""

LISTS = r"""
start: item+
item: "(" item* ")" | NAME | "[" (NAME ";")~1..3 "]" | "<" NAME? ">"
NAME: /[a-z]+/
%ignore " "
"""

# LR(1) but not LALR(1): merging the two states after "e" gives a reduce/reduce conflict.
NOT_LALR = r"""
start: "a" e "c" | "a" f "d" | "b" f "c" | "b" e "d" | "(" g ")" | g
g: "y" | "[" g "]"
e: "x"
f: "x"
%ignore " "
"""

DANGLING_ELSE = r"""
start: stmt
stmt: "if" COND "then" stmt | "if" COND "then" stmt "else" stmt | "go"
COND: /c/
%ignore " "
"""

REDUCE_REDUCE = r"""
start: a ";" | b ";" | "(" start ")"
a: NAME
b: NAME
NAME: /[a-z]+/
%ignore " "
"""


def render(grammar: _lr.TerminalGrammar, terminals) -> str:
  literals = {d.name: d.literal for d in grammar.terminal_defs}
  return " ".join(_RENDER.get(t) or literals[t] for t in terminals)


def mutate(sequence, terminals, rng):
  seq = list(sequence)
  kind = rng.randrange(4)
  i = rng.randrange(len(seq) + 1)
  if kind == 0 and seq:
    del seq[min(i, len(seq) - 1)]
  elif kind == 1:
    seq.insert(i, rng.choice(terminals))
  elif kind == 2 and seq:
    seq[min(i, len(seq) - 1)] = rng.choice(terminals)
  elif len(seq) > 1:
    j = min(i, len(seq) - 2)
    seq[j], seq[j + 1] = seq[j + 1], seq[j]
  return seq


def error_index(parser: _lr.LrParser, sequence) -> int | None:
  """Index of the first terminal rejected (len: at the end), or None if accepted."""
  parser = parser.copy()
  for i, t in enumerate(sequence):
    if not parser.feed(t):
      return i
  return None if parser.accepts_end() else len(sequence)


def lark_error_index(oracle: lark.Lark, text: str) -> int | None:
  try:
    oracle.parse(text)
    return None
  except lark.exceptions.UnexpectedToken as e:
    if e.token.type == "$END":
      return len(text.split(" ")) if text else 0
    return text[:e.token.start_pos].count(" ")
  except lark.exceptions.UnexpectedEOF:
    return len(text.split(" ")) if text else 0


def sequences(grammar, rng, count):
  terminals = list(grammar.terminals)
  for _ in range(count):
    sentence = random_derivation(grammar, rng, depth=rng.randrange(2, 8))
    yield sentence
    for _ in range(rng.randrange(1, 4)):
      sentence = mutate(sentence, terminals, rng)
    yield sentence


@pytest.mark.parametrize("source", [EXPR, JSON, LISTS], ids=["expr", "json", "lists"])
@pytest.mark.parametrize("method", ["lalr", "lr1", "auto"])
def test_acceptance_and_error_position_match_lark_lalr(source, method):
  grammar = _lr.read_lark_rules(source)
  tables = _lr.build_tables(grammar, method=method)
  parser = _lr.LrParser(tables)
  oracle = lark.Lark(source, parser="lalr")
  rng = random.Random(f"{method}-{len(source)}")
  accepted = rejected = 0
  for sequence in sequences(grammar, rng, 300):
    text = render(grammar, sequence)
    mine = error_index(parser, sequence)
    assert mine == lark_error_index(oracle, text), (sequence, text)
    accepted += mine is None
    rejected += mine is not None
  assert accepted > 250 and rejected > 50, (accepted, rejected)


def test_viable_agrees_with_feed_and_prefixes_of_sentences_are_viable():
  grammar = _lr.read_lark_rules(JSON)
  tables = _lr.build_tables(grammar)
  rng = random.Random(0)
  for _ in range(100):
    parser = _lr.LrParser(tables)
    for t in random_derivation(grammar, rng):
      for other in tables.terminals[1:]:
        assert parser.viable(other) == parser.copy().feed(other)
      assert parser.viable(t)
      assert parser.feed(t)
    assert parser.accepts_end()


def test_lr1_but_not_lalr_grammar():
  grammar = _lr.read_lark_rules(NOT_LALR)
  with pytest.raises(errors.NondeterministicGrammarError, match="not LALR.1.: reduce/reduce"):
    _lr.build_tables(grammar, method="lalr")
  canonical = _lr.build_tables(grammar, method="lr1")
  merged = _lr.build_tables(grammar, method="auto")
  assert merged.method == "lr1-merged"
  assert merged.num_states < canonical.num_states
  oracle = lark.Lark(NOT_LALR, parser="earley")
  words = [[a, "X", b] for a in "AB" for b in "CD"] + [["A", "X"], ["X"], ["A", "C"]]
  words += [["LPAR", "LSQB", "Y", "RSQB", "RPAR"], ["LSQB", "LSQB", "Y", "RSQB", "RSQB"],
            ["LPAR", "Y"], ["LSQB", "Y", "RPAR"], ["Y"], ["LPAR", "RPAR"]]
  names = {"LPAR": "(", "RPAR": ")", "LSQB": "[", "RSQB": "]"}
  for word in words:
    text = " ".join(names.get(w, w.lower()) for w in word)
    try:
      oracle.parse(text)
      expected = True
    except lark.exceptions.LarkError:
      expected = False
    for tables in (canonical, merged):
      assert _lr.LrParser(tables).parse(word) == expected, word


def _check_conflict_prefix(grammar, conflict, method):
  """The example prefix leads the parser to the conflicting state under the lookahead."""
  tables = _lr.build_tables(grammar, method=method, resolve="shift")
  assert conflict in tables.conflicts
  parser = _lr.LrParser(tables)
  for t in conflict.prefix:
    assert parser.feed(t), (conflict.prefix, t)
  assert conflict.state in parser.lookahead_states(conflict.terminal)


@pytest.mark.parametrize("method", ["lalr", "auto"])
def test_dangling_else_is_a_shift_reduce_conflict_with_a_real_prefix(method):
  grammar = _lr.read_lark_rules(DANGLING_ELSE)
  with pytest.raises(errors.NondeterministicGrammarError) as info:
    _lr.build_tables(grammar, method=method)
  conflict = info.value.conflict
  message = str(info.value)
  assert conflict.kind == "shift/reduce" and "shift/reduce" in message
  assert conflict.terminal == "ELSE" and "ELSE" in message
  assert "`stmt: IF COND THEN stmt`" in message
  assert "`stmt: IF COND THEN stmt ELSE stmt`" in message
  # LALR merges the inner and outer `if` states: one `if` suffices to reach the state.
  # Canonical LR(1) (auto) needs the nested `if`, whose reduction may see ELSE.
  prefix = ("IF", "COND", "THEN") * (1 if method == "lalr" else 2) + ("GO",)
  assert conflict.prefix == prefix
  assert f"Example prefix: {' '.join(prefix)} · ELSE" in message
  _check_conflict_prefix(grammar, conflict, method)


def test_dangling_else_resolved_as_shift_matches_lark():
  grammar = _lr.read_lark_rules(DANGLING_ELSE)
  tables = _lr.build_tables(grammar, method="lalr", resolve="shift")
  parser = _lr.LrParser(tables)
  oracle = lark.Lark(DANGLING_ELSE, parser="lalr")
  rng = random.Random(1)
  for sequence in sequences(grammar, rng, 200):
    text = render(grammar, sequence)
    assert error_index(parser, sequence) == lark_error_index(oracle, text), text


def test_reduce_reduce_conflict_names_both_rules():
  grammar = _lr.read_lark_rules(REDUCE_REDUCE)
  with pytest.raises(errors.NondeterministicGrammarError) as info:
    _lr.build_tables(grammar)
  conflict = info.value.conflict
  assert conflict.kind == "reduce/reduce" and conflict.terminal == "SEMICOLON"
  assert {str(p) for p in conflict.productions} == {"a: NAME", "b: NAME"}
  assert "rules ['a', 'b']" in str(info.value)
  assert conflict.prefix == ("NAME",)
  _check_conflict_prefix(grammar, conflict, "auto")


def test_deep_conflict_prefix_reaches_the_state():
  # The conflict sits behind nonterminals whose shortest yields must be expanded.
  source = r"""
  start: decl* stmt
  decl: "var" NAME ";"
  stmt: "{" stmt* "}" | NAME "=" expr ";" | cast
  cast: "(" NAME ")" expr ";"
  expr: NAME | "(" expr ")" | "(" NAME ")" expr
  NAME: /[a-z]+/
  """
  grammar = _lr.read_lark_rules(source)
  with pytest.raises(errors.NondeterministicGrammarError) as info:
    _lr.build_tables(grammar)
  conflict = info.value.conflict
  assert len(conflict.prefix) >= 2
  _check_conflict_prefix(grammar, conflict, "auto")


def test_table_encoding():
  grammar = _lr.read_lark_rules(EXPR)
  tables = _lr.build_tables(grammar)
  assert tables.action.dtype == tables.goto.dtype == np.int32
  assert tables.terminals[0] == "$END" and tables.nonterminals[0] == "$START"
  assert str(tables.productions[0]) == "$START: start"
  assert tables.rule_len.tolist() == [len(p.rhs) for p in tables.productions]
  assert [tables.nonterminals[i] for i in tables.rule_lhs] == [
      p.lhs for p in tables.productions]
  # Accept (-1) only on $END; shifts target valid states; reductions valid productions.
  accept = np.argwhere(tables.action == -1)
  assert len(accept) == 1 and accept[0][1] == 0
  assert tables.action.max() <= tables.num_states
  assert -tables.action.min() <= len(tables.productions)
  assert tables.goto.max() < tables.num_states
  assert tables.nbytes == sum(a.nbytes for a in (tables.action, tables.goto,
                                                  tables.rule_lhs, tables.rule_len))


def test_reading_lark_rules():
  grammar = _lr.read_lark_rules(r"""
  start: "select"i columns ("," NAME)* [";"] | start PIPE start
  columns: NAME+ | "*"
  PIPE: "|"
  COMMA: ","
  %import common.CNAME -> NAME
  %declare INDENT DEDENT
  %ignore /[ \t]+/
  """)
  assert grammar.terminals[0] == "SELECT"
  assert set(grammar.terminals) == {"SELECT", "COMMA", "NAME", "SEMICOLON", "PIPE", "STAR"}
  rules = {str(p) for p in grammar.productions}
  assert {"start: SELECT columns __start_star_0 SEMICOLON", "start: SELECT columns",
          "__start_star_0: COMMA NAME", "__start_star_0: __start_star_0 COMMA NAME",
          "columns: __columns_plus_0", "__columns_plus_0: NAME",
          "__columns_plus_0: __columns_plus_0 NAME", "start: start PIPE start"} <= rules
  defs = {d.name: d for d in grammar.terminal_defs}
  assert defs["SELECT"].literal == "select" and defs["SELECT"].ignore_case
  assert defs["COMMA"].literal == "," and defs["INDENT"].pattern is None
  assert grammar.ignored == ("__ANON_0",)


def test_reading_errors():
  with pytest.raises(errors.GrammarSyntaxError, match="terminal 'NAME' is not defined"):
    _lr.read_lark_rules("start: NAME")
  with pytest.raises(errors.UnsupportedGrammarFeatureError):
    _lr.read_lark_rules('start.2: "a"')
  with pytest.raises(errors.GrammarError, match="no start rule"):
    _lr.read_lark_rules('begin: "a"')


def _sql_without_separator() -> str:
  """The SQL grammar with `_S` removed: a lexer separates words by longest match."""
  text = (_GRAMMARS / "sql_select.lark").read_text()
  text = re.sub(r"^_S:.*$", "", text, flags=re.M)
  return re.sub(r"\b_S\b ?", "", text)


def test_sql_grammar_tables():
  text = (_GRAMMARS / "sql_select.lark").read_text()
  with pytest.raises(errors.NondeterministicGrammarError, match="_S"):
    _lr.build_tables(_lr.read_lark_rules(text))  # `_S` before an optional keyword.
  grammar = _lr.read_lark_rules(_sql_without_separator())
  tables = _lr.build_tables(grammar)
  print(f"SQL without _S: {tables.method}, {tables.num_states} states,"
        f" {len(tables.terminals)} terminals, {len(tables.nonterminals)} nonterminals,"
        f" {len(tables.productions)} productions, {tables.nbytes} bytes")
  assert tables.method == "lalr"
  assert 100 < tables.num_states < 400 and len(tables.terminals) == 33
  parser = _lr.LrParser(tables)
  assert parser.parse("SELECT NAME COMMA NAME FROM NAME WHERE NAME COMPARE NUMBER AND NOT"
                      " LPAR NAME IS NOT NULL RPAR ORDER BY NAME DESC LIMIT INT"
                      " SEMICOLON".split())
  assert not parser.parse("SELECT FROM NAME".split())


def _lark_token_names(grammar: _lr.TerminalGrammar, oracle: lark.Lark) -> dict:
  """Our terminal names -> Lark's (anonymous literals are numbered differently)."""
  by_literal = {(t.pattern.value, tuple(t.pattern.flags)): t.name for t in oracle.terminals
                if isinstance(t.pattern, lark.lexer.PatternStr)}
  names = {}
  for d in grammar.terminal_defs:
    key = (d.literal, ("i",) if d.ignore_case else ())
    names[d.name] = by_literal.get(key, d.name) if d.literal is not None else d.name
  return names


def lark_token_error_index(oracle: lark.Lark, names: dict, sequence, start) -> int | None:
  """Lark's LALR parser fed the terminals themselves (no lexer)."""
  interactive = oracle.parse_interactive(start=start)
  for i, t in enumerate(sequence):
    try:
      interactive.feed_token(lark.Token(names[t], "v"))
    except lark.exceptions.UnexpectedInput:
      return i
  try:
    interactive.feed_eof()
  except lark.exceptions.UnexpectedInput:
    return len(sequence)
  return None


@pytest.mark.parametrize("name", ["python", "sql"])
def test_larger_grammars_match_lark_fed_terminals(name):
  if name == "python":
    source, start = lr_tables.PYTHON_SUBSET, "file_input"
  else:
    source, start = _sql_without_separator(), "start"
  grammar = _lr.read_lark_rules(source, start=start)
  tables = _lr.build_tables(grammar)
  assert tables.method == "lalr"
  parser = _lr.LrParser(tables)
  oracle = lark.Lark(source, parser="lalr", start=start)
  names = _lark_token_names(grammar, oracle)
  rng = random.Random(name)
  accepted = rejected = 0
  for sequence in sequences(grammar, rng, 150):
    mine = error_index(parser, sequence)
    assert mine == lark_token_error_index(oracle, names, sequence, start), sequence
    accepted += mine is None
    rejected += mine is not None
  assert accepted > 100 and rejected > 30, (accepted, rejected)


def test_grammar_from_plain_rules_with_empty_production():
  grammar = _lr.TerminalGrammar.from_rules("s", {"s": [("A", "s", "B"), ()]})
  assert grammar.terminals == ("A", "B")
  parser = _lr.LrParser(_lr.build_tables(grammar))
  for n in range(5):
    assert parser.parse(["A"] * n + ["B"] * n)
    assert not parser.parse(["A"] * n + ["B"] * (n + 1))
  assert parser.accepts_end() and not parser.viable("B")

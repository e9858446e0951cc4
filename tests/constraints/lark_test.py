"""Tests for the Lark front end (`constraints/_lark.py`), with `lark` itself as oracle.

Each (grammar, text) verdict of the byte DFA must equal the verdict of lark's Earley
parser with the `dynamic_complete` lexer, which tries every split of the text into
terminals: the grammar's language over characters, which is what the front end
promises (Lark's longest-match lexing is approximated by that union; the grammars here
avoid the cases where Lark's lexers would disagree).
"""

import functools
import random

import lark
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _grammar_depth
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints._lark import parse_lark

# (grammar, texts): every verdict comes from lark.
CASES = [
    # Literals, escapes, case-insensitive literals, ranges.
    ('start: "abc"', ["abc", "ab", "ABC"]),
    (r'start: "a\"b\\c\n\t"', ['a"b\\c\n\t', 'a"b\\c']),
    (r'start: "\x41\u00e9\U0001F600"', ["Aé😀", "A"]),
    (r'start: "\d"', ["\\d", "1"]),  # Unknown escapes stay as written.
    ('start: "select"i', ["select", "SeLeCt", "selec"]),
    ('start: "a".."f"+', ["abcf", "abg", ""]),
    # Regexes and their flags.
    (r"start: /[0-9]+(\.[0-9]+)?/", ["12", "1.5", "1.", ".5"]),
    ("start: /ab+c/i", ["ABBC", "abc", "ac"]),
    ("start: /a.b/s", ["a\nb", "axb", "ab"]),
    ("start: /a.b/", ["a\nb", "axb"]),
    ("start: / a  b /x", ["ab", "a b"]),
    (r"start: /\w+/", ["héllo_1", "a b"]),  # Unicode \w, as Python's re.
    (r"start: /a\/b/", ["a/b", "ab"]),
    # Operators.
    ('start: "a" "b"? "c"* "d"+', ["ad", "abccdd", "abc", "a"]),
    ('start: ["x"] "y"', ["y", "xy", "xxy"]),
    ('start: "a" ~ 3', ["aaa", "aa", "aaaa"]),
    ('start: "a" ~ 1..2 "b"', ["ab", "aab", "b", "aaab"]),
    ('start: ("a" | "b" "c")+', ["abca", "bc", "ac", ""]),
    # Rules, modifiers, aliases, terminals built from terminals.
    ('start: greeting " " NAME\n?greeting: "hi" | "hello" -> hello\n'
     'NAME: LETTER+\nLETTER: "a".."z"', ["hi bob", "hello al", "hey bob", "hi "]),
    ('!start: _inner "!"\n_inner: "x"', ["x!", "x"]),
    ("start: A B\nA: /a+/\nB: A \"b\"", ["aab", "aaab", "ab", "b"]),
    ('start: item ("," item)*\nitem: NUMBER | "[" start "]"\n%import common.NUMBER',
     ["1,2", "[1,[2]]", "[[1]]", "1,", "[1"]),
    # Layout: continuation lines, comments, newlines inside brackets.
    ('start: "a"\n     | "b"  // or b\n# comment\n     | "c"', ["a", "b", "c", "d"]),
    # %ignore: between every two symbols and around the text, never inside a terminal.
    ('start: "a" "b"\n%ignore " "', ["ab", " a  b ", "a b", "a\tb"]),
    ('start: "a"*\n%ignore " "', ["", "  ", "a a  a", " aa ", "a b"]),
    ('start: WORD ("," WORD)*\n%import common.WORD\n%import common.WS\n%ignore WS',
     ["ab , cd", "ab,cd", "a b"]),
    ('start: "x" "y"\n%ignore /-+/\n%ignore COMMENT\nCOMMENT: "#" /[^\\n]*/ "\\n"',
     ["x--y", "x#c\ny", "-x-#\n-y", "x#cy", "x-y-"]),
    ('start: "(" start ")" | "o"\n%ignore " "', ["( (o ) )", " o ", "( o"]),
    ('start: x x\nx: "[" "]"\n%ignore " "', ["[] [ ]", "[ ][]", "[] ]["]),
    # %import forms.
    ("start: N\n%import common.INT -> N", ["12", "1a"]),
    ("start: A B\n%import common (DIGIT, LETTER)\nA: DIGIT\nB: LETTER", ["1a", "a1"]),
]


@functools.cache
def _oracle(grammar: str) -> lark.Lark:
  return lark.Lark(grammar, parser="earley", lexer="dynamic_complete")


def _oracle_accepts(grammar: str, text: str) -> bool:
  try:
    _oracle(grammar).parse(text)
  except lark.exceptions.LarkError:
    return False
  return True


@functools.cache
def _dfa(grammar: str, start: str = "start"):
  spec = cd.Grammar(grammar, syntax="lark", start=start)
  if _grammar.recursive_rules(spec.grammar_ir()):
    spec = cd.Grammar(grammar, syntax="lark", start=start, max_depth=4)
  return compile_byte_dfa(spec.to_ir())


@pytest.mark.parametrize("grammar, texts", CASES)
def test_verdicts_match_lark(grammar, texts):
  dfa = _dfa(grammar)
  verdicts = {text: _oracle_accepts(grammar, text) for text in texts}
  assert any(verdicts.values()) and not all(verdicts.values()), verdicts  # A useful case.
  for text, expected in verdicts.items():
    assert dfa.accepts(text.encode()) == expected, text


COMMON = ["DIGIT", "HEXDIGIT", "INT", "SIGNED_INT", "DECIMAL", "FLOAT", "SIGNED_FLOAT",
          "NUMBER", "SIGNED_NUMBER", "ESCAPED_STRING", "LCASE_LETTER", "UCASE_LETTER",
          "LETTER", "WORD", "CNAME", "WS_INLINE", "WS", "CR", "LF", "NEWLINE",
          "SH_COMMENT", "CPP_COMMENT", "C_COMMENT", "SQL_COMMENT"]
PROBES = ["0", "7", "a", "F", "g", "12", "-3", "+4", "1.", ".5", "1.5", "1e3", "1.5E-3",
          "-1.5e+3", "e3", "abc", "aBc", "_a1", "1a", " ", " \t", "\n", "\r\n", "\n\n",
          '""', '"a b"', '"a\\"b"', '"a\\\\"', '"a" "b"', '"a\\"', "# hi", "// hi",
          "/* a * b */", "/* a */ */", "-- hi", "x"]


@pytest.mark.parametrize("name", COMMON)
def test_common_terminals_match_lark(name):
  grammar = f"start: {name}\n%import common.{name}"
  dfa = _dfa(grammar)
  for text in PROBES:
    assert dfa.accepts(text.encode()) == _oracle_accepts(grammar, text), text
  rng = random.Random(name)
  g = cd.Grammar(grammar, syntax="lark").grammar_ir()
  for _ in range(20):
    text = _grammar_depth.sample_text(g, rng, max_depth=0).decode()
    assert _oracle_accepts(grammar, text), text


def test_newlines_inside_brackets_are_allowed():
  """An extension: Lark itself allows a newline in an expansion only before `|`."""
  dfa = _dfa('start: ( "a"\n   "b" ) [ "c"\n ]')
  assert dfa.accepts(b"ab") and dfa.accepts(b"abc") and not dfa.accepts(b"a")


def test_ignore_stays_between_symbols():
  """Rule bodies neither start nor end with ignored text (a push-down automaton would
  otherwise share it between caller and callee); the wrapper rule holds the ends."""
  g = parse_lark('start: "(" start ")" | "o"\n%ignore " "')
  assert g.start == "start'"
  assert _grammar.references(g["start'"]) == ("start",)
  body = g["start"]
  for alternative in body.alternatives:
    parts = alternative.parts if isinstance(alternative, ir.Concat) else (alternative,)
    assert not isinstance(parts[0], ir.Repeat) and not isinstance(parts[-1], ir.Repeat)


def test_repeat_in_sequence_is_not_copied():
  g = parse_lark('start: "[" x ("," x)* "]"\nx: "(" x ")" | "o"\n%ignore " "')
  assert str(g["start"]).count("RuleRef(name='x')") == 2


def test_custom_start_and_rules_as_written():
  g = parse_lark('expr: term ("+" term)*\nterm: NUMBER | "(" expr ")"\n'
                 "%import common.NUMBER", start="expr")
  assert g.start == "expr" and g.names == ("expr", "term")
  assert _grammar.recursive_rules(g) == {"expr", "term"}
  assert _dfa('expr: term ("+" term)*\nterm: /[0-9]/ | "(" expr ")"', "expr").accepts(b"(1+2)+3")


def test_builtin_sql_parses():
  g = cd.Grammar.builtin("sql_select").grammar_ir()
  assert _grammar.recursive_rules(g) == {"negation"}


# (grammar, error class, message regex, line, column)
ERRORS = [
    ("start: a", errors.GrammarSyntaxError, r"rule 'a' is not defined", 1, 8),
    ("start: B", errors.GrammarSyntaxError, r"terminal 'B' is not defined", 1, 8),
    ('start: "a"\nstart: "b"', errors.GrammarSyntaxError, r"'start' is defined a second time",
     2, 1),
    ("A: start\nstart: A", errors.GrammarSyntaxError, r"terminal refers to the rule 'start'",
     1, 4),
    ("A: B\nB: A\nstart: A", errors.GrammarSyntaxError, r"'A' refers to itself \(A -> B -> A\)",
     1, 1),
    ('start: ("a"', errors.GrammarSyntaxError, r"group opened at line 1, column 8 is not closed",
     1, 12),
    ('start: "a" )', errors.GrammarSyntaxError, r"unexpected '\)' in the definition of 'start'",
     1, 12),
    ('start: "a" @', errors.GrammarSyntaxError, r"unexpected character '@'", 1, 12),
    ('start: "a" ~ 3..1', errors.GrammarSyntaxError, r"~ 3..1 has max < min", 1, 17),
    ('start: "ab".."z"', errors.GrammarSyntaxError, r"not one character", 1, 8),
    ("start: /a(/", errors.GrammarSyntaxError, r"regex /a\(/ does not parse", 1, 8),
    ('start: "a" ->\n', errors.GrammarSyntaxError, r"found the end of the line. Expected an"
     r" alias name", 1, 14),
    ('%import common.FOO\nstart: "a"', errors.GrammarSyntaxError, r"common.FOO is not available",
     1, 16),
    ('%import common.WS -> ws\nstart: "a"', errors.GrammarSyntaxError,
     r"imported as 'ws'", 1, 16),
    ('%frobnicate\nstart: "a"', errors.GrammarSyntaxError, r"unknown directive '%frobnicate'",
     1, 1),
    # Outside the subset.
    ('start: "a"\n_sep{x}: x', errors.UnsupportedGrammarFeatureError,
     r"template _sep\{...\} is not supported", 2, 5),
    ('start: sep{"a"}', errors.UnsupportedGrammarFeatureError, r"template use sep\{...\}", 1, 8),
    ('start.2: "a"', errors.UnsupportedGrammarFeatureError, r"priority of 'start'", 1, 6),
    ('A.2: "a"\nstart: A', errors.UnsupportedGrammarFeatureError, r"priority of 'A'", 1, 2),
    ('%declare X\nstart: "a"', errors.UnsupportedGrammarFeatureError,
     r"directive %declare is not supported", 1, 1),
    ('%override start: "b"', errors.UnsupportedGrammarFeatureError, r"%override", 1, 1),
    ('%import python.NAME\nstart: "a"', errors.UnsupportedGrammarFeatureError,
     r"importing from 'python'", 1, 9),
    ("start: /a/l", errors.UnsupportedGrammarFeatureError, r"regex flag 'l'", 1, 8),
    ("start: /(?=a)a/", errors.UnsupportedGrammarFeatureError, r"lookahead", 1, 8),
]


@pytest.mark.parametrize("grammar, error, match, line, column", ERRORS)
def test_errors_give_line_and_column(grammar, error, match, line, column):
  with pytest.raises(error, match=match) as info:
    parse_lark(grammar)
  assert (info.value.line, info.value.column) == (line, column)
  assert f"at line {line}, column {column}:" in str(info.value)


def test_missing_start_rule():
  with pytest.raises(errors.GrammarError, match=r"no start rule 'start'.*\['x'\]"):
    parse_lark('x: "a"')


def test_unsupported_is_also_an_unsupported_feature_error():
  with pytest.raises(errors.UnsupportedFeatureError):
    parse_lark('%declare X\nstart: "a"')

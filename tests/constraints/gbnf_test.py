"""Tests for the GBNF front end (`constraints/_gbnf.py`).

Accept/reject tables run through the whole regular pipeline (`compile_byte_dfa` of
`Grammar(...).to_ir()`); verdicts follow llama.cpp's grammar README and parser. Parse
errors are checked for message and for line and column.
"""

import functools

import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata._fsa import compile_byte_dfa
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints._gbnf import parse_gbnf

# From llama.cpp's grammars/README.md and grammar-parser.h.
LIST = 'root ::= ("- " item)+\nitem ::= [^\\n]+ "\\n"\n'
ARITHMETIC_HEADER = """\
root  ::= expr
expr  ::= term ([-+*/] term)*
term  ::= num | "(" space expr ")" space
num   ::= [0-9]+ space
space ::= [ \\t\\n]*
"""
CHESS = """\
# `root` specifies the pattern for the overall output
root ::= (
    # it must start with the characters "1. " followed by a sequence
    # of characters that match the `move` rule, followed by a space, followed
    # by another move, and then a newline
    "1. " move " " move "\\n"

    # it's followed by one or more subsequent moves, numbered with one or two digits
    ([1-9] [0-9]? ". " move " " move "\\n")+
)

# `move` is an abstract representation, which can be a pawn, nonpawn, or castle.
# The `[+#]?` denotes the possibility of checking or mate signs after moves
move ::= (pawn | nonpawn | castle) [+#]?

pawn ::= [a-h] [1-8]
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?
"""

# (grammar, text, accepted)
CASES = [
    # Literals and escapes.
    ('root ::= "abc"', "abc", True),
    ('root ::= "abc"', "ab", False),
    ('root ::= ""', "", True),
    ('root ::= "a\\nb\\tc\\rd"', "a\nb\tc\rd", True),
    ('root ::= "\\"q\\" \\\\"', '"q" \\', True),
    ('root ::= "\\x41\\u00e9\\U0001F600"', "Aé😀", True),
    ('root ::= "\\xff"', "\u00ff", True),  # \xNN is a code point, not a byte.
    ('root ::= "é中😀"', "é中😀", True),
    ('root ::= "[\\[\\]]"', "[[]]", True),
    ('root ::= "a#b" # a comment with "quotes"', "a#b", True),
    # Classes.
    ("root ::= [a-c0-2_]+", "ab0_2c", True),
    ("root ::= [a-c0-2_]+", "d", False),
    ("root ::= [^a-z]", "A", True),
    ("root ::= [^a-z]", "q", False),
    ("root ::= [^a-z]", "中", True),
    ("root ::= [^a-z]", "\n", True),
    ("root ::= [a-]+", "a-a", True),  # A dash before ] is a literal dash.
    ("root ::= [\\]\\[]+", "][", True),
    ('root ::= ["\\\\]+', '"\\', True),
    ("root ::= [\\x00-\\x1F]", "\x1f", True),
    ("root ::= [\\u00e9-\\u00eb]", "ê", True),
    ("root ::= [ぁ-ゟ]+", "ひらがな", True),
    ("root ::= [ぁ-ゟ]+", "カ", False),
    # Any character, newlines included.
    ("root ::= . .", "a\n", True),
    ("root ::= .", "😀", True),
    ("root ::= .", "ab", False),
    # Sequences, alternatives, groups.
    ('root ::= "a" ( "b" | "c" ) "d"', "acd", True),
    ('root ::= "a" ( "b" | "c" ) "d"', "ad", False),
    ('root ::= "x" | "y" | ', "", True),  # An empty alternative.
    ('root ::= | "y"', "y", True),
    # Repetition.
    ('root ::= "a"*', "", True),
    ('root ::= "a"+', "", False),
    ('root ::= "a"?', "a", True),
    ('root ::= "a"{3}', "aaa", True),
    ('root ::= "a"{3}', "aa", False),
    ('root ::= "a"{2,}', "aaaaa", True),
    ('root ::= "a"{2,}', "a", False),
    ('root ::= "a"{1,3}', "aaa", True),
    ('root ::= "a"{1,3}', "aaaa", False),
    ('root ::= "a"{0,2}', "", True),
    ('root ::= "a"{ 1 , 2 }', "aa", True),
    ('root ::= ("ab" "c"?){2}', "abcab", True),
    ('root ::= "a"*?', "aaa", True),  # (a*)?
    ('root ::= "a" * "b"', "aab", True),  # Blanks before an operator.
    # Rule references, dashed names, layout.
    ('root ::= check-mate\ncheck-mate ::= "#"', "#", True),
    ('root ::= a_b\na_b ::= "x"', "x", True),
    ('root ::=\n  "a"\n  # comment\n  | "b"\n\n', "b", True),  # Newline after ::= and |.
    ('root ::= "a" |\n  "b"', "b", True),
    ('root ::= ("a"\n  "b"\n)', "ab", True),  # Newlines inside parentheses.
    ('root ::= "a"\n  | "b"', "b", True),  # Leading `|` continues the rule (extension).
    ('root ::= "a"\r\nother ::= "b"\r\n', "a", True),
    # llama.cpp's own examples.
    (LIST, "- one\n- two\n", True),
    (LIST, "- one\n", True),
    (LIST, "- \n", False),
    (CHESS, "1. e4 e5\n2. Nf3 Nc6\n", True),
    (CHESS, "1. e4 e5\n2. O-O-O Qxd8#\n", True),
    (CHESS, "1. e9 e5\n", False),
]


@functools.cache
def _dfa(text: str, max_depth: int | None = None):
  return compile_byte_dfa(cd.Grammar(text, max_depth=max_depth).to_ir())


@pytest.mark.parametrize("grammar, text, accepted", CASES)
def test_accepts(grammar, text, accepted):
  max_depth = 3 if _grammar.recursive_rules(cd.Grammar(grammar).grammar_ir()) else None
  assert _dfa(grammar, max_depth).accepts(text.encode()) == accepted


def test_arithmetic_from_llama_cpp_header():
  dfa = _dfa(ARITHMETIC_HEADER, 3)
  assert dfa.accepts(b"1+(2 )*3 ")
  assert dfa.accepts(b"(( 1)) ")
  assert not dfa.accepts(b"((( 1))) ")  # Depth 4.
  assert not dfa.accepts(b"1+")


def test_rules_are_kept_as_written():
  g = parse_gbnf('root ::= item ("," item)*\nitem ::= "(" root ")" | [0-9]+\nunused ::= "u"')
  assert g.start == "root"
  assert g.names == ("root", "item", "unused")
  assert _grammar.references(g["root"]) == ("item",)
  assert _grammar.recursive_rules(g) == {"root", "item"}
  assert g["unused"] == ir.Bytes(b"u")


def test_custom_start_rule():
  g = parse_gbnf('expr ::= "x"', start="expr")
  assert g.start == "expr"
  with pytest.raises(errors.GrammarError, match=r"no start rule 'root'.*\['expr'\]"):
    parse_gbnf('expr ::= "x"')


def test_bytes_text_is_rejected():
  with pytest.raises(TypeError, match="GBNF grammar as a str, got bytes|parameter 'text'"):
    parse_gbnf(b'root ::= "a"')


# (grammar, message regex, line, column)
ERRORS = [
    ('root ::= "a" x', r"rule 'x' is referenced but never defined", 1, 14),
    ('root ::= a\na ::= b c\n', r"rule 'b' is referenced .*also undefined: \['c'\]", 2, 7),
    ('root ::= "a"\nroot ::= "b"', r"'root' is defined a second time \(first at line 1\)", 2, 1),
    ("root ::= [a-", r"character class is not closed", 1, 10),
    ('root ::= "abc', r"string literal is not closed", 1, 10),
    ('root ::= "\\q"', r"unknown escape \\q. Expected one of", 1, 11),
    ('root ::= "\\x4"', r"\\x needs 2 hex digits, got '4\"'", 1, 11),
    ('root ::= "\\UFFFFFFFF"', r"beyond U\+10FFFF", 1, 11),
    ('root ::= "\\ud800"', r"U\+D800 is a surrogate", 1, 11),
    ("root ::= [z-a]", r"range U\+007A-U\+0061 is reversed", 1, 12),
    ("root ::= []", r"character class is empty", 1, 10),
    ('root ::= ("a"\n', r"group opened at line 1, column 10 is not closed", 2, 1),
    ('root ::= "a" )', r"unexpected '\)' in rule 'root'", 1, 14),
    ('root ::= * "a"', r"operator '\*' has nothing to repeat", 1, 10),
    ("root := x", r"rule 'root' is followed by ':'. Expected '::='", 1, 6),
    ('root ::= "a"{3,1}', r"repetition \{3,1\} has max < min", 1, 13),
    ('root ::= "a"{,2}', r"repetition count is missing", 1, 14),
    ('root ::= "a"{2', r"repetition is not closed", 1, 15),
    ('root ::= "a"\n"b"', r"A rule name is missing: found '\"'", 2, 1),
    ('root ::= "a"\n  x ::= "b"\n    | "c" )', r"unexpected '\)' in rule 'x'", 3, 11),
    ("root ::= <think>", r"token references .* are not supported", 1, 10),
]


@pytest.mark.parametrize("grammar, match, line, column", ERRORS)
def test_syntax_errors_give_line_and_column(grammar, match, line, column):
  with pytest.raises(errors.GrammarSyntaxError, match=match) as info:
    parse_gbnf(grammar)
  assert (info.value.line, info.value.column) == (line, column)
  assert f"at line {line}, column {column}:" in str(info.value)


def test_unsupported_syntax_is_an_unsupported_feature_error():
  with pytest.raises(errors.UnsupportedFeatureError):
    parse_gbnf("root ::= <[1000]>")

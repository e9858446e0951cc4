"""Go-style automatic semicolons as lexer modes (`_lexer.with_semicolon_modes`).

A toy grammar with Go's lexical rules (statements separated by `;`, blocks, calls) and
the `Semicolons` option: the mode-A/B lexer against a hand-written scanner that inserts
`;` as Go's does, and the compiled tables on a few texts whose verdict Go's rules fix.
"""

import random

import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import errors
from constrained_decoding.automata import _lexer
from constrained_decoding.constraints import _lexed_grammar

TOY = r"""
start: stmt_list
stmt_list: [stmt] | stmt_list ";" [stmt]
stmt: NAME | NAME "(" [NAME ("," NAME)*] ")" | "return" | "{" stmt_list "}" | NAME INC
NAME: /[a-z]+/
INC: "++"
_WS: /[ \t\r]+/
_NEWLINE: /\n/
_LINE_COMMENT: /\/\/[^\n]*/
_COMMENT: /\/\*([^*\n]|\*+[^*\/\n])*\*+\//
_ML_COMMENT: /\/\*([^*]|\*+[^*\/])*\*+\//
%ignore _WS
%ignore _NEWLINE
%ignore _LINE_COMMENT
%ignore _COMMENT
%ignore _ML_COMMENT
"""
TRIGGERS = ("NAME", "RETURN", "RPAR", "RBRACE", "INC")
SEMIS = _lexed_grammar.Semicolons(triggers=TRIGGERS)


@pytest.fixture(scope="module")
def reference():
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  arrays = _lexed_grammar.compile_lexed_grammar(TOY, vocab, semicolons=SEMIS)
  return _lexed_grammar.LexedReference(arrays)


def _accepts(reference, text: str) -> bool:
  row = reference.step(reference.start(), text.encode())
  return row is not None and reference.end_ok(row)


def _go_scan(text: str) -> list[str] | None:
  """Go's scanner on the toy's lexemes: the items, with `;` inserted after a trigger
  at a line break, a comment holding one, or the end (the oracle of the lexer)."""
  out, i, after_trigger = [], 0, False
  while i < len(text):
    ch = text[i]
    if ch == "\n":
      if after_trigger:
        out.append("SEMICOLON")
      after_trigger, i = False, i + 1
    elif ch in " \t\r":
      i += 1
    elif text.startswith("//", i):
      j = text.find("\n", i)
      i = len(text) if j < 0 else j
    elif text.startswith("/*", i):
      j = text.find("*/", i + 2)
      if j < 0:
        return None
      if "\n" in text[i:j] and after_trigger:
        out.append("SEMICOLON")
        after_trigger = False
      i = j + 2
    elif ch.isalpha():
      j = i
      while j < len(text) and text[j].isalpha():
        j += 1
      word = text[i:j]
      out.append("RETURN" if word == "return" else "NAME")
      after_trigger, i = True, j
    elif text.startswith("++", i):
      out.append("INC")
      after_trigger, i = True, i + 2
    elif ch in "(){},;":
      name = {"(": "LPAR", ")": "RPAR", "{": "LBRACE", "}": "RBRACE", ",": "COMMA",
              ";": "SEMICOLON"}[ch]
      out.append(name)
      after_trigger, i = name in TRIGGERS, i + 1
    else:
      return None
  if after_trigger:
    out.append("SEMICOLON")
  return out


def _mode_lex(lexer: _lexer.LexerDfa, text: str) -> list[str] | None:
  """`_lexer.lex` and the end-of-text `;` that mode A owes (as the compiler adds it)."""
  items = _lexer.lex(lexer, text.encode())
  if items is None:
    return None
  state = lexer.start
  for b in text.encode():  # Replays the walk to know the mode at the end.
    nxt = lexer.transitions[state, b]
    state = int(lexer.transitions[lexer.restart_states[state], b] if nxt < 0 else nxt)
  if lexer.restart_states[state] != lexer.start:
    items.append("SEMICOLON")
  return items


def test_mode_lexer_inserts_semicolons_as_go_does(reference):
  lexer = reference.lexer
  pieces = ["a", "b", "return", "++", "(", ")", "{", "}", ",", ";", " ", "\n", "\n\n",
            "// c", "/* c */", "/* c\n */", "\t"]
  rng = random.Random(0)
  texts = ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
           for _ in range(400)]
  for text in texts:
    assert _mode_lex(lexer, text) == _go_scan(text), repr(text)


@pytest.mark.parametrize("text, want", [
    ("a\nb", True), ("a b", False), ("a\n\nb\n", True), ("a // c\nb", True),
    ("a /* c */ b", False), ("a /* c\n */ b", True), ("f(a,\nb)", True),
    ("f(a\n)", False), ("{\na\n}\n", True), ("{ a }", True), ("a // c", True),
    ("{}\nx", True), ("{} x", False), ("return\n", True), ("a;", True), ("{;;}", True),
    ("a++\nb", True), ("a\n++", False), ("f(a // c\n)", False), ("f(\n)", True),
])
def test_toy_texts(reference, text, want):
  assert _accepts(reference, text) == want


def test_only_states_before_an_ignored_lexeme_are_doubled(reference):
  lexer = reference.lexer
  plain = _lexer.build_lexer_dfa(_lexer.terminals_from_grammar(reference.arrays.grammar)[0],
                                 ignored=reference.arrays.grammar.ignored,
                                 keyword_beats=("NAME",))
  assert plain.num_states < lexer.num_states < 2 * plain.num_states
  np.testing.assert_array_equal(lexer.transitions[:plain.num_states], plain.transitions)
  assert lexer.is_start.sum() == 2


def test_semicolon_option_errors():
  vocab = cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                         eos_ids=[256])
  with pytest.raises(errors.UnsupportedGrammarFeatureError, match=r"\['RSQB'\] of Semicolons"):
    _lexed_grammar.compile_lexed_grammar(
        TOY, vocab, semicolons=_lexed_grammar.Semicolons(triggers=TRIGGERS + ("RSQB",)))
  with pytest.raises(errors.UnsupportedGrammarFeatureError, match="does not %ignore"):
    _lexed_grammar.compile_lexed_grammar(
        TOY, vocab, semicolons=_lexed_grammar.Semicolons(triggers=TRIGGERS,
                                                         newlines=("_NEWLINE", "INC")))
  with pytest.raises(errors.ConstraintError, match="both indentation and semicolons"):
    _lexed_grammar.compile_lexed_grammar(TOY, vocab, semicolons=SEMIS,
                                         indentation=_lexed_grammar.Indentation())
  one_name = _lexed_grammar.Semicolons()
  object.__setattr__(one_name, "triggers", "NAME")  # (the tests' type checker refuses it)
  with pytest.raises(errors.ConstraintError, match="Semicolons.triggers 'NAME' is not"):
    _lexed_grammar.compile_lexed_grammar(TOY, vocab, semicolons=one_name)
  no_semi = TOY.replace('stmt_list ";" [stmt]', 'stmt_list "," [stmt]')
  with pytest.raises(errors.UnsupportedGrammarFeatureError, match=r"\['SEMICOLON'\]"):
    _lexed_grammar.compile_lexed_grammar(no_semi, vocab, semicolons=SEMIS)

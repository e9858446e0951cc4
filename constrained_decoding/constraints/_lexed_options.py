"""Lexer options of grammars with a lexer: Python's indentation, Go's semicolons.

Options of `compile_lexed_grammar` (`constraints/_lexed_grammar.py`) and of the
`Grammar` spec (`lexer=True`): frozen, hashable values, so that a spec holding them
stays a cache key.

Public:
  Indentation   INDENT/DEDENT options (Lark's PythonIndenter).
  Semicolons    Go's automatic semicolon insertion.
"""

import dataclasses

from constrained_decoding import errors
from constrained_decoding.constraints import _lr


@dataclasses.dataclass(frozen=True, kw_only=True)
class Indentation:
  """Python-style indentation, as Lark's `PythonIndenter` post-lexer makes it.

  ```python
  arrays = compile_lexed_grammar(python_text, vocab, start="file_input",
                                 indentation=Indentation(max_depth=16))
  ```

  The newline lexeme is built here, not from the grammar's definition of `newline`:
  one or more line breaks (`\r?\n`), each line's blanks and comments, then the next
  line's indentation of spaces. Its width w is part of the lexeme's class (one class per
  w in [0, max_width]), so the lexer-state x token table knows it. On the device, at
  bracket depth 0 the lexeme feeds `newline`, then `indent` when w is above the top of
  the row's indentation stack (pushed), nothing when equal, and one `dedent` per
  popped width until it is equal (else an error: "unindent does not match"); inside
  brackets (`open` / `close` terminals) it feeds nothing. Blank and comment-only lines
  are part of the lexeme, so they never reach the parser. The text starts at a line
  start (an initial newline lexeme, hence `newline` first: the grammar must allow it)
  and its end adds a `newline` where the parser takes one, then dedents to width 0.
  A tab in the indentation, or indentation past `max_width`, is refused outside
  brackets (CPython's tab rules are not modelled); an indentation past `max_depth`
  levels is masked (the row's stack is full), and the mask never leaves a row without
  a token: a block opener (`:` then a newline) is refused when no level is left.

  Attributes:
    newline, indent, dedent: Terminal names of the grammar (`%declare` the last two).
    open, close: Terminal names of the brackets that suppress newlines.
    max_depth: Capacity of the indentation stack, levels including width 0.
    max_width: Widest indentation, in columns.
  """
  newline: str = "_NEWLINE"
  indent: str = "_INDENT"
  dedent: str = "_DEDENT"
  open: tuple[str, ...] = ("LPAR", "LSQB", "LBRACE")
  close: tuple[str, ...] = ("RPAR", "RSQB", "RBRACE")
  max_depth: int = 16
  max_width: int = 64

  def check(self) -> None:
    for name in ("max_depth", "max_width"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise errors.ConstraintError(
            f"Indentation.{name} {value!r} is not an int >= 2. Expected a capacity, e.g."
            f" {Indentation.__dataclass_fields__[name].default}.")

  def newline_terminals(self) -> list:
    """The newline lexemes: `(name@w, regex)` per width, and `name@x` (refused)."""
    comment = r"#[^\r\n\x00]*"
    lines = rf"({comment})?(\r?\n[ \t]*({comment})?)*\r?\n"
    out = [(f"{self.newline}@{w}", lines + (f" {{{w}}}" if w else ""))
           for w in range(self.max_width + 1)]
    out.append((f"{self.newline}@x", lines + rf"([ \t]*\t[ \t]*| {{{self.max_width + 1},}}"
                                              rf"[ \t]*|[ \t]*{comment})"))
    return out


# Go's semicolon triggers (the spec's "Semicolons"), as `grammars/go.lark` names them.
_GO_TRIGGERS = ("NAME", "INT", "FLOAT", "IMAG", "RUNE", "STRING", "RAW_STRING",
                "IMPORT_PATH", "BREAK", "CONTINUE", "FALLTHROUGH", "RETURN", "INC", "DEC",
                "RPAR", "RSQB", "RBRACE")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Semicolons:
  """Go's automatic semicolon insertion, as lexer modes.

  ```python
  arrays = compile_lexed_grammar(go_text, vocab, start="source_file",
                                 semicolons=Semicolons())
  ```

  After a lexeme of a `triggers` terminal (mode A), a lexeme of a `newlines` terminal
  (`%ignore`d ones that act as a line break: the newline itself, a line comment, a
  general comment holding a line break) feeds `semicolon` to the parser; anywhere else
  (mode B) they are ignored; other ignored lexemes (blanks, one-line general comments)
  keep the mode. The end of the text feeds `semicolon` in mode A too, as Go's scanner
  does at EOF. The grammar's rules then take `;` where Go's do (explicit or inserted:
  they are the same terminal). The defaults are `grammars/go.lark`'s names.

  Attributes:
    semicolon: The terminal of the `";"` literal.
    triggers: Terminals after which a line break is a semicolon.
    newlines: Ignored terminals that act as a line break.
  """
  semicolon: str = "SEMICOLON"
  triggers: tuple[str, ...] = _GO_TRIGGERS
  newlines: tuple[str, ...] = ("_NEWLINE", "_LINE_COMMENT", "_ML_COMMENT")

  def check(self, grammar: _lr.TerminalGrammar) -> None:
    """Raises ConstraintError for a malformed option, UnsupportedGrammarFeatureError if
    the grammar lacks a named terminal or does not ignore a newline terminal."""
    for field in ("triggers", "newlines"):
      value = getattr(self, field)
      if isinstance(value, str) or not all(isinstance(n, str) for n in value):
        raise errors.ConstraintError(
            f"Semicolons.{field} {value!r} is not a sequence of terminal names. Expected"
            f" e.g. {Semicolons.__dataclass_fields__[field].default[:3]}.")
    if not isinstance(self.semicolon, str):
      raise errors.ConstraintError(f"Semicolons.semicolon {self.semicolon!r} is not a"
                                   " terminal name. Expected e.g. 'SEMICOLON'.")
    defined = {d.name for d in grammar.terminal_defs if d.pattern is not None}
    for field, names in (("semicolon", (self.semicolon,)), ("triggers", self.triggers),
                         ("newlines", self.newlines)):
      absent = sorted(set(names) - defined)
      if absent:
        raise errors.UnsupportedGrammarFeatureError(
            f"Lark grammar does not define the terminals {absent} of Semicolons.{field}."
            " Expected terminals with a pattern (the newlines %ignore'd). Define them, or"
            " name yours in Semicolons(...).")
    not_ignored = sorted(set(self.newlines) - set(grammar.ignored))
    if not_ignored:
      raise errors.UnsupportedGrammarFeatureError(
          f"Lark grammar does not %ignore the terminals {not_ignored} of"
          " Semicolons.newlines. Expected the line breaks and comments %ignore'd (mode B"
          " skips them). Add `%ignore` lines.")

"""Lark front end: a subset of Lark's grammar language -> `GrammarIR`.

Public functions:
  parse_lark(text, *, start="start")  the grammar as written, terminals lowered to IR.

Supported (Lark's syntax, https://lark-parser.readthedocs.io/en/latest/grammar.html):

* Rules `name: expansion | expansion ...`, with the tree-shaping modifiers `?name` and
  `!name` (accepted; they do not change the language) and aliases `-> name` (ignored).
  A rule continues on the next line when that line starts with `|`; newlines are also
  allowed inside `( )` and `[ ]`, and after a trailing backslash.
* Terminals `NAME: ...`, built from string literals `"..."` (Python escapes, as Lark's
  `eval_escaping`; `"..."i` is case-insensitive, as Python's `re.IGNORECASE`), regular
  expressions `/.../flags` (Python `re` with Unicode semantics, as Lark uses; flags
  `i m s x u`), ranges `"a".."z"`, other terminals, and the operators below. Terminals
  must not refer to rules or (transitively) to themselves.
* In rules and terminals: sequences, `|`, groups `( )`, optional `[ ]`, postfix `? * +`,
  and `~ n` / `~ n..m` repetition; in rules, also anonymous literals and regexes.
* `%ignore TERM` / `%ignore "literal"` / `%ignore /regex/` (several are united).
* `%import common.NAME`, `%import common.NAME -> ALIAS` and `%import common (A, B)` for
  Lark's `common` terminals, defined here: DIGIT HEXDIGIT INT SIGNED_INT DECIMAL FLOAT
  SIGNED_FLOAT NUMBER SIGNED_NUMBER ESCAPED_STRING LCASE_LETTER UCASE_LETTER LETTER
  WORD CNAME WS_INLINE WS CR LF NEWLINE SH_COMMENT CPP_COMMENT C_COMMENT SQL_COMMENT.
* Comments `// ...` and `# ...`.

Not supported, each raising `UnsupportedGrammarFeatureError` with line and column:
templates (`_sep{x, s}: ...` and their uses), priorities (`rule.2:`, `TERM.2:`),
`%declare`, `%override`, `%extend`, imports other than `common`, and the `l` flag.

Semantics. The language is that of the grammar over characters, where each terminal
stands for the strings its pattern fully matches (a union of languages). Lark's lexers
add conditions on top (longest match, priorities, contextual lexing); this union
approximates them by a superset. `%ignore`: with I the union of the ignored patterns,
`I*` (optional, repeatable) is allowed between any two consecutive symbols of every
rule expansion, between the copies of a repeated item, and before and after the whole
text; never inside a terminal. So ignored text may occur exactly between any two
terminals of a derivation, as with Lark's lexer. (A repeat inside a sequence takes the
`I*` before each copy, `s1 (I* x)*`, so that x is not copied; no rule body starts or
ends with `I*`, and a wrapper start rule `start'` carries the outer ones when the start
rule is itself referenced.)

Two consequences of the union to keep in mind when writing grammars:
* Optional ignored text lets word-like tokens touch: with `%ignore WS`, `"SELECT"i NAME`
  also matches "SELECTx", which Lark's lexer would read as one NAME. Write a required
  separator where words meet (`_S: /[ \\t\\f\\r\\n]+/`, as `grammars/sql_select.lark`
  does); this also keeps the automata small, since otherwise every keyword must be
  looked for inside every name.
* An ignored pattern that may stop anywhere, such as Lark's `SQL_COMMENT` (`--[^\\n]*`),
  lets the next token start inside it; end it with a delimiter (`/--[^\\n]*\\n/`).
"""

import dataclasses
import re

from constrained_decoding import errors
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _regex

# Lark's own `common.lark` terminals, restated in the subset. ESCAPED_STRING is the
# language of Lark's lazy lookbehind pattern, written without lookbehind.
_COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+"|"-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e"|"E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+"|"-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+"|"-"] NUMBER
ESCAPED_STRING: "\"" /([^"\\\n]|\\.)*/ "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_"|LETTER) ("_"|LETTER|DIGIT)*
WS_INLINE: (" "|/\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: /\/\*([^*]|\*+[^*\/])*\*+\//
SQL_COMMENT: /--[^\n]*/
"""

_TOKEN_SPEC = [
    ("NL_OR", r"(?:\r?\n[ \t]*(?:(?://|#)[^\n]*)?)+\|"),
    ("NL", r"(?:\r?\n)+"),
    ("SKIP", r"[ \t]+|//[^\n]*|#[^\n]*|\\[ \t]*\r?\n"),
    ("DIRECTIVE", r"%[a-z_]+"),
    ("STRING", r'"(?:\\"|\\\\|[^"\n])*?"i?'),
    ("REGEXP", r"/(?!/)(?:\\/|\\\\|[^/\n])*?/[a-z]*"),
    ("ARROW", r"->"),
    ("DOTDOT", r"\.\."),
    ("MODIFIER", r"(?:!|![?]|[?]!?)(?=[_a-z])"),
    ("OP", r"[+*?]"),
    ("RULE", r"_?[a-z][_a-z0-9]*"),
    ("TERMINAL", r"_?[A-Z][_A-Z0-9]*"),
    ("NUMBER", r"[+-]?\d+"),
    ("PUNCT", r"[()\[\]{}:,|.~]"),
]
_TOKEN_RE = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _TOKEN_SPEC))
_REGEX_FLAGS = {"i": "i", "m": "m", "s": "s", "x": "x", "u": ""}
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


@dataclasses.dataclass(frozen=True)
class _Token:
  kind: str
  text: str
  offset: int


# The parsed expansions, before lowering (which differs for rules and terminals).
@dataclasses.dataclass(frozen=True)
class _Seq:
  items: tuple


@dataclasses.dataclass(frozen=True)
class _Alt:
  alternatives: tuple


@dataclasses.dataclass(frozen=True)
class _Rep:
  item: object
  min: int
  max: int | None


@dataclasses.dataclass(frozen=True)
class _Lit:
  node: ir.Node


@dataclasses.dataclass(frozen=True)
class _Ref:
  name: str
  offset: int

  @property
  def is_terminal(self) -> bool:
    return self.name.lstrip("_")[:1].isupper()


def parse_lark(text: str, *, start: str = "start") -> _grammar.GrammarIR:
  """Parses a grammar in the Lark subset (module docstring) into a `GrammarIR`.

  ```python
  g = parse_lark('''
      start: "(" start ")" | NAME
      %import common.CNAME -> NAME
      %ignore " "
  ''')
  ```

  Args:
    text: The grammar source.
    start: The start rule.

  Returns:
    The grammar with one IR rule per Lark rule (terminals inlined as IR, `%ignore`
    applied); when `%ignore` is used and the start rule is referenced by rules, a
    wrapper start rule named `start'` holds the leading and trailing ignored text.

  Raises:
    TypeError: `text` is not a str.
    GrammarSyntaxError: The grammar does not parse, defines a name twice, or
      references an undefined name (with line and column).
    UnsupportedGrammarFeatureError: The grammar uses syntax outside the subset.
    GrammarError: The start rule is not defined.
  """
  if not isinstance(text, str):
    raise TypeError(
        f"Expected the Lark grammar as a str, got {type(text).__name__} instead. Decode"
        " bytes first, e.g. text.decode('utf-8')."
    )
  return _Parser(text).parse(start)


class _Parser:
  """Tokenizes with Lark's own token patterns, then parses by recursive descent."""

  def __init__(self, text: str, *, dialect: str = "Lark grammar"):
    self.text = text
    self.dialect = dialect
    self.source = _grammar.SourceText(text)
    self.tokens = self.tokenize()
    self.index = 0
    self.nesting = 0  # Inside ( ) or [ ], newlines are skipped.
    self.rules: dict[str, tuple[object, int]] = {}  # name -> (expansions, offset)
    self.terminals: dict[str, tuple[object, int]] = {}
    self.imported: dict[str, tuple[ir.Node, int]] = {}
    self.ignored: list[tuple[object, int]] = []

  # -- Errors and tokens. ----------------------------------------------------------------

  def error(self, offset: int, problem: str, expected: str, fix: str,
            cls=errors.GrammarSyntaxError) -> errors.GrammarError:
    line, column = self.source.position(offset)
    return cls(
        f"{self.dialect} at line {line}, column {column}: {problem}. Expected {expected}."
        f" {fix}{self.source.excerpt(offset)}",
        line=line, column=column,
    )

  def unsupported(self, offset: int, what: str, fix: str) -> errors.GrammarError:
    return self.error(offset, f"{what} is not supported", "the Lark subset documented in"
                      " constraints/_lark.py", fix, cls=errors.UnsupportedGrammarFeatureError)

  def tokenize(self) -> list[_Token]:
    tokens = []
    pos = 0
    while pos < len(self.text):
      match = _TOKEN_RE.match(self.text, pos)
      if match is None:
        raise self.error(
            pos, f"unexpected character {self.text[pos]!r}",
            "a rule, terminal, literal, regex, operator or directive",
            "Remove the character or quote it in a string literal.",
        )
      if match.lastgroup != "SKIP":
        tokens.append(_Token(match.lastgroup, match.group(), pos))
      pos = match.end()
    tokens.append(_Token("EOF", "", len(self.text)))
    return tokens

  def peek(self) -> _Token:
    while self.nesting and self.tokens[self.index].kind == "NL":
      self.index += 1
    return self.tokens[self.index]

  def next(self) -> _Token:
    token = self.peek()
    if token.kind != "EOF":
      self.index += 1
    return token

  def at(self, kind: str, text: str | None = None) -> bool:
    token = self.peek()
    return token.kind == kind and (text is None or token.text == text)

  @staticmethod
  def describe(token: _Token) -> str:
    if token.kind in ("NL", "NL_OR"):
      return "the end of the line"
    return "the end of the grammar" if token.kind == "EOF" else repr(token.text)

  def expect(self, kind: str, text: str | None, expected: str, fix: str) -> _Token:
    token = self.peek()
    if not self.at(kind, text):
      raise self.error(token.offset, f"found {self.describe(token)}", expected, fix)
    return self.next()

  def end_of_statement(self, what: str) -> None:
    token = self.peek()
    if token.kind not in ("NL", "EOF"):
      raise self.error(
          token.offset, f"unexpected {token.text!r} in {what}",
          "a symbol, an operator (? * + ~), '|', '->', or the end of the line",
          "Check for an unbalanced ')' or ']' or a stray character.",
      )
    self.next()

  # -- Statements. -----------------------------------------------------------------------

  def parse(self, start: str) -> _grammar.GrammarIR:
    self.parse_statements()
    return self.build(start)

  def parse_statements(self) -> None:
    while True:
      token = self.peek()
      if token.kind == "EOF":
        return
      if token.kind == "NL":
        self.next()
      elif token.kind == "DIRECTIVE":
        self.parse_directive()
      elif token.kind in ("RULE", "MODIFIER"):
        self.parse_definition(self.rules, rule=True)
      elif token.kind == "TERMINAL":
        self.parse_definition(self.terminals, rule=False)
      else:
        raise self.error(
            token.offset, f"a definition cannot start with {token.text!r}",
            "`rule: ...`, `TERMINAL: ...` or a %directive",
            "Continue a rule on the next line only with a leading '|'.",
        )

  def parse_definition(self, table: dict, *, rule: bool) -> None:
    if rule and self.at("MODIFIER"):
      self.next()  # `?` and `!` only shape Lark's parse tree.
    name_token = self.next()
    if not rule and name_token.kind != "TERMINAL" or rule and name_token.kind != "RULE":
      raise self.error(name_token.offset, f"found {name_token.text!r}", "a rule name",
                       "Rule names are lowercase, terminal names uppercase.")
    name = name_token.text
    if self.at("PUNCT", "{"):
      raise self.unsupported(self.peek().offset, f"the template {name}{{...}}",
                             "Write out one rule per instantiation.")
    if self.at("PUNCT", "."):
      raise self.unsupported(self.peek().offset, f"the priority of {name!r}",
                             "Remove the priority; the language is the same without it.")
    self.expect("PUNCT", ":", f"':' after {name!r}", f"Write `{name}: ...`.")
    if name in self.rules or name in self.terminals or name in self.imported:
      raise self.error(name_token.offset, f"{name!r} is defined a second time",
                       "each name defined once", "Merge the definitions with '|'.")
    table[name] = (self.parse_expansions(), name_token.offset)
    self.end_of_statement(f"the definition of {name!r}")

  def parse_directive(self) -> None:
    token = self.next()
    if token.text == "%ignore":
      self.ignored.append((self.parse_expansions(), token.offset))
      self.end_of_statement("%ignore")
    elif token.text == "%import":
      self.parse_import(token)
    elif token.text in ("%declare", "%override", "%extend"):
      raise self.unsupported(token.offset, f"the directive {token.text}",
                             "Define the rules and terminals in this grammar instead.")
    else:
      raise self.error(token.offset, f"unknown directive {token.text!r}",
                       "%ignore or %import", "Fix the directive's name.")

  def parse_import(self, token: _Token) -> None:
    module = self.next()
    if module.kind != "RULE" or module.text != "common":
      raise self.unsupported(
          module.offset, f"importing from {module.text!r}",
          "Only `%import common.NAME` is available; define other terminals here.")
    if self.at("PUNCT", "("):
      self.next()
      names = [self.next()]
      while self.at("PUNCT", ","):
        self.next()
        names.append(self.next())
      self.expect("PUNCT", ")", "')' closing the import list", "Close the list with ')'.")
      pairs = [(n, n.text) for n in names]
    else:
      self.expect("PUNCT", ".", "'.' and a name after common",
                  "Write `%import common.NAME`.")
      name = self.next()
      alias = name.text
      if self.at("ARROW"):
        self.next()
        alias = self.next().text
      pairs = [(name, alias)]
    for name, alias in pairs:
      self.import_common(name, alias)
    self.end_of_statement(token.text)

  def import_common(self, name: _Token, alias: str) -> None:
    table = _common_terminals()
    if name.text not in table:
      raise self.error(
          name.offset, f"common.{name.text} is not available",
          f"one of {sorted(n for n in table if not n.startswith('_'))}",
          "Define the terminal in this grammar instead.",
      )
    if not alias.lstrip("_")[:1].isupper():
      raise self.error(name.offset, f"the terminal common.{name.text} is imported as"
                       f" {alias!r}", "an uppercase terminal name",
                       f"Import it as {alias.upper()!r}.")
    if alias in self.rules or alias in self.terminals or alias in self.imported:
      raise self.error(name.offset, f"{alias!r} is defined a second time",
                       "each name defined once", "Import it under another name with ->.")
    self.imported[alias] = (table[name.text], name.offset)

  # -- Expansions. -----------------------------------------------------------------------

  def parse_expansions(self):
    alternatives = [self.parse_alias()]
    while self.at("PUNCT", "|") or self.at("NL_OR"):
      self.next()
      alternatives.append(self.parse_alias())
    return alternatives[0] if len(alternatives) == 1 else _Alt(tuple(alternatives))

  def parse_alias(self):
    expansion = self.parse_expansion()
    if self.at("ARROW"):
      self.next()
      self.expect("RULE", None, "an alias name after '->'", "Write `-> alias_name`.")
    return expansion

  def parse_expansion(self):
    items = []
    while True:
      token = self.peek()
      if token.kind in ("STRING", "REGEXP", "RULE", "TERMINAL") or (
          token.kind == "PUNCT" and token.text in "(["):
        items.append(self.parse_expr())
      else:
        return items[0] if len(items) == 1 else _Seq(tuple(items))

  def parse_expr(self):
    item = self.parse_atom()
    while True:
      if self.at("OP"):
        op = self.next().text
        item = _Rep(item, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[op])
      elif self.at("PUNCT", "~"):
        self.next()
        low = self.parse_count()
        high = low
        if self.at("DOTDOT"):
          self.next()
          high = self.parse_count()
        if high < low:
          raise self.error(self.tokens[self.index - 1].offset,
                           f"the repetition ~ {low}..{high} has max < min",
                           "min <= max", "Swap the bounds.")
        item = _Rep(item, low, high)
      else:
        return item

  def parse_count(self) -> int:
    token = self.expect("NUMBER", None, "a repetition count after '~'", "Write `x ~ 3` or"
                        " `x ~ 2..5`.")
    if token.text.startswith(("+", "-")):
      raise self.error(token.offset, f"the count {token.text} is signed",
                       "a non-negative integer", "Remove the sign.")
    return int(token.text)

  def parse_atom(self):
    token = self.next()
    if token.kind == "PUNCT" and token.text in "([":
      closing = ")" if token.text == "(" else "]"
      self.nesting += 1  # Newlines inside brackets are skipped.
      inner = self.parse_expansions()
      found = self.peek()
      self.nesting -= 1
      if not (found.kind == "PUNCT" and found.text == closing):
        line, column = self.source.position(token.offset)
        raise self.error(found.offset, f"the group opened at line {line}, column {column}"
                         f" is not closed: found {self.describe(found)}", repr(closing),
                         f"Close the group with {closing!r}.")
      self.index += 1
      return inner if closing == ")" else _Rep(inner, 0, 1)
    if token.kind == "STRING":
      if self.at("DOTDOT"):
        self.next()
        end = self.expect("STRING", None, "a string after '..'", 'Write "a".."z".')
        return _Lit(self.lower_range(token, end))
      return _Lit(self.lower_string(token))
    if token.kind == "REGEXP":
      return _Lit(self.lower_regexp(token))
    if token.kind in ("RULE", "TERMINAL"):
      if self.at("PUNCT", "{"):
        raise self.unsupported(token.offset, f"the template use {token.text}{{...}}",
                               "Write out the instantiated rule.")
      return _Ref(token.text, token.offset)
    raise self.error(token.offset, f"found {self.describe(token)}",
                     "a symbol, literal, regex or group", "Complete the expansion.")

  # -- Literals. -------------------------------------------------------------------------

  def decode_string(self, token: _Token) -> tuple[str, bool]:
    """The characters of a string literal (Lark's `eval_escaping`) and its `i` flag."""
    body, insensitive = token.text, token.text.endswith("i")
    body = body[1:-2] if insensitive else body[1:-1]
    out, i = [], 0
    while i < len(body):
      char = body[i]
      if char != "\\" or i + 1 == len(body):
        out.append(char)
        i += 1
        continue
      kind = body[i + 1]
      if kind in _STRING_ESCAPES:
        out.append(_STRING_ESCAPES[kind])
        i += 2
      elif kind in _HEX_ESCAPES:
        size = _HEX_ESCAPES[kind]
        digits = body[i + 2:i + 2 + size]
        if len(digits) != size or any(c not in "0123456789abcdefABCDEF" for c in digits):
          raise self.error(token.offset + 1 + i, f"the escape \\{kind} needs {size} hex"
                           f" digits, got {digits!r}", f"exactly {size} hex digits",
                           "Pad the code point with zeros.")
        out.append(chr(int(digits, 16)))
        i += 2 + size
      elif kind in '\\"':
        out.append(kind)
        i += 2
      else:  # Lark keeps unknown escapes as written: "\d" is a backslash and a d.
        out.append("\\" + kind)
        i += 2
    return "".join(out), insensitive

  def lower_string(self, token: _Token) -> ir.Node:
    text, insensitive = self.decode_string(token)
    if insensitive:
      return _regex.parse_regex(f"(?i:{re.escape(text)})", unicode=True)
    try:
      return ir.Bytes(text.encode("utf-8"))
    except UnicodeEncodeError as e:
      raise self.error(token.offset, f"the literal {token.text} contains a surrogate",
                       "Unicode scalar values", "Write the characters themselves.") from e

  def lower_range(self, first: _Token, last: _Token) -> ir.Node:
    (low, _), (high, _) = self.decode_string(first), self.decode_string(last)
    if len(low) != 1 or len(high) != 1:
      raise self.error(first.offset, f"the range {first.text}..{last.text} has an end that"
                       " is not one character", 'single characters, as "a".."z"',
                       "Use a regex for longer alternatives.")
    if ord(high) < ord(low):
      raise self.error(first.offset, f"the range {first.text}..{last.text} is reversed",
                       "low <= high", "Swap the ends.")
    node = ir.char_class(((ord(low), ord(high)),))
    return node if node.ranges else ir.NOTHING

  def lower_regexp(self, token: _Token) -> ir.Node:
    end = token.text.rindex("/")
    pattern, flags = token.text[1:end].replace("\\/", "/"), token.text[end + 1:]
    inline = ""
    for flag in flags:
      if flag not in _REGEX_FLAGS:
        raise self.unsupported(token.offset, f"the regex flag {flag!r}",
                               f"Use only the flags {''.join(_REGEX_FLAGS)}.")
      inline += _REGEX_FLAGS[flag]
    if inline:
      pattern = f"(?{inline}){pattern}"
    try:
      return _regex.parse_regex(pattern, unicode=True)
    except errors.UnsupportedRegexError as e:
      raise self.error(token.offset, f"the regex {token.text} uses an unsupported construct"
                       f" ({e})", "a regular pattern", "Rewrite the regex.",
                       cls=errors.UnsupportedGrammarFeatureError) from e
    except errors.RegexSyntaxError as e:
      raise self.error(token.offset, f"the regex {token.text} does not parse ({e})",
                       "Python `re` syntax", "Fix the regex.") from e

  # -- Lowering. -------------------------------------------------------------------------

  def build(self, start: str) -> _grammar.GrammarIR:
    terminal_nodes: dict[str, ir.Node] = {n: node for n, (node, _) in self.imported.items()}
    for name in self.terminals:
      self.resolve_terminal(name, terminal_nodes, ())
    ignored = None
    if self.ignored:
      ignored = _grammar.repeat(ir.union(*(
          self.lower(node, terminal_nodes, None, in_terminal=True)
          for node, _ in self.ignored)), 0, None)
    rules = {name: self.lower(node, terminal_nodes, ignored, in_terminal=False)
             for name, (node, _) in self.rules.items()}
    if start not in rules:
      raise errors.GrammarError(
          f"{self.dialect} has no start rule {start!r}. Expected a rule `{start}: ...`"
          f" among {_grammar._preview(rules)}. Define it, or pass the start rule's name as"
          " `start`."
      )
    if ignored is not None:
      start = self.wrap_start(rules, start, ignored)
    return _grammar.GrammarIR(start, tuple(rules.items()))

  def wrap_start(self, rules: dict, start: str, ignored: ir.Node) -> str:
    """Allows ignored text around the whole input; returns the (new) start rule."""
    body = _grammar.concat(ignored, ir.RuleRef(start), ignored)
    if not any(start in _grammar.references(b) for b in rules.values()):
      rules[start] = _grammar.concat(ignored, rules[start], ignored)
      return start
    wrapper = f"{start}'"  # Not a Lark name, so it cannot collide.
    rules[wrapper] = body
    return wrapper

  def resolve_terminal(self, name: str, done: dict, active: tuple) -> ir.Node:
    if name in done:
      return done[name]
    node, offset = self.terminals[name]
    if name in active:
      cycle = " -> ".join((*active[active.index(name):], name))
      raise self.error(offset, f"terminal {name!r} refers to itself ({cycle})",
                       "terminals built from literals, regexes and other terminals",
                       "Make it a rule (lowercase name) to allow recursion.")
    done[name] = self.lower_terminal(node, done, (*active, name))
    return done[name]

  def lower_terminal(self, node, done, active) -> ir.Node:
    return self.lower(node, done, None, in_terminal=True, active=active)

  def lower(self, node, terminals, ignored, *, in_terminal: bool, active=()) -> ir.Node:
    """IR of an expansion; `I*` (`ignored`) between symbols, when not None."""
    if isinstance(node, _Lit):
      return node.node
    if isinstance(node, _Ref):
      return self.lower_ref(node, terminals, in_terminal, active)
    lower = lambda n: self.lower(n, terminals, ignored, in_terminal=in_terminal, active=active)
    if isinstance(node, _Alt):
      return ir.union(*(lower(a) for a in node.alternatives))
    if isinstance(node, _Seq):
      if ignored is None:
        return _grammar.concat(*(lower(item) for item in node.items))
      return self.lower_sequence(node.items, lower, ignored)
    if isinstance(node, _Rep):
      item = lower(node.item)
      if ignored is None or node.max in (0, 1):
        return _grammar.repeat(item, node.min, node.max)
      # x{m,n} with I* between copies: x (I* x){m-1,n-1}, optional when m == 0.
      rest = _grammar.repeat(_grammar.concat(ignored, item), max(node.min - 1, 0),
                             None if node.max is None else node.max - 1)
      return _grammar.repeat(_grammar.concat(item, rest), 0 if node.min == 0 else 1, 1)
    raise TypeError(f"Expected a parsed expansion, got {node!r} instead.")

  def lower_sequence(self, items, lower, ignored: ir.Node) -> ir.Node:
    """`s1 I* s2 I* ... sn`, without copying repeated items.

    A repeat `x{m,n}` standing alone needs two copies of x to put I* only between its
    copies (`x (I* x)*`). Inside a sequence it needs one: after the first item, each
    copy takes the I* before it, `s1 (I* x)* I* s3`; as the first item, the I* after
    it, `(x I*)* s2`. Either way I* lies only between symbols, never at the ends of a
    rule, which a push-down automaton would otherwise have to share with the caller.
    """
    parts: list[ir.Node] = []
    for k, item in enumerate(items):
      repeated = isinstance(item, _Rep) and item.max not in (0, 1)
      if repeated and k > 0:
        parts.append(_grammar.repeat(_grammar.concat(ignored, lower(item.item)),
                                     item.min, item.max))
        continue
      if repeated and k == 0:
        parts.append(_grammar.repeat(_grammar.concat(lower(item.item), ignored),
                                     item.min, item.max))
        continue
      first_was_repeat = k == 1 and isinstance(items[0], _Rep) and items[0].max not in (0, 1)
      if k > 0 and not first_was_repeat:
        parts.append(ignored)
      parts.append(lower(item))
    return _grammar.concat(*parts)

  def lower_ref(self, ref: _Ref, terminals, in_terminal: bool, active) -> ir.Node:
    if ref.is_terminal:
      if ref.name in terminals:
        return terminals[ref.name]
      if ref.name in self.terminals:
        return self.resolve_terminal(ref.name, terminals, active)
      known = sorted({*self.terminals, *self.imported})
      raise self.error(ref.offset, f"terminal {ref.name!r} is not defined",
                       f"a defined or imported terminal {_grammar._preview(known)}",
                       f"Define `{ref.name}: ...` or import it with"
                       f" `%import common.{ref.name}`.")
    if in_terminal:
      raise self.error(ref.offset, f"terminal refers to the rule {ref.name!r}",
                       "terminals built from literals, regexes and other terminals",
                       "Make the terminal a rule (lowercase name).")
    if ref.name not in self.rules:
      raise self.error(ref.offset, f"rule {ref.name!r} is not defined",
                       f"one of {_grammar._preview(self.rules)}",
                       f"Define `{ref.name}: ...` or fix the name.")
    return ir.RuleRef(ref.name)


def _common_terminals() -> dict[str, ir.Node]:
  """The `common` terminals as IR (parsed once from `_COMMON`)."""
  global _COMMON_CACHE
  if _COMMON_CACHE is None:
    parser = _Parser(_COMMON, dialect="Lark common terminals")
    parser.parse_statements()
    done: dict[str, ir.Node] = {}
    for name in parser.terminals:
      parser.resolve_terminal(name, done, ())
    _COMMON_CACHE = done
  return _COMMON_CACHE


_COMMON_CACHE: dict[str, ir.Node] | None = None

"""GBNF front end: llama.cpp's grammar format -> `GrammarIR`.

Public functions:
  parse_gbnf(text, *, start="root")  the grammar as written, rules lowered to IR.

Syntax (llama.cpp `grammars/README.md` and its parser, `llama-grammar.cpp`):

* A rule is `name ::= alternatives`; names are letters, digits, `-` (and `_`, an
  extension). A rule ends at a newline, except after `|`, inside parentheses, or
  before a line whose first non-blank character is `|` (an extension: llama.cpp
  rejects that layout). `#` starts a comment that runs to the end of the line.
* Terminals are Unicode code points, lowered to their UTF-8 bytes:
  `"literal"`, `[a-z0-9_]` classes with ranges, `[^...]` negated classes (over all of
  Unicode), and `.` for any code point (newlines included). Escapes, in literals and
  classes alike: `\\n \\t \\r \\\\ \\" \\[ \\]`, `\\xNN`, `\\uNNNN` and `\\UNNNNNNNN`, which
  denote code points (`\\xFF` is U+00FF, two UTF-8 bytes). In a class, `-` before `]`
  is a literal dash.
* Sequences, `|` alternatives, `( ... )` groups, and the postfix operators `*`, `+`,
  `?`, `{m}`, `{m,}` and `{m,n}` (several apply in turn: `x*?` is `(x*)?`).
* An empty alternative is the empty string (`ws ::= | " "`).
* `root` is the start rule unless `start` says otherwise.

Errors give the 1-based line and column: `GrammarSyntaxError` for text that does not
parse, a rule defined twice (llama.cpp silently keeps the last definition), or a
reference to a rule that is not defined; `UnsupportedGrammarFeatureError` for token
references (`<[1000]>`, `<think>`).
"""

from constrained_decoding import errors
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _ir as ir

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_DIGITS = frozenset("0123456789")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_ESCAPES_HELP = r"one of \n \t \r \\ \" \[ \] \xNN \uNNNN \UNNNNNNNN"
_ANY_CHAR = ir.char_class(((0, ir.MAX_CODE_POINT),))


def parse_gbnf(text: str, *, start: str = "root") -> _grammar.GrammarIR:
  """Parses a GBNF grammar into a `GrammarIR` (rules as written, not normalized).

  ```python
  g = parse_gbnf('root ::= "(" root ")" | [a-z]+')
  _grammar.recursive_rules(g)  # frozenset({'root'})
  ```

  Args:
    text: The grammar source.
    start: The start rule.

  Returns:
    The grammar; groups and repetitions are IR nodes inside the rule bodies, so the
    rules are exactly the named rules of the source.

  Raises:
    TypeError: `text` is not a str.
    GrammarSyntaxError: The grammar does not parse, defines a rule twice, or
      references an undefined rule (with line and column).
    GrammarError: The start rule is not defined.
  """
  if not isinstance(text, str):
    raise TypeError(
        f"Expected the GBNF grammar as a str, got {type(text).__name__} instead. Decode"
        " bytes first, e.g. text.decode('utf-8')."
    )
  return _Parser(text).parse(start)


class _Parser:
  """Recursive descent over the characters of the source, with llama.cpp's spacing rules."""

  def __init__(self, text: str):
    self.text = text
    self.source = _grammar.SourceText(text)
    self.pos = 0
    self.rules: dict[str, ir.Node] = {}
    self.rule_offsets: dict[str, int] = {}
    self.references: list[tuple[str, int]] = []  # (name, offset) of each use.

  # -- Errors and low-level scanning. ---------------------------------------------------

  def error(self, problem: str, expected: str, fix: str, offset: int | None = None,
            cls=errors.GrammarSyntaxError) -> errors.GrammarError:
    offset = self.pos if offset is None else offset
    line, column = self.source.position(offset)
    return cls(
        f"GBNF grammar at line {line}, column {column}: {problem}. Expected {expected}."
        f" {fix}{self.source.excerpt(offset)}",
        line=line, column=column,
    )

  def peek(self, k: int = 0) -> str:
    i = self.pos + k
    return self.text[i] if i < len(self.text) else ""

  def describe_here(self) -> str:
    char = self.peek()
    return "the end of the grammar" if not char else f"{char!r}"

  def skip_space(self, newlines: bool) -> None:
    """Skips blanks and comments, and newlines too when `newlines` (llama.cpp parse_space)."""
    text = self.text
    while self.pos < len(text):
      char = text[self.pos]
      if char in " \t" or (newlines and char in "\r\n"):
        self.pos += 1
      elif char == "#":
        while self.pos < len(text) and text[self.pos] not in "\r\n":
          self.pos += 1
      else:
        break

  def continues_with_bar(self) -> bool:
    """Whether the next non-blank text, across newlines, is `|` (rule continuation)."""
    saved = self.pos
    self.skip_space(newlines=True)
    if self.peek() == "|":
      return True
    self.pos = saved
    return False

  # -- Grammar structure. ----------------------------------------------------------------

  def parse(self, start: str) -> _grammar.GrammarIR:
    self.skip_space(newlines=True)
    while self.pos < len(self.text):
      self.parse_rule()
      self.skip_space(newlines=True)
    self.check_references()
    if start not in self.rules:
      raise errors.GrammarError(
          f"GBNF grammar has no start rule {start!r}. Expected a rule `{start} ::= ...`"
          f" among the defined rules {_grammar._preview(self.rules)}. Define it, or pass"
          " the name of the start rule as `start`."
      )
    return _grammar.GrammarIR(start, tuple(self.rules.items()))

  def parse_name(self, what: str) -> str:
    begin = self.pos
    while self.peek() and self.peek() in _NAME_CHARS:
      self.pos += 1
    if self.pos == begin:
      raise self.error(
          f"{what} is missing: found {self.describe_here()}",
          "a rule name made of letters, digits, '-' and '_'",
          "Start each rule with `name ::=`; continue a rule on the next line only after"
          " `|` or inside parentheses.",
      )
    return self.text[begin:self.pos]

  def parse_rule(self) -> None:
    begin = self.pos
    name = self.parse_name("A rule name")
    self.skip_space(newlines=False)
    if not self.text.startswith("::=", self.pos):
      raise self.error(
          f"rule {name!r} is followed by {self.describe_here()}", "'::=' after the rule name",
          f"Write the rule as `{name} ::= ...`.",
      )
    if name in self.rules:
      first_line, _ = self.source.position(self.rule_offsets[name])
      raise self.error(
          f"rule {name!r} is defined a second time (first at line {first_line})",
          "each rule defined once", "Merge the definitions into one rule with `|`.",
          offset=begin,
      )
    self.pos += 3
    self.skip_space(newlines=True)
    self.rule_offsets[name] = begin
    self.rules[name] = self.parse_alternatives(nested=False)
    char = self.peek()
    if char and char not in "\r\n":
      raise self.error(
          f"unexpected {self.describe_here()} in rule {name!r}",
          "a symbol, an operator (* + ? {m,n}), '|', or the end of the line",
          "Check for an unbalanced ')' or a stray character.",
      )

  def parse_alternatives(self, nested: bool) -> ir.Node:
    alternatives = [self.parse_sequence(nested)]
    while self.peek() == "|" or (not nested and self.continues_with_bar()):
      self.pos += 1
      self.skip_space(newlines=True)
      alternatives.append(self.parse_sequence(nested))
    return ir.union(*alternatives)

  def parse_sequence(self, nested: bool) -> ir.Node:
    items: list[ir.Node] = []
    while True:
      char = self.peek()
      begin = self.pos
      if char == '"':
        items.append(self.parse_literal())
      elif char == "[":
        items.append(self.parse_class())
      elif char == ".":
        self.pos += 1
        items.append(_ANY_CHAR)
      elif char == "(":
        self.pos += 1
        self.skip_space(newlines=True)
        items.append(self.parse_alternatives(nested=True))
        if self.peek() != ")":
          raise self.error(
              f"the group opened at line {self.source.position(begin)[0]}, column"
              f" {self.source.position(begin)[1]} is not closed: found {self.describe_here()}",
              "')'", "Close the group with ')'.",
          )
        self.pos += 1
      elif char and char in _NAME_CHARS:
        name = self.parse_name("A rule reference")
        self.references.append((name, begin))
        items.append(ir.RuleRef(name))
      elif char in ("*", "+", "?", "{"):
        if not items:
          raise self.error(
              f"the operator {char!r} has nothing to repeat", "a symbol or group before it",
              f"Put the symbol to repeat before {char!r}, or quote it as \"{char}\".",
          )
        items[-1] = self.parse_operator(items[-1])
      elif char == "<":
        raise self.error(
            "token references such as <[1000]> or <think> are not supported",
            "literals, classes and rule names",
            "Spell the token's text as a literal instead.",
            cls=errors.UnsupportedGrammarFeatureError,
        )
      else:
        return _grammar.concat(*items)
      self.skip_space(newlines=nested)

  def parse_operator(self, item: ir.Node) -> ir.Node:
    char = self.peek()
    self.pos += 1
    if char == "*":
      return _grammar.repeat(item, 0, None)
    if char == "+":
      return _grammar.repeat(item, 1, None)
    if char == "?":
      return _grammar.repeat(item, 0, 1)
    begin = self.pos - 1
    self.skip_space(newlines=False)
    low = self.parse_int()
    self.skip_space(newlines=False)
    high: int | None = low
    if self.peek() == ",":
      self.pos += 1
      self.skip_space(newlines=False)
      high = self.parse_int() if self.peek() in _DIGITS and self.peek() else None
      self.skip_space(newlines=False)
    if self.peek() != "}":
      raise self.error(
          f"the repetition is not closed: found {self.describe_here()}",
          "'{m}', '{m,}' or '{m,n}'", "Close the repetition with '}'.",
      )
    self.pos += 1
    if high is not None and high < low:
      raise self.error(
          f"the repetition {{{low},{high}}} has max < min", "min <= max",
          "Swap the bounds.", offset=begin,
      )
    return _grammar.repeat(item, low, high)

  def parse_int(self) -> int:
    begin = self.pos
    while self.peek() and self.peek() in _DIGITS:
      self.pos += 1
    if self.pos == begin:
      raise self.error(
          f"the repetition count is missing: found {self.describe_here()}",
          "a non-negative integer", "Write the count as digits, e.g. {2,5}.",
      )
    return int(self.text[begin:self.pos])

  # -- Terminals. ------------------------------------------------------------------------

  def parse_char(self, closing: str) -> int:
    """One (possibly escaped) character as a code point; `closing` ends the construct."""
    char = self.peek()
    if not char:
      raise self.error(
          "the grammar ends inside a literal or class", f"{closing!r} to close it",
          f"Close it with {closing!r}.",
      )
    if char != "\\":
      self.pos += 1
      return ord(char)
    begin = self.pos
    kind = self.peek(1)
    if kind in _SIMPLE_ESCAPES:
      self.pos += 2
      return ord(_SIMPLE_ESCAPES[kind])
    if kind in _HEX_ESCAPES:
      size = _HEX_ESCAPES[kind]
      digits = self.text[self.pos + 2:self.pos + 2 + size]
      if len(digits) != size or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise self.error(
            f"the escape \\{kind} needs {size} hex digits, got {digits!r}",
            f"\\{kind} followed by exactly {size} hex digits", "Pad the code point with zeros.",
        )
      value = int(digits, 16)
      if value > ir.MAX_CODE_POINT:
        raise self.error(
            f"the escape \\{kind}{digits} is beyond U+10FFFF", "a Unicode code point",
            "Use a code point <= 10FFFF.",
        )
      self.pos += 2 + size
      return value
    raise self.error(
        f"unknown escape \\{kind or ''}", _ESCAPES_HELP,
        "Escape a backslash as \\\\.", offset=begin,
    )

  def parse_literal(self) -> ir.Node:
    begin = self.pos
    self.pos += 1
    chars = []
    while self.peek() != '"':
      if not self.peek():
        raise self.error(
            "the string literal is not closed", "'\"' at its end",
            "Close the literal with '\"' (escape a quote inside it as \\\").", offset=begin,
        )
      offset = self.pos
      code = self.parse_char('"')
      if ir.SURROGATES[0] <= code <= ir.SURROGATES[1]:
        raise self.error(
            f"the code point U+{code:04X} is a surrogate, which UTF-8 text never contains",
            "a Unicode scalar value", "Write the character itself instead.", offset=offset,
        )
      chars.append(chr(code))
    self.pos += 1
    return ir.Bytes("".join(chars).encode("utf-8"))

  def parse_class(self) -> ir.Node:
    begin = self.pos
    self.pos += 1
    negated = self.peek() == "^"
    if negated:
      self.pos += 1
    ranges = []
    while self.peek() != "]":
      if not self.peek():
        raise self.error(
            "the character class is not closed", "']' at its end",
            "Close the class with ']' (escape a bracket inside it as \\]).", offset=begin,
        )
      low = self.parse_char("]")
      high = low
      if self.peek() == "-" and self.peek(1) not in ("]", ""):
        range_offset = self.pos
        self.pos += 1
        high = self.parse_char("]")
        if high < low:
          raise self.error(
              f"the range U+{low:04X}-U+{high:04X} is reversed",
              "a range low-high with low <= high", "Swap the ends of the range.",
              offset=range_offset,
          )
      ranges.append((low, high))
    self.pos += 1
    if not ranges:
      raise self.error(
          "the character class is empty", "at least one character or range",
          "Use '.' for any character, or remove the class.", offset=begin,
      )
    ranges = ir.normalize_ranges(ranges)
    node = ir.CharClass(ir.complement_ranges(ranges) if negated else ranges)
    return node if node.ranges else ir.NOTHING

  # -- References. -----------------------------------------------------------------------

  def check_references(self) -> None:
    undefined = [(name, offset) for name, offset in self.references if name not in self.rules]
    if undefined:
      name, offset = undefined[0]
      others = sorted({n for n, _ in undefined} - {name})
      also = f" (also undefined: {_grammar._preview(others)})" if others else ""
      raise self.error(
          f"rule {name!r} is referenced but never defined{also}",
          f"one of the defined rules {_grammar._preview(self.rules)}",
          f"Define `{name} ::= ...` or fix the name.", offset=offset,
      )

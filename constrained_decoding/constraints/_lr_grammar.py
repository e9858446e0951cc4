"""The rules of a Lark grammar as a context-free grammar over terminals (issue 18).

The parser level of grammars with a lexer (docs/lexer_runtime.md) sees a grammar whose
symbols are the lexer's terminals; `_lr.py` builds its LR tables. This module reads it.

Public:
  TerminalGrammar, Production, TerminalDef     the grammar over terminals (plain BNF).
  read_lark_rules(text, start=)                a Lark grammar -> TerminalGrammar.

Reading a Lark grammar. `_lark._Parser` tokenizes and parses the grammar (rules,
terminals, `%ignore`, `%import common.*`); this module keeps its rule ASTs instead of
lowering them to byte-level IR. As in Lark:
* inline string literals and regexes in rules become anonymous terminals; a string
  literal equal to a terminal defined as exactly that string reuses its name; other
  literals are named after their text (`"select"` -> SELECT, `"("` -> LPAR) or
  `__ANON_<n>`;
* EBNF is expanded as Lark's `EBNF_to_BNF` does: `x?` and `[x]` distribute into the
  alternatives of the enclosing rule (`a b? c` -> `a b c | a c`), groups distribute too,
  `x+` becomes a fresh left-recursive rule `__<rule>_plus_<n>: x | __<rule>_plus_<n> x`,
  `x*` the same rule or nothing, `x ~ n..m` the alternatives of n..m copies; identical
  alternatives of a rule are kept once;
* `%ignore` terminals never reach the parser (listed in `TerminalGrammar.ignored`);
* `%declare NAME ...` declares terminals without a pattern (INDENT/DEDENT, produced by
  the lexer's modes), accepted here although `_lark.parse_lark` refuses it.
Rule and terminal priorities, templates and precedence declarations are out of scope
(`_lark` refuses priorities and templates; this module adds no precedence resolution):
operator precedence is written by stratifying rules, as in Lark's own LALR grammars.
"""

import collections
import dataclasses
import re

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _lark

# Lark's names for punctuation literals (lark/load_grammar.py `_TERMINAL_NAMES`).
_PUNCT_NAMES = {
    ".": "DOT", ",": "COMMA", ":": "COLON", ";": "SEMICOLON", "+": "PLUS", "-": "MINUS",
    "*": "STAR", "/": "SLASH", "\\": "BACKSLASH", "|": "VBAR", "?": "QMARK", "!": "BANG",
    "@": "AT", "#": "HASH", "$": "DOLLAR", "%": "PERCENT", "^": "CIRCUMFLEX",
    "&": "AMPERSAND", "_": "UNDERSCORE", "<": "LESSTHAN", ">": "MORETHAN", "=": "EQUAL",
    '"': "DBLQUOTE", "'": "QUOTE", "`": "BACKQUOTE", "~": "TILDE", "(": "LPAR",
    ")": "RPAR", "{": "LBRACE", "}": "RBRACE", "[": "LSQB", "]": "RSQB", "\n": "NEWLINE",
    "\r\n": "CRLF", "\t": "TAB", " ": "SPACE",
}


# -- The grammar over terminals. -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TerminalDef:
  """A terminal of the grammar, for the lexer level.

  Attributes:
    name: Its name (Lark's, or the anonymous name given to an inline literal).
    pattern: Its language as constraint IR, or None for a `%declare`d terminal.
    literal: The string when the terminal is one string literal (a keyword or
      punctuation: it takes priority over regex terminals in the lexer), else None.
    ignore_case: The literal was written `"..."i`.
  """
  name: str
  pattern: ir.Node | None
  literal: str | None = None
  ignore_case: bool = False


@dataclasses.dataclass(frozen=True)
class Production:
  """`lhs -> rhs` over terminal and nonterminal names; `origin` is the Lark rule."""
  lhs: str
  rhs: tuple[str, ...]
  origin: str

  def __str__(self) -> str:
    return f"{self.lhs}: {' '.join(self.rhs) if self.rhs else '<empty>'}"


@dataclasses.dataclass(frozen=True)
class TerminalGrammar:
  """A context-free grammar over terminals in plain BNF.

  Attributes:
    start: The start nonterminal.
    productions: The productions, grouped by left-hand side (no augmented start).
    terminals: The terminals used by the productions, in first-use order.
    terminal_defs: Every terminal (used, ignored, or defined and unused) by name.
    ignored: Names of the `%ignore` terminals (never given to the parser).
  """
  start: str
  productions: tuple[Production, ...]
  terminals: tuple[str, ...]
  terminal_defs: tuple[TerminalDef, ...] = ()
  ignored: tuple[str, ...] = ()

  @property
  def nonterminals(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.lhs for p in self.productions))

  @classmethod
  def from_rules(cls, start: str, rules: dict) -> "TerminalGrammar":
    """From `{lhs: [rhs tuple, ...]}`; names that are not keys are terminals."""
    productions = tuple(Production(lhs, tuple(rhs), lhs)
                        for lhs, alternatives in rules.items() for rhs in alternatives)
    terminals = tuple(dict.fromkeys(s for p in productions for s in p.rhs
                                    if s not in rules))
    return cls(start, productions, terminals,
               tuple(TerminalDef(t, None) for t in terminals))


@dataclasses.dataclass(frozen=True)
class _Anon:
  """An inline literal or regex of a rule (kept with its source text)."""
  kind: str  # "STRING" or "REGEXP"
  text: str
  node: ir.Node


class _RuleReader(_lark._Parser):
  """`_lark._Parser` that keeps inline literals of rules as `_Anon` and reads %declare."""

  def __init__(self, text: str):
    self.in_rule = False
    self.declared: dict[str, int] = {}
    super().__init__(text)

  def parse_definition(self, table, *, rule):
    self.in_rule = rule
    try:
      super().parse_definition(table, rule=rule)
    finally:
      self.in_rule = False

  def parse_directive(self):
    token = self.peek()
    if token.text != "%declare":
      return super().parse_directive()
    self.next()
    while self.at("TERMINAL"):
      name = self.next()
      self.declared[name.text] = name.offset
    self.end_of_statement("%declare")

  def parse_atom(self):
    token = self.peek()
    node = super().parse_atom()
    if self.in_rule and isinstance(node, _lark._Lit):
      last = self.tokens[self.index - 1]
      return _Anon(token.kind, self.text[token.offset:last.offset + len(last.text)],
                   node.node)
    return node


class _Converter:
  """Lark rule ASTs -> BNF alternatives, as Lark's EBNF_to_BNF + SimplifyRule_Visitor."""

  def __init__(self, reader: _RuleReader):
    self.reader = reader
    self.terminal_nodes = {n: node for n, (node, _) in reader.imported.items()}
    for name in reader.terminals:
      reader.resolve_terminal(name, self.terminal_nodes, ())
    self.defs: dict[str, TerminalDef] = {}
    for name, node in self.terminal_nodes.items():
      literal = _literal_of(reader.terminals.get(name, (None,))[0])
      self.defs[name] = TerminalDef(name, node, *(literal or (None, False)))
    for name in reader.declared:
      self.defs.setdefault(name, TerminalDef(name, None))
    self.anon_names: dict[tuple, str] = {}
    self.anon_count = 0
    self.rules: dict[str, list[tuple[str, ...]]] = {}
    self.origins: dict[str, str] = {}
    self.cache: dict[tuple, str] = {}
    self.counts: collections.Counter = collections.Counter()

  def anonymous(self, anon: _Anon) -> str:
    literal = None
    if anon.kind == "STRING" and re.fullmatch(r'"(?:\\.|[^"\\])*"i?', anon.text, re.S):
      literal = self.reader.decode_string(_lark._Token("STRING", anon.text, 0))
    key = (anon.kind, anon.node)
    if key in self.anon_names:
      return self.anon_names[key]
    name = None
    if literal is not None:
      for existing in self.defs.values():  # A terminal defined as exactly this literal.
        if existing.literal is not None and existing.pattern == anon.node:
          name = existing.name
          break
      if name is None:
        text = literal[0]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and text.upper() not in self.defs:
          name = text.upper()
        elif text in _PUNCT_NAMES and _PUNCT_NAMES[text] not in self.defs:
          name = _PUNCT_NAMES[text]
    if name is None:
      while f"__ANON_{self.anon_count}" in self.defs:
        self.anon_count += 1
      name = f"__ANON_{self.anon_count}"
    if name not in self.defs:
      self.defs[name] = TerminalDef(name, anon.node, *(literal or (None, False)))
    self.anon_names[key] = name
    return name

  def alternatives(self, node, rule: str) -> list[tuple[str, ...]]:
    """The BNF alternatives (tuples of names) of an expansion, distributed."""
    if isinstance(node, _Anon):
      return [(self.anonymous(node),)]
    if isinstance(node, _lark._Ref):
      if node.is_terminal:
        if node.name not in self.defs:
          raise self.reader.error(node.offset, f"terminal {node.name!r} is not defined",
                                  "a defined, imported or %declare'd terminal",
                                  f"Define `{node.name}: ...`.")
      elif node.name not in self.reader.rules:
        raise self.reader.error(node.offset, f"rule {node.name!r} is not defined",
                                "a defined rule", f"Define `{node.name}: ...`.")
      return [(node.name,)]
    if isinstance(node, _lark._Lit):  # Not produced by _RuleReader in rules.
      raise TypeError(f"Unexpected literal {node!r} in a rule.")
    if isinstance(node, _lark._Alt):
      out = []
      for alternative in node.alternatives:
        out.extend(self.alternatives(alternative, rule))
      return _dedup(out)
    if isinstance(node, _lark._Seq):
      out = [()]
      for item in node.items:
        parts = self.alternatives(item, rule)
        out = [a + b for a in out for b in parts]
      return _dedup(out)
    if isinstance(node, _lark._Rep):
      item = self.alternatives(node.item, rule)
      if node.max is None:
        name = self.recursive(item, rule, "plus" if node.min else "star")
        prefix = [a + b for a in [()] for b in self.copies(item, max(node.min - 1, 0))]
        out = [p + (name,) for p in prefix]
        if node.min == 0:
          out.append(())
        return _dedup(out)
      out = []
      for count in range(node.min, node.max + 1):
        out.extend(self.copies(item, count))
      return _dedup(out)
    raise TypeError(f"Expected a parsed expansion, got {node!r} instead.")

  @staticmethod
  def copies(item, count):
    out = [()]
    for _ in range(count):
      out = [a + b for a in out for b in item]
    return out

  def recursive(self, item, rule: str, kind: str) -> str:
    """`__<rule>_<kind>_<n>: item | __<rule>_<kind>_<n> item` (one or more copies)."""
    key = tuple(item)
    if key in self.cache:
      return self.cache[key]
    name = f"__{rule.lstrip('_')}_{kind}_{self.counts[rule]}"
    self.counts[rule] += 1
    self.cache[key] = name
    self.rules[name] = _dedup(list(item) + [(name,) + a for a in item])
    self.origins[name] = rule
    return name

  def convert(self, start: str) -> TerminalGrammar:
    if start not in self.reader.rules:
      raise errors.GrammarError(
          f"Lark grammar has no start rule {start!r}. Expected a rule `{start}: ...` among"
          f" {sorted(self.reader.rules)[:10]}. Define it, or pass the start rule's name.")
    self.rules.update((name, []) for name in self.reader.rules)  # Lark's rules first.
    for name, (node, _) in self.reader.rules.items():
      self.rules[name] = self.alternatives(node, name)
      self.origins[name] = name
    ignored = []
    for node, _ in self.reader.ignored:
      if isinstance(node, _lark._Ref) and node.is_terminal:
        ignored.append(node.name)
      else:
        lowered = self.reader.lower(node, self.terminal_nodes, None, in_terminal=True)
        ignored.append(self.anonymous(_Anon("REGEXP", "%ignore", lowered)))
    # Keep the rules reachable from the start, in definition order.
    reachable, todo = {start}, [start]
    while todo:
      for rhs in self.rules[todo.pop()]:
        for symbol in rhs:
          if symbol in self.rules and symbol not in reachable:
            reachable.add(symbol)
            todo.append(symbol)
    productions = tuple(Production(lhs, rhs, self.origins[lhs])
                        for lhs, alternatives in self.rules.items() if lhs in reachable
                        for rhs in alternatives)
    terminals = tuple(dict.fromkeys(s for p in productions for s in p.rhs
                                    if s not in self.rules))
    return TerminalGrammar(start, productions, terminals, tuple(self.defs.values()),
                           tuple(dict.fromkeys(ignored)))


def _literal_of(node) -> tuple[str, bool] | None:
  """(text, ignore_case) when a terminal's AST is one string literal."""
  if isinstance(node, _lark._Lit) and isinstance(node.node, ir.Bytes):
    try:
      return node.node.data.decode("utf-8"), False
    except UnicodeDecodeError:
      return None
  return None


def _dedup(items):
  return list(dict.fromkeys(items))


def read_lark_rules(text: str, *, start: str = "start") -> TerminalGrammar:
  """The rule part of a Lark grammar as a `TerminalGrammar` (module docstring).

  ```python
  g = read_lark_rules('''
      start: "(" start ")" | NAME
      %import common.CNAME -> NAME
  ''')
  g.terminals  # ('LPAR', 'RPAR', 'NAME')
  ```

  Raises:
    TypeError: `text` is not a str.
    GrammarSyntaxError: the grammar does not parse or references an undefined name.
    UnsupportedGrammarFeatureError: syntax outside `_lark`'s subset (priorities, ...).
    GrammarError: the start rule is not defined.
  """
  if not isinstance(text, str):
    raise TypeError(f"Expected the Lark grammar as a str, got {type(text).__name__}.")
  reader = _RuleReader(text)
  reader.parse_statements()
  return _Converter(reader).convert(start)

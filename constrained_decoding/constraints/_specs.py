"""Constraint specs: frozen, hashable values describing what the output must match.

Each spec lowers itself to the constraint IR with `to_ir()`; `Compiler.compile` does
the rest. Specs are cache keys, so they hold only immutable values. Here: `Regex` and
`Grammar` (with their grammar parsing caches and built-ins); the specs whose texts denote
values (`JsonSchema`, `Json`, `Dataclass`) are in `_specs_values.py`.
"""

import dataclasses
import functools
import importlib.resources

from constrained_decoding import errors as _errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints._lexed_options import Indentation, Semicolons
# The value specs live in `_specs_values.py`; re-exported so this module keeps naming
# every spec class.
from constrained_decoding.constraints._specs_values import PROPERTY_ORDERS  # noqa: F401
from constrained_decoding.constraints._specs_values import Dataclass  # noqa: F401
from constrained_decoding.constraints._specs_values import Json  # noqa: F401
from constrained_decoding.constraints._specs_values import JsonSchema  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Regex:
  """The output must fully match a regular expression.

  ```python
  spec = Regex(r"\\d{4}-\\d{2}-\\d{2}")
  ```

  Syntax and semantics are Python's `re` with full-match semantics, over the UTF-8
  bytes of the text (a token may end in the middle of a multi-byte character).
  See `constraints/_regex.py` for the supported constructs, and
  `constraints/_labels.py` for terminal labels and sugar (`(?P<QUOTED_TEXT>)`, ...).

  Attributes:
    pattern: The regular expression.
    unicode: If False (default), `\\d \\w \\s` are ASCII classes, exactly as Python's
      `re.ASCII` (`\\d` = `[0-9]`, as in JSON Schema's ECMAScript patterns). If True,
      they are Python's Unicode classes. `.` and negated classes always range over all
      of Unicode.
  """

  pattern: str
  unicode: bool = False

  def __post_init__(self):
    if not isinstance(self.pattern, str):
      raise TypeError(
          f"Regex pattern {self.pattern!r} is a {type(self.pattern).__name__}. "
          f"Expected str; decode bytes patterns first."
      )

  def to_ir(self) -> ir.Node:
    from constrained_decoding.constraints._regex import parse_regex  # pylint: disable=g-import-not-at-top

    return parse_regex(self.pattern, unicode=self.unicode, labels=True)

  def describe(self) -> str:
    return f"Regex({self.pattern!r})"


_GRAMMAR_SYNTAXES = ("gbnf", "lark")
_DEFAULT_START = {"gbnf": "root", "lark": "start"}


@dataclasses.dataclass(frozen=True)
class Grammar:
  """The output must match a context-free grammar, in GBNF or a subset of Lark.

  ```python
  spec = Grammar('root ::= "(" root ")" | [a-z]+', max_depth=4)
  spec = Grammar.builtin("json", max_depth=3)
  spec = Grammar.builtin("python")   # Lark grammar with a lexer, INDENT/DEDENT
  spec = Grammar(lark_text, syntax="lark", lexer=True, start="start")
  ```

  A grammar without recursion (after inlining, see `constraints/_grammar.py`) is
  regular and compiles like a `Regex`. A recursive grammar compiles to a token-level
  push-down automaton (`automata/_pda.py`) whose stack lives on the device, with room
  for `CompileOptions.stack_depth` pending rules (near that bound the mask offers only
  tokens that can still finish; feeding deeper nesting sets the row's `error`); it must
  be deterministic with one byte of lookahead across rule boundaries, else
  `NondeterministicGrammarError`. With `max_depth`, the recursion is instead unrolled
  so that at most `max_depth` recursive rules are active at once (a recursive start
  rule counts as one): a regular constraint for any grammar,
  deterministic or not; alternatives that would go deeper are dropped.

  Syntaxes: `constraints/_gbnf.py` (llama.cpp's GBNF) and `constraints/_lark.py` (the
  supported Lark subset, with how `%ignore` is applied).

  With `lexer=True` a Lark grammar is read as Lark's LALR parser reads it: terminals
  (regexes and strings) are lexemes, matched longest first with priorities, keywords
  beating NAME and `%ignore`d terminals between any two; the rules must be LR(1) over
  the terminals. It compiles to `LexedTables` (`constraints/_lexed_grammar.py`: a
  lexer-state x token table and LR(1) tables) that the same runtime functions and
  decode loops step, with the parser stack on the device (`CompileOptions.stack_depth`
  entries). `indentation` adds Python's INDENT/DEDENT, `semicolons` Go's automatic
  semicolons. Such tables are not stacked with other constraints (one grammar for the
  whole batch). Built in: "python", "go", "sql" (`builtin`).

  Attributes:
    text: The grammar source.
    syntax: "gbnf" or "lark".
    start: The start rule; None means "root" for GBNF and "start" for Lark.
    max_depth: None, or the recursion depth at which to cut a recursive grammar
      (grammars without a lexer only).
    lexer: Whether the Lark grammar has a lexer (terminals as lexemes; see above).
    indentation: `Indentation` options (Python's INDENT/DEDENT), or None; needs `lexer`.
    semicolons: `Semicolons` options (Go's automatic semicolons), or None; needs `lexer`.
  """

  text: str
  syntax: str = "gbnf"
  start: str | None = None
  max_depth: int | None = None
  lexer: bool = False
  indentation: Indentation | None = None
  semicolons: Semicolons | None = None

  def __post_init__(self):
    if not isinstance(self.text, str):
      raise TypeError(
          f"Grammar text {self.text!r:.40} is a {type(self.text).__name__}. Expected str;"
          " decode bytes first."
      )
    if self.syntax not in _GRAMMAR_SYNTAXES:
      raise ValueError(
          f"Grammar syntax {self.syntax!r} is not supported. Expected one of"
          f" {_GRAMMAR_SYNTAXES}. Pass syntax='gbnf' or syntax='lark'."
      )
    if self.start is not None and not isinstance(self.start, str):
      raise TypeError(
          f"Grammar start {self.start!r} is a {type(self.start).__name__}. Expected the"
          " name of a rule, or None for the default."
      )
    if self.max_depth is not None and (
        isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int)
        or self.max_depth < 0):
      raise ValueError(
          f"Grammar max_depth {self.max_depth!r} is invalid. Expected None or an int >= 0."
          " Pass the recursion depth at which to cut, e.g. max_depth=3."
      )
    self._check_lexer_options()

  def _check_lexer_options(self) -> None:
    """Raises for options of grammars with a lexer that do not fit together."""
    if not isinstance(self.lexer, bool):
      raise TypeError(f"Grammar lexer {self.lexer!r} is a {type(self.lexer).__name__}."
                      " Expected True or False.")
    for name, kind in (("indentation", Indentation), ("semicolons", Semicolons)):
      value = getattr(self, name)
      if value is not None and not isinstance(value, kind):
        raise TypeError(
            f"Grammar {name} {value!r:.60} is a {type(value).__name__}. Expected None or"
            f" cd.{kind.__name__}(...).")
      if value is not None and not self.lexer:
        raise ValueError(
            f"Grammar {name}={value!r:.60} needs a grammar with a lexer. Expected"
            f" lexer=True (and syntax='lark') with {name}. Pass lexer=True.")
    if not self.lexer:
      return
    if self.syntax != "lark":
      raise ValueError(
          f"Grammar lexer=True reads Lark grammars, but syntax is {self.syntax!r}."
          " Expected syntax='lark'. Write the grammar in Lark, or pass lexer=False.")
    if self.max_depth is not None:
      raise ValueError(
          f"Grammar max_depth={self.max_depth} cuts the recursion of a grammar without a"
          " lexer; a grammar with a lexer keeps its parser stack on the device. Expected"
          " max_depth=None with lexer=True. Set the stack size with"
          " CompileOptions(stack_depth=...) instead.")
    if self.indentation is not None and self.semicolons is not None:
      raise ValueError(
          "Grammar got both indentation and semicolons. Expected at most one lexer mode"
          " option (Python's or Go's). Pass one.")

  @classmethod
  def builtin(cls, name: str, *, max_depth: int | None = None) -> "Grammar":
    """A grammar shipped in `constraints/grammars/`, by file name without extension
    (the extension gives the syntax): "json", "arithmetic", "sexpr", "sql_select"; or
    one of the grammars with a lexer (`lexer=True`, with their start rule and lexer
    options): "python" (`python_lexed.lark`, INDENT/DEDENT), "go" (`go.lark`,
    automatic semicolons), "sql" (`sql_select_lexed.lark`)."""
    if isinstance(name, str) and name in _LEXED_BUILTINS:
      file, start, options = _LEXED_BUILTINS[name]
      text, syntax = _read_builtin_grammar(file)
      return cls(text, syntax=syntax, start=start, max_depth=max_depth, lexer=True,
                 **options)
    text, syntax = _read_builtin_grammar(name)
    return cls(text, syntax=syntax, max_depth=max_depth)

  @property
  def start_rule(self) -> str:
    return self.start if self.start is not None else _DEFAULT_START[self.syntax]

  def parse(self):
    """The grammar as written (`GrammarIR`, not normalized)."""
    return _parse_grammar(self.text, self.syntax, self.start_rule)

  def grammar_ir(self):
    """The normalized `GrammarIR`: only true recursion left as rules (`_grammar.normalize`).

    Raises:
      GrammarSyntaxError: The text does not parse (with line and column).
      GrammarRecursionError: Left recursion that cannot be eliminated.
      EmptyConstraintError: The grammar derives no finite string.
    """
    return _normalized_grammar(self.text, self.syntax, self.start_rule)

  def to_ir(self) -> ir.Node:
    """A regular IR node: the grammar's language, or its strings of depth <= max_depth.

    Raises:
      UnsupportedFeatureError: The grammar is recursive and `max_depth` is None, or it
        has a lexer (`Compiler.compile` builds `LexedTables` for it instead).
      GrammarRecursionError: `max_depth` is too small for any string.
    """
    from constrained_decoding.constraints import _grammar  # pylint: disable=g-import-not-at-top
    from constrained_decoding.constraints import _grammar_depth  # pylint: disable=g-import-not-at-top

    if self.lexer:
      raise _errors.UnsupportedFeatureError(
          f"{self.describe()} has a lexer, so it has no regular constraint IR. Expected"
          " a grammar without a lexer here. Compile it with cd.Compiler(vocab).compile,"
          " which builds LexedTables for it.")
    grammar = self.grammar_ir()
    if self.max_depth is None or not _grammar.recursive_rules(grammar):
      return _grammar_depth.to_regular(grammar)
    return _grammar_depth.unroll(grammar, self.max_depth)

  def pushdown_grammar(self):
    """The normalized grammar when it needs the push-down runtime, else None.

    That is when it is recursive and `max_depth` is None; `Compiler` then builds a
    token-level push-down automaton (`automata/_pda.py`) instead of calling `to_ir`.
    """
    from constrained_decoding.constraints import _grammar  # pylint: disable=g-import-not-at-top

    if self.lexer:
      return None
    grammar = self.grammar_ir()
    if self.max_depth is None and _grammar.recursive_rules(grammar):
      return grammar
    return None

  def describe(self) -> str:
    first = next((line.strip() for line in self.text.splitlines()
                  if line.strip() and not line.strip().startswith(("#", "//"))), "")
    depth = "" if self.max_depth is None else f", max_depth={self.max_depth}"
    if self.lexer:
      depth += ", lexer=True"
    return f"Grammar({self.syntax}: {first[:40]!r}{depth})"


# Parsing and normalizing are memoized: a spec is a cache key and may be lowered more
# than once (grammar_ir() for the push-down builder, to_ir() for the regular pipeline).
@functools.lru_cache(maxsize=64)
def _parse_grammar(text: str, syntax: str, start: str):
  """The grammar as written, its rules' sizes estimated before anything is expanded."""
  try:
    if syntax == "gbnf":
      from constrained_decoding.constraints._gbnf import parse_gbnf  # pylint: disable=g-import-not-at-top

      grammar = parse_gbnf(text, start=start)
    else:
      from constrained_decoding.constraints._lark import parse_lark  # pylint: disable=g-import-not-at-top

      grammar = parse_lark(text, start=start)
  except RecursionError as e:
    raise _errors.GrammarError(
        "Grammar nests groups too deeply for the parser. Expected at most a few hundred"
        " nested groups. Name the inner groups as rules.") from e
  for name, body in grammar.rules:
    _check_rule_size(name, body)
  return grammar


def _check_rule_size(name: str, body) -> None:
  """Raises `CompileBudgetError` for a rule whose counted repeats alone would expand past
  the regex front end's bounds (`_regex_size.estimate_size`, linear in the IR)."""
  from constrained_decoding.constraints import _regex  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _regex_size  # pylint: disable=g-import-not-at-top

  size = _regex_size.estimate_size(body)
  longest = max(size.min_len, size.max_len or 0)
  if longest + 1 > _regex._MAX_STATES or size.states > _regex._MAX_EXPANDED_STATES or (  # pylint: disable=protected-access
      size.states + size.work > _regex._MAX_WORK):  # pylint: disable=protected-access
    raise _errors.CompileBudgetError(
        f"Grammar rule {name!r} would expand to about {max(size.states, longest)}"
        " automaton states (estimated from its counted repeats before expanding them)."
        f" Expected at most {_regex._MAX_STATES}. Lower the counts such as '{{100000}}',"  # pylint: disable=protected-access
        " or use '*' or '+' where the exact count does not matter.")


@functools.lru_cache(maxsize=64)
def _normalized_grammar(text: str, syntax: str, start: str):
  from constrained_decoding.constraints import _grammar  # pylint: disable=g-import-not-at-top

  return _grammar.normalize(_parse_grammar(text, syntax, start))


_BUILTIN_EXTENSIONS = {".gbnf": "gbnf", ".lark": "lark"}
# Built-in grammars with a lexer: name -> (file, start rule, lexer options). Their file
# names (`python_lexed`, `go`, `sql_select_lexed`) mean the same: these grammars are
# written for a lexer and do not compile without one.
_PYTHON = ("python_lexed", "file_input", {"indentation": Indentation()})
_GO = ("go", "source_file", {"semicolons": Semicolons()})
_SQL = ("sql_select_lexed", "start", {})
_LEXED_BUILTINS = {"python": _PYTHON, "python_lexed": _PYTHON, "go": _GO, "sql": _SQL,
                   "sql_select_lexed": _SQL}


def _read_builtin_grammar(name: str) -> tuple[str, str]:
  """(text, syntax) of `constraints/grammars/<name>.gbnf` or `.lark`."""
  folder = importlib.resources.files("constrained_decoding.constraints") / "grammars"
  available = sorted(
      entry.name.rsplit(".", 1)[0] for entry in folder.iterdir()
      if any(entry.name.endswith(ext) for ext in _BUILTIN_EXTENSIONS)
  )
  for extension, syntax in _BUILTIN_EXTENSIONS.items():
    entry = folder / f"{name}{extension}"
    if isinstance(name, str) and entry.is_file():
      return entry.read_text(encoding="utf-8"), syntax
  raise ValueError(
      f"Built-in grammar {name!r} does not exist. Expected one of {available}. Pass"
      " Grammar(text, syntax=...) for your own grammar."
  )

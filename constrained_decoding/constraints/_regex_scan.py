"""Regex front end, part: where a pattern uses what `parse_regex` cannot take.

`re`'s parser reports no positions and accepts constructs with no regular language
(lookaround, backreferences, ...); this scanner walks the pattern text itself so that
`UnsupportedRegexError` can name the construct, its offset and the fix, and it finds
the spans of label groups `(?P<NAME>...)`. Also the text helpers the other parts share
(`class_end`, `_shown`).
"""

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class _LabelSpan:
  """Where a label group `(?P<name>content)` is in the pattern.

  Attributes:
    name: The label.
    start: Position of its `(`.
    content: Position of the first character after `>`.
    end: Position of its closing `)`.
    bars: Positions of the `|` separating its content's top-level alternatives.
  """

  name: str
  start: int
  content: int
  end: int
  bars: tuple[int, ...]


def class_end(text: str, i: int) -> int:
  """The index just past the character class whose `[` is at `text[i]` (a `]` right
  after `[` or `[^` is a member; escapes are skipped)."""
  i += 1
  if text.startswith("^", i):
    i += 1
  if text.startswith("]", i):
    i += 1
  while i < len(text) and text[i] != "]":
    i += 2 if text[i] == "\\" else 1
  return i + 1


# --- ECMAScript Unicode property escapes (`\p{...}`, `\P{...}`; JSON Schema patterns) ---

# General_Category values: long name -> short name (ECMAScript / UAX #44 aliases).


def _shown(pattern: str) -> str:
  """`pattern` quoted for a message, shortened past 60 characters."""
  if len(pattern) <= 60:
    return f"'{pattern}'"
  return f"'{pattern[:50]}...' ({len(pattern)} characters)"


# --- Positions of unsupported constructs ----------------------------------------------------

_LOOKAROUND_FIX = (
    "Rewrite the pattern without lookaround: the constraint is a regular language"
    " matched against the whole text."
)
_FIXES = {
    "a named group": (
        "Named groups are reserved for terminal labels such as QUOTED_TEXT; use (?:...)"
        " to group."
    ),
    "an anchor": (
        "Use ^ or \\A only at the very start and $ or \\Z only at the very end (the whole"
        " text is always matched); elsewhere remove them."
    ),
    "a lookahead": _LOOKAROUND_FIX,
    "a negative lookahead": _LOOKAROUND_FIX,
    "a lookbehind": _LOOKAROUND_FIX,
    "a negative lookbehind": _LOOKAROUND_FIX,
    "an atomic group": (
        "Atomic groups can change the language; use (?:...) if backtracking into the"
        " group cannot matter."
    ),
    "a possessive quantifier": (
        "Possessive quantifiers can change the language; use the greedy form (*, +, ?,"
        " {m,n}) if that is what you mean."
    ),
    "a backreference": (
        "Backreferences are not regular; repeat the sub-pattern itself instead."
    ),
    "a conditional group": (
        "Conditionals depend on what a group captured; use an alternation instead."
    ),
    "a word boundary": (
        "Word boundaries look at neighbouring characters; spell out the characters"
        " allowed on each side instead."
    ),
}
_QUANTIFIER = re.compile(r"\{(?!\})\d*(?:,\d*)?\}")
_INLINE_FLAGS = re.compile(r"([aiLmsux]*)(?:-([imsx]*))?([:)])")
_VERBOSE_SPACE = frozenset(" \t\n\r\v\f")
_OCTAL = frozenset("01234567")
_DIGITS = frozenset("0123456789")
_GROUP_PREFIXES = (  # What follows "(?", and the unsupported group it opens.
    ("=", "a lookahead"),
    ("!", "a negative lookahead"),
    ("<=", "a lookbehind"),
    ("<!", "a negative lookbehind"),
    (">", "an atomic group"),
)


@dataclasses.dataclass
class _Token:
  """One item of the light scan: an atom, an anchor ('bol'/'eol') or a group."""

  kind: str
  position: int
  alternatives: list = dataclasses.field(default_factory=list)
  quantified: bool = False


def _first_unsupported(pattern: str, verbose: bool, *, labels: bool = False):
  """(position, construct, fix) of the first unsupported construct, or None.

  `re`'s parse tree has no positions, so this is a light scan of the (already valid)
  pattern that follows `re._parser`'s tokenization: escapes, classes, groups, inline
  flags, verbose-mode whitespace and comments, quantifiers. Anchors are judged with the
  same rule as the tree walk (only at the start or end, outside repeats).
  """
  scanner = _Scanner(pattern, labels=labels)
  alternatives = scanner.alternatives(verbose)
  _check_anchors(alternatives, leading=True, trailing=True, issues=scanner.issues)
  if not scanner.issues:
    return None
  position, construct = min(scanner.issues)
  return position, construct, _FIXES[construct.split(" '")[0]]


class _Scanner:
  """The light scan behind `_first_unsupported`; collects `(position, construct)`.

  With `labels`, named groups are not issues but label groups: their spans are collected
  in `label_spans`, and they count as quantified groups for anchors (an anchor inside a
  label is never at the start or end of the text).
  """

  def __init__(self, pattern: str, *, labels: bool = False):
    self.pattern = pattern
    self.pos = 0
    self.issues: list[tuple[int, str]] = []
    self.labels = labels
    self.label_spans: list[_LabelSpan] = []

  def alternatives(self, verbose: bool, bars: list[int] | None = None
                   ) -> list[list[_Token]]:
    """Scans alternatives up to an unmatched ')' or the end; `bars` gets the '|' positions."""
    p = self.pattern
    alternatives: list[list[_Token]] = [[]]
    while self.pos < len(p) and p[self.pos] != ")":
      if p[self.pos] == "|":
        if bars is not None:
          bars.append(self.pos)
        alternatives.append([])
        self.pos += 1
      else:
        self._item(alternatives[-1], verbose)
    return alternatives

  def _item(self, seq: list[_Token], verbose: bool) -> None:
    p, i = self.pattern, self.pos
    c = p[i]
    if verbose and c in _VERBOSE_SPACE:
      self.pos += 1
    elif verbose and c == "#":
      end = p.find("\n", i)
      self.pos = len(p) if end < 0 else end + 1
    elif c == "(":
      self._group(seq, verbose)
    elif c == "[":
      self._skip_class()
      seq.append(_Token("atom", i))
    elif c == "\\":
      seq.append(_Token(self._escape(), i))
    elif c in "^$":
      seq.append(_Token("bol" if c == "^" else "eol", i))
      self.pos += 1
    elif c in "*+?" or (c == "{" and _QUANTIFIER.match(p, i)):
      end = i + 1 if c != "{" else _QUANTIFIER.match(p, i).end()
      if seq:
        seq[-1].quantified = True
      if p.startswith("+", end):
        self.issues.append((i, "a possessive quantifier"))
        end += 1
      elif p.startswith("?", end):
        end += 1
      self.pos = end
    else:
      seq.append(_Token("atom", i))
      self.pos += 1

  def _skip_class(self) -> None:
    self.pos = class_end(self.pattern, self.pos)

  def _escape(self) -> str:
    """Scans one escape; returns its token kind and records unsupported ones."""
    p, i = self.pattern, self.pos
    d = p[i + 1] if i + 1 < len(p) else ""
    self.pos = i + 2
    if d in "bB":
      self.issues.append((i, f"a word boundary '\\{d}'"))
    elif d == "A":
      return "bol"
    elif d == "Z":
      return "eol"
    elif d in _DIGITS and d != "0":
      digits = d
      if i + 2 < len(p) and p[i + 2] in _DIGITS:
        digits += p[i + 2]
        if d in _OCTAL and p[i + 2] in _OCTAL and i + 3 < len(p) and p[i + 3] in _OCTAL:
          self.pos = i + 4  # A three-digit octal escape.
          return "atom"
      self.pos = i + 1 + len(digits)
      self.issues.append((i, f"a backreference '\\{digits}'"))
    elif d == "N" and p.startswith("{", i + 2):
      self.pos = p.index("}", i) + 1
    return "atom"

  def _group(self, seq: list[_Token], verbose: bool) -> None:
    p, start = self.pattern, self.pos
    inner_verbose = verbose
    if not p.startswith("(?", start):
      self.pos = start + 1
    else:
      j = start + 2
      if p.startswith("#", j):  # A comment, up to the first unescaped ')'.
        while p[j] != ")":
          j += 2 if p[j] == "\\" else 1
        self.pos = j + 1
        return
      if p.startswith("P=", j):
        name = p[j + 2 : p.index(")", j)]
        self.issues.append((start, f"a backreference '(?P={name})'"))
        self.pos = p.index(")", j) + 1
        seq.append(_Token("atom", start))
        return
      if p.startswith("P<", j):
        name = p[j + 2 : p.index(">", j)]
        self.pos = p.index(">", j) + 1
        if self.labels:
          content, bars = self.pos, []
          alternatives = self.alternatives(inner_verbose, bars)
          self.label_spans.append(_LabelSpan(name, start, content, self.pos, tuple(bars)))
          self.pos += 1  # The closing ')'.
          seq.append(_Token("group", start, alternatives, quantified=True))
          return
        self.issues.append((start, f"a named group '{name}'"))
      elif p.startswith("(", j):
        self.issues.append((start, "a conditional group"))
        self.pos = p.index(")", j) + 1
      else:
        for prefix, construct in _GROUP_PREFIXES:
          if p.startswith(prefix, j):
            self.issues.append((start, construct))
            self.pos = j + len(prefix)
            break
        else:
          flags = _INLINE_FLAGS.match(p, j)
          self.pos = flags.end()
          if flags.group(3) == ")":  # Global flags: no group.
            return
          if "x" in flags.group(1):
            inner_verbose = True
          elif "x" in (flags.group(2) or ""):
            inner_verbose = False
    alternatives = self.alternatives(inner_verbose)
    self.pos += 1  # The closing ')'.
    seq.append(_Token("group", start, alternatives))


def _token_like(token: _Token, kind: str) -> bool:
  """Whether a token matches only the empty string, at the start ('bol') or end ('eol')."""
  if token.kind == "group" and not token.quantified:
    return all(_token_like(t, kind) for alt in token.alternatives for t in alt)
  return token.kind == kind


def _check_anchors(alternatives, *, leading: bool, trailing: bool, issues: list) -> None:
  """Records anchors that are not at the start/end, with the rule of `_Walker.walk`."""
  for seq in alternatives:
    last_consuming = max(
        (k for k, t in enumerate(seq) if not _token_like(t, "eol")), default=-1
    )
    at_start = leading
    for k, token in enumerate(seq):
      item_trailing = trailing and k >= last_consuming
      if token.kind == "bol" and not at_start or token.kind == "eol" and not item_trailing:
        issues.append((token.position, "an anchor"))
      if token.kind == "group":
        _check_anchors(
            token.alternatives, leading=at_start and not token.quantified,
            trailing=item_trailing and not token.quantified, issues=issues,
        )
      at_start = at_start and _token_like(token, "bol")

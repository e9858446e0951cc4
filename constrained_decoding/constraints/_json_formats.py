"""JSON Schema `pattern` and `format` as decoded-text IR (over characters, UTF-8).

Public names:
  pattern_ir(pattern)   decoded strings in which `pattern` matches (`re.search`),
                        lookaheads right after a leading `^` included.
  format_ir(name)       decoded strings of a `format` (date-time, uuid, ...).
  FORMATS               the `format` names enforced (others are annotations).

Semantics and the exact language of each format: see `_json_schema.py`'s module doc.
"""

import functools
import re
from re import _parser as sre_parse

from constrained_decoding import errors
from constrained_decoding.constraints import _intersect
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _regex
from constrained_decoding.constraints import _regex_classes
from constrained_decoding.constraints import _regex_scan

_ANY_TEXT = "(?s:.*)"
_GLOBAL_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)")


def _structure(text: str, i: int = 0):
  """(index, character) of each `(`, `)` and `|` from `text[i]` on, outside escapes and
  character classes."""
  while i < len(text):
    c = text[i]
    if c == "\\":
      i += 2
      continue
    if c == "[":
      i = _regex_scan.class_end(text, i)
      continue
    if c in "()|":
      yield i, c
    i += 1


def _split_alternatives(pattern: str) -> list[tuple[int, str]]:
  """(offset, text) of each top-level `|` alternative of a regex (outside groups and
  classes)."""
  out, depth, start = [], 0, 0
  for i, c in _structure(pattern):
    if c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
    elif depth == 0:
      out.append((start, pattern[start:i]))
      start = i + 1
  out.append((start, pattern[start:]))
  return out


def _group_end(text: str, i: int) -> int:
  """The index of the `)` closing the group whose `(` is at `text[i]` (of a valid regex)."""
  depth = 0
  for j, c in _structure(text, i):
    if c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
      if depth == 0:
        return j
  raise ValueError(f"unbalanced group at {i} in {text!r}")  # Excluded by the syntax check.


_LOOKAROUNDS = (("(?=", "lookahead"), ("(?!", "negative lookahead"),
                ("(?<=", "lookbehind"), ("(?<!", "negative lookbehind"))
_LOOKAHEAD_HINT = (
    "Expected lookaheads (?=...) and (?!...) only right after the start anchor ^ or \\A"
    " of the pattern or of a top-level alternative (e.g. '^(?!aws:).+$' or"
    " '^(?=.*[0-9])[a-z0-9]+$'), and no lookbehind. Rewrite the pattern without it: the"
    " constraint is a regular language over the whole text."
)


def _first_lookaround(text: str) -> tuple[int, str] | None:
  """(index, name) of the first lookaround group in `text`, or None."""
  for i, c in _structure(text):
    if c == "(":
      for prefix, name in _LOOKAROUNDS:
        if text.startswith(prefix, i):
          return i, name
  return None


def _backslashes_before(text: str, end: int) -> int:
  n = 0
  while end - n - 1 >= 0 and text[end - n - 1] == "\\":
    n += 1
  return n


def _anchored_end(alternative: str) -> bool:
  if alternative.endswith("$"):
    return _backslashes_before(alternative, len(alternative) - 1) % 2 == 0
  if alternative.endswith("\\Z"):
    return _backslashes_before(alternative, len(alternative) - 1) % 2 == 1
  return False


class _Lowering:
  """Lowers the alternatives of one pattern (`full`: with its global flags `flags`)."""

  def __init__(self, full: str, flags: str):
    self.full = full
    self.flags = flags

  def union(self, alternatives: list[tuple[int, str]], *, at_start: bool) -> ir.Node:
    """The union of the alternatives (offset into `full`, text); `at_start`: they are
    matched at the start of the text (inside a leading lookahead), as if after `^`."""
    wrapped, nodes = [], []
    for offset, alternative in alternatives:
      piece = self.alternative(alternative, offset, at_start=at_start)
      (wrapped if isinstance(piece, str) else nodes).append(piece)
    if wrapped:
      nodes.insert(0, _regex.parse_regex(self.flags + "|".join(wrapped), unicode=False))
    return ir.union(*nodes)

  def alternative(self, alternative: str, offset: int, *, at_start: bool) -> str | ir.Node:
    """The wrapped regex of one alternative, or its IR when it has leading lookaheads."""
    anchor = next((a for a in ("^", "\\A") if alternative.startswith(a)), "")
    start = bool(anchor) or at_start
    i = len(anchor)
    positive, negative = [], []
    while start and alternative.startswith(("(?=", "(?!"), i):
      close = _group_end(alternative, i)
      inner = alternative[i + 3:close]
      language = self.union([(offset + i + 3 + o, a) for o, a in _split_alternatives(inner)],
                            at_start=True)
      (positive if alternative[i + 2] == "=" else negative).append(language)
      i = close + 1
    rest = alternative[i:]
    found = _first_lookaround(rest)
    if found is not None:
      raise errors.UnsupportedRegexError(
          f"Regex {self.full!r} uses a {found[1]} at position {offset + i + found[0]},"
          f" which is not supported there. {_LOOKAHEAD_HINT}")
    end = _anchored_end(alternative)
    wrapped = ("" if start else _ANY_TEXT) + f"(?:{anchor}{rest})" + ("" if end else _ANY_TEXT)
    if not positive and not negative:
      return wrapped
    node = _regex.parse_regex(self.flags + wrapped, unicode=False)
    try:
      for language in positive:
        if node != ir.NOTHING:
          node = _intersect.intersect_text(node, language)
      if negative and node != ir.NOTHING:
        node = _intersect.intersect_text(node, _intersect.complement_text(ir.union(*negative)))
    except ValueError as e:
      raise errors.UnsupportedRegexError(
          f"Regex {self.full!r} has leading lookaheads whose exact automaton is too large:"
          f" {e}. Expected a lookahead (and the rest of its alternative) with a smaller"
          " automaton. Simplify the lookahead, e.g. test a shorter prefix.") from e
    return node


def _check_syntax(pattern: str) -> None:
  """Raises `RegexSyntaxError` unless `re`'s parser takes `pattern` (checked before its
  leading lookaheads are cut out; a variable-width lookbehind, which only `re.compile`
  rejects, is left to be refused as unsupported: ECMAScript allows it)."""
  try:
    sre_parse.parse(pattern)
  except (re.error, OverflowError, ValueError) as e:
    raise errors.RegexSyntaxError(
        f"Regex {pattern!r} is not a valid regular expression: {e}. Expected Python `re`"
        " syntax; fix the pattern.") from e


@functools.lru_cache(maxsize=256)
def pattern_ir(pattern: str) -> ir.Node:
  """The strings (decoded, as UTF-8 IR) in which `pattern` matches: `re.search` semantics.

  Each top-level alternative `a` becomes `(?s:.*)(?:a)(?s:.*)`, without the prefix when
  `a` starts with `^` or `\\A` and without the suffix when it ends with `$` or `\\Z`; the
  wrapped text is parsed by the regex front end, which then rejects anchors anywhere
  else. ECMAScript Unicode property escapes (`\\p{L}`, `\\p{Letter}`, `\\P{Nd}`,
  `\\p{gc=Lu}`, `Any`, `ASCII`, `Assigned`) are classes of the code points `unicodedata`
  gives that General_Category (`_regex_classes.expand_property_escapes`); scripts are refused.
  Leading global flags (`(?i)`) apply to the whole pattern (`(?x)` is refused).

  Lookaheads right after the start anchor of an alternative are exact (several in a
  row too, as in `^(?=.*[a-z])(?!.*--)[a-z-]+$`): `^(?!X)R` is the wrapped `^R`
  intersected with the complement of the texts that start with a match of X, and
  `^(?=X)R` with those texts. X is itself matched at the start of the text: each of its
  alternatives is wrapped like an anchored one (a leading `^` is redundant, one ending
  in `$` or `\\Z` must match the whole text, and may start with lookaheads in turn).
  Such alternatives become `ir.Graph`s over characters (`_intersect.py`). Lookaheads
  anywhere else, and lookbehind, are refused.

  Raises:
    RegexSyntaxError: `pattern` does not parse.
    UnsupportedRegexError: It uses lookaround other than leading lookaheads,
      backreferences, misplaced anchors, ..., or a leading lookahead whose automaton
      exceeds the intersection/complement state budget.
    CompileBudgetError: An alternative or lookahead alone is too large (`parse_regex`).
  """
  full = pattern
  pattern = _regex_classes.expand_property_escapes(pattern)  # ECMAScript `\\p{L}`: a class.
  flags = ""
  match = _GLOBAL_FLAGS.match(pattern)
  if match:
    flags, pattern = match.group(0), pattern[match.end():]
    if "x" in match.group(1):
      raise errors.UnsupportedRegexError(
          f"Regex {pattern!r} uses the verbose flag (?x) in a JSON Schema pattern, which is"
          " not supported. Expected an ECMAScript-like pattern. Remove the whitespace and"
          " comments and the flag."
      )
  if _first_lookaround(pattern) is not None:
    _check_syntax(flags + pattern)
  alternatives = [(len(flags) + o, a) for o, a in _split_alternatives(pattern)]
  return _Lowering(full, flags).union(alternatives, at_start=False)


_HEXDIG = "[0-9a-fA-F]"
_YEAR = r"(?:\d{3}[1-9]|\d\d[1-9]\d|\d[1-9]\d\d|[1-9]\d{3})"  # 0001-9999.
_LEAP_YEAR = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-"
    rf"(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = f"{_HEXDIG}{{1,4}}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "(?:" + "|".join([  # RFC 3986, Sec. 3.2.2.
    rf"(?:{_H16}:){{6}}{_LS32}",
    rf"::(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
# At most 63 characters in all, so no RFC 1123 label (63) or name (253) is too long:
# letters and digits, a single `-` or `.` only between two of them. One counted run of
# units (`automata/_embedded_chains.py`), so it stays small with any vocabulary (labels
# bounded one by one, `([a-z0-9-]{0,61}[a-z0-9])?` each, took 20M token edges).
_HOSTNAME = r"[A-Za-z0-9](?:[A-Za-z0-9]|[-.][A-Za-z0-9]){0,31}"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL = rf"{_ATEXT}+(?:\.{_ATEXT}+)*@{_HOSTNAME}"
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = f"%{_HEXDIG}{{2}}"
_PCHAR = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_AUTHORITY = (
    rf"(?:(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?"
    rf"(?:\[{_IPV6}\]|(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*)(?::\d*)?"
)
_SEGMENTS = rf"(?:/{_PCHAR}*)*"
_URI = (
    rf"[A-Za-z][A-Za-z0-9+.\-]*:(?://{_AUTHORITY}{_SEGMENTS}|/(?:{_PCHAR}+{_SEGMENTS})?"
    rf"|{_PCHAR}+{_SEGMENTS}|)(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
)
_DURATION_TIME = r"T(?:\d+H(?:\d+M(?:\d+(?:\.\d+)?S)?)?|\d+M(?:\d+(?:\.\d+)?S)?|\d+(?:\.\d+)?S)"
_DURATION = (rf"P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:{_DURATION_TIME})?"
             rf"|{_DURATION_TIME}|\d+W)")
_FORMAT_PATTERNS = {
    "duration": _DURATION,
    "password": _ANY_TEXT,
    "binary": _ANY_TEXT,
    "path": _ANY_TEXT,
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": "-".join(f"{_HEXDIG}{{{n}}}" for n in (8, 4, 4, 4, 12)),
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "hostname": _HOSTNAME,
    "email": _EMAIL,
    "uri": _URI,
}
FORMATS = frozenset(_FORMAT_PATTERNS)


@functools.lru_cache(maxsize=None)
def format_ir(name: str) -> ir.Node:
  """The decoded strings of JSON Schema `format` `name` (see the module docstring).

  Raises:
    KeyError: `name` is not in `FORMATS`.
  """
  return _regex.parse_regex(_FORMAT_PATTERNS[name])

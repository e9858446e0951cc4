"""JSON Schema `pattern` and `format` as decoded-text IR (over characters, UTF-8).

Public names:
  pattern_ir(pattern)   decoded strings in which `pattern` matches (`re.search`).
  format_ir(name)       decoded strings of a `format` (date-time, uuid, ...).
  FORMATS               the `format` names enforced (others are annotations).

Semantics and the exact language of each format: see `_json_schema.py`'s module doc.
"""

import functools
import re

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _regex

_ANY_TEXT = "(?s:.*)"
_GLOBAL_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)")


def _split_alternatives(pattern: str) -> list[str]:
  """The top-level `|` alternatives of a regex (outside groups and classes)."""
  out, depth, start, i = [], 0, 0, 0
  while i < len(pattern):
    c = pattern[i]
    if c == "\\":
      i += 2
      continue
    if c == "[":
      i += 1
      if pattern.startswith("^", i):
        i += 1
      if pattern.startswith("]", i):
        i += 1
      while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    elif c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
    elif c == "|" and depth == 0:
      out.append(pattern[start:i])
      start = i + 1
    i += 1
  out.append(pattern[start:])
  return out


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


@functools.lru_cache(maxsize=256)
def pattern_ir(pattern: str) -> ir.Node:
  """The strings (decoded, as UTF-8 IR) in which `pattern` matches: `re.search` semantics.

  Each top-level alternative `a` becomes `(?s:.*)(?:a)(?s:.*)`, without the prefix when
  `a` starts with `^` or `\\A` and without the suffix when it ends with `$` or `\\Z`; the
  wrapped text is parsed by the regex front end, which then rejects anchors anywhere
  else. Leading global flags (`(?i)`) apply to the whole pattern (`(?x)` is refused).

  Raises:
    RegexSyntaxError: `pattern` does not parse.
    UnsupportedRegexError: It uses lookaround, backreferences, misplaced anchors, ....
  """
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
  wrapped = []
  for alternative in _split_alternatives(pattern):
    start = alternative.startswith("^") or alternative.startswith("\\A")
    end = _anchored_end(alternative)
    wrapped.append(("" if start else _ANY_TEXT) + f"(?:{alternative})" + ("" if end else _ANY_TEXT))
  return _regex.parse_regex(flags + "|".join(wrapped), unicode=False)


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

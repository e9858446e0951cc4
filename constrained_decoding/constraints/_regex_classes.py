"""Regex front end, part: the code points of classes, categories, `(?i)` and `\\p{...}`.

Character classes and `\\d \\w \\s` in ASCII and Unicode mode, case-insensitive sets
computed as `re` computes them (quirks included), and Unicode property escapes
expanded to classes before `re` parses the pattern.
"""

import bisect
import ctypes
import functools
import re
from re import _constants as sre
from re._casefix import _EXTRA_CASES

import _sre
import numpy as np

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints._regex_scan import _shown, class_end

_UNICODE = sre.SRE_FLAG_UNICODE
_IGNORECASE = sre.SRE_FLAG_IGNORECASE
_SURROGATE_LO, _SURROGATE_HI = ir.SURROGATES
_ALL_SCALARS = ir.normalize_ranges(((0, ir.MAX_CODE_POINT),))
_BMP_MAX = 0xFFFF

_NEGATED_CATEGORIES = {
    sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT,
    sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
    sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE,
}


def _with_negations(table: dict) -> dict:
  """`table` ({category: ranges} for \\d \\w \\s) plus the complements for \\D \\W \\S."""
  return table | {
      negated: ir.complement_ranges(table[positive])
      for negated, positive in _NEGATED_CATEGORIES.items()
  }


_ASCII_CATEGORIES = _with_negations({
    sre.CATEGORY_DIGIT: ((0x30, 0x39),),
    sre.CATEGORY_WORD: ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    sre.CATEGORY_SPACE: ((0x09, 0x0D), (0x20, 0x20)),
})


# --- Character classes ---------------------------------------------------------------


def _class_ranges(items, flags: int) -> tuple[tuple[int, int], ...]:
  """The scalar values matched by the class `[items]` (an `IN` argument)."""
  if flags & _IGNORECASE:
    return _case_fold(flags).char_class(items, flags)
  if len(items) == 1:  # Fast paths for `\d`, `[0-5]`, ... (already normalized).
    op, av = items[0]
    if op is sre.CATEGORY:
      return _category_ranges(av, flags)
    if op is sre.RANGE and (av[1] < _SURROGATE_LO or av[0] > _SURROGATE_HI):
      return (av,)
  ranges = []
  negate = False
  for op, av in items:
    if op is sre.LITERAL:
      ranges.append((av, av))
    elif op is sre.RANGE:
      ranges.append(av)
    elif op is sre.CATEGORY:
      ranges.extend(_category_ranges(av, flags))
    elif op is sre.NEGATE:
      negate = True
    else:
      raise ValueError(f"Expected a class item, got {op} {av!r} instead.")
  normalized = ir.normalize_ranges(ranges)
  return ir.complement_ranges(normalized) if negate else normalized


def _category_ranges(category, flags: int) -> tuple[tuple[int, int], ...]:
  """The scalar values of `\\d \\w \\s \\D \\W \\S` in the mode given by `flags`."""
  table = _unicode_categories() if flags & _UNICODE else _ASCII_CATEGORIES
  if category not in table:
    raise ValueError(f"Expected a \\d \\w \\s category, got {category} instead.")
  return table[category]


@functools.cache
def _all_code_points() -> str:
  """All of U+0000..U+10FFFF (surrogates included) as one string, index = code point."""
  codes = np.arange(ir.MAX_CODE_POINT + 1, dtype="<u4").tobytes()
  return codes.decode("utf-32-le", "surrogatepass")


def _mask_ranges(mask: np.ndarray) -> tuple[tuple[int, int], ...]:
  """The normalized code point ranges where the boolean `mask` (index = code point) holds."""
  edges = np.diff(mask.astype(np.int8), prepend=0, append=0)
  starts = np.flatnonzero(edges == 1)
  ends = np.flatnonzero(edges == -1) - 1
  return ir.normalize_ranges(zip(starts.tolist(), ends.tolist()))


@functools.cache
def _unicode_categories() -> dict:
  """`\\d \\w \\s` under Unicode semantics, computed once with `_sre`'s predicates.

  `_sre` uses Py_UNICODE_ISDECIMAL, Py_UNICODE_ISALNUM (or '_') and Py_UNICODE_ISSPACE,
  which are what `str.isdecimal`, `str.isalnum` and `str.isspace` test on one character.
  """
  text = _all_code_points()

  def where(predicate) -> np.ndarray:
    return np.fromiter(map(predicate, text), dtype=bool, count=len(text))

  word = where(str.isalnum)
  word[ord("_")] = True
  return _with_negations({
      sre.CATEGORY_DIGIT: _mask_ranges(where(str.isdecimal)),
      sre.CATEGORY_WORD: _mask_ranges(word),
      sre.CATEGORY_SPACE: _mask_ranges(where(str.isspace)),
  })


# --- Case-insensitive matching -----------------------------------------------------------


def _difference(a, b) -> tuple[tuple[int, int], ...]:
  """Normalized ranges `a` minus normalized ranges `b`."""
  return ir.complement_ranges(ir.normalize_ranges(ir.complement_ranges(a) + b))


def _contains(ranges, starts: list[int], value: int) -> bool:
  """Whether `value` lies in normalized `ranges` (with `starts` their lower bounds)."""
  k = bisect.bisect_right(starts, value) - 1
  return k >= 0 and value <= ranges[k][1]


@functools.cache
def _unicode_case_tables() -> tuple[dict[int, int], list[int]]:
  """({ch: tolower(ch)} where they differ, sorted cased characters), as `_sre` sees them."""
  size = ir.MAX_CODE_POINT + 1
  lower = np.fromiter(map(_sre.unicode_tolower, range(size)), np.int64, size)
  changed = np.flatnonzero(lower != np.arange(size)).tolist()
  cased = np.fromiter(map(_sre.unicode_iscased, range(size)), bool, size)
  return dict(zip(changed, lower[changed].tolist())), np.flatnonzero(cased).tolist()


@functools.cache
def _unicode_upper_table() -> dict[int, int]:
  """{x: toupper(x)} where they differ, with `_sre`'s simple uppercase mapping.

  Only `_sre`'s RANGE_UNI_IGNORE (a case-insensitive class range reaching beyond
  U+FFFF) uses the uppercase mapping, and Python exposes it only in C
  (`_PyUnicode_ToUppercase`); a character with toupper(x) != x is cased by definition.
  """
  try:
    upper = ctypes.pythonapi._PyUnicode_ToUppercase
  except AttributeError as e:
    raise errors.UnsupportedRegexError(
        "Case-insensitive character classes with a range beyond U+FFFF need CPython's"
        " _PyUnicode_ToUppercase, which this interpreter does not export. Expected (?i)"
        " class ranges within U+0000..U+FFFF; list the cases explicitly instead."
    ) from e
  upper.restype = ctypes.c_uint32
  upper.argtypes = [ctypes.c_uint32]
  _, cased = _unicode_case_tables()
  return {x: u for x in cased if (u := upper(x)) != x}


class _CaseFold:
  """`re.IGNORECASE` in one mode, as set operations on code point ranges.

  `re` compiles a case-insensitive item to a set M of lowercase values and matches a
  character ch iff tolower(ch) is in M (plus a few quirks mirrored below). So every
  language here is a preimage under `tolower`; only the characters whose lowercase
  differs from themselves (1,433 in Unicode, 26 in ASCII) need individual care.
  """

  def __init__(self, unicode: bool):
    if unicode:
      self.tolower = _sre.unicode_tolower
      self.iscased = _sre.unicode_iscased
      self.fixes = _EXTRA_CASES
      self.lower_of, self.cased = _unicode_case_tables()
    else:
      self.tolower = _sre.ascii_tolower
      self.iscased = _sre.ascii_iscased
      self.fixes = {}
      self.lower_of = {c: c + 32 for c in range(0x41, 0x5B)}
      self.cased = list(range(0x41, 0x5B)) + list(range(0x61, 0x7B))
    self.changed = sorted(self.lower_of)  # Characters whose lowercase is another one.
    self.changed_ranges = ir.normalize_ranges((c, c) for c in self.changed)

  def preimage(self, ranges) -> tuple[tuple[int, int], ...]:
    """{ch : tolower(ch) in ranges}, for normalized `ranges`."""
    starts = [lo for lo, _ in ranges]
    extra = [(c, c) for c, lo in self.lower_of.items() if _contains(ranges, starts, lo)]
    return ir.normalize_ranges(_difference(ranges, self.changed_ranges) + tuple(extra))

  def image(self, lo: int, hi: int) -> list[tuple[int, int]]:
    """{tolower(i) : lo <= i <= hi} plus the extra cases `re` adds for those values."""
    out = list(_difference(((lo, hi),), self.changed_ranges))
    first = bisect.bisect_left(self.changed, lo)
    last = bisect.bisect_right(self.changed, hi)
    out += ((self.lower_of[c],) * 2 for c in self.changed[first:last])
    if self.fixes:
      image = ir.normalize_ranges(out)
      starts = [a for a, _ in image]
      for key, extra in self.fixes.items():
        if _contains(image, starts, key):
          out += ((k, k) for k in extra)
    return out

  def any_cased(self, lo: int, hi: int) -> bool:
    k = bisect.bisect_left(self.cased, lo)
    return k < len(self.cased) and self.cased[k] <= hi

  def literal(self, av: int) -> tuple[tuple[int, int], ...]:
    """The characters a case-insensitive literal `av` matches (`_compile`, LITERAL)."""
    if not self.iscased(av):
      return ir.normalize_ranges(((av, av),))
    lo = self.tolower(av)
    return self.preimage(ir.normalize_ranges((k, k) for k in (lo, *self.fixes.get(lo, ()))))

  def char_class(self, items, flags: int) -> tuple[tuple[int, int], ...]:
    """A case-insensitive class, mirroring `re._compiler._optimize_charset` + `_sre`."""
    values: list[tuple[int, int]] = []  # The set M that tolower(ch) is tested against.
    hascased = negate = False
    for op, av in items:
      if op is sre.LITERAL:
        lo = self.tolower(av)
        if lo > _BMP_MAX:  # Beyond the charmap: kept as is, compared with tolower(ch).
          hascased = True
          values.append((av, av))
        else:
          values.append((lo, lo))
          values += ((k, k) for k in self.fixes.get(lo, ()))
          hascased = hascased or bool(self.iscased(av))
      elif op is sre.RANGE:
        lo, hi = av
        # tolower never crosses the BMP boundary (checked by a test), so the charmap
        # gets exactly the BMP part before `re` falls back to RANGE_UNI_IGNORE.
        if lo <= _BMP_MAX:
          values += self.image(lo, min(hi, _BMP_MAX))
        if hi > _BMP_MAX:
          hascased = True
          values += self._range_uni_ignore(lo, hi)
        else:
          hascased = hascased or self.any_cased(lo, hi)
      elif op is sre.CATEGORY:
        values.extend(_category_ranges(av, flags))
      elif op is sre.NEGATE:
        negate = True
      else:
        raise ValueError(f"Expected a class item, got {op} {av!r} instead.")
    matched = ir.normalize_ranges(values)
    if hascased:
      matched = self.preimage(matched)
    return ir.complement_ranges(matched) if negate else matched

  def _range_uni_ignore(self, lo: int, hi: int) -> list[tuple[int, int]]:
    """{x : lo <= x <= hi or lo <= toupper(x) <= hi}: `_sre`'s RANGE_UNI_IGNORE."""
    upper_of = _unicode_upper_table()
    return [(lo, hi)] + [(x, x) for x, u in upper_of.items() if lo <= u <= hi]


@functools.cache
def _case_fold_for(unicode: bool) -> _CaseFold:
  return _CaseFold(unicode)


def _case_fold(flags: int) -> _CaseFold:
  return _case_fold_for(bool(flags & _UNICODE))


_GC_ALIASES = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu",
    "Lowercase_Letter": "Ll", "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm",
    "Other_Letter": "Lo", "Mark": "M", "Combining_Mark": "M", "Nonspacing_Mark": "Mn",
    "Spacing_Mark": "Mc", "Enclosing_Mark": "Me", "Number": "N", "Decimal_Number": "Nd",
    "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P",
    "punct": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd",
    "Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
    "Final_Punctuation": "Pf", "Other_Punctuation": "Po", "Symbol": "S",
    "Math_Symbol": "Sm", "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk",
    "Other_Symbol": "So", "Separator": "Z", "Space_Separator": "Zs",
    "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C", "Control": "Cc",
    "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co",
    "Unassigned": "Cn",
}
_GC_GROUPS = {"L": ("Lu", "Ll", "Lt", "Lm", "Lo"), "LC": ("Lu", "Ll", "Lt"),
              "M": ("Mn", "Mc", "Me"), "N": ("Nd", "Nl", "No"),
              "P": ("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"), "S": ("Sm", "Sc", "Sk", "So"),
              "Z": ("Zs", "Zl", "Zp"), "C": ("Cc", "Cf", "Cs", "Co", "Cn")}
_GC_VALUES = frozenset(c for group in _GC_GROUPS.values() for c in group)
_PROPERTY_ESCAPE = re.compile(r"\\([pP])\{([^}]*)\}")


@functools.cache
def _general_categories() -> dict[str, tuple[tuple[int, int], ...]]:
  """{two-letter General_Category: its code point ranges}, from `unicodedata` (the
  Unicode version of this Python), computed once."""
  import unicodedata  # pylint: disable=g-import-not-at-top

  names = sorted(_GC_VALUES)
  index = {name: i for i, name in enumerate(names)}
  codes = np.fromiter((index[unicodedata.category(c)] for c in _all_code_points()),
                      dtype=np.int8, count=ir.MAX_CODE_POINT + 1)
  return {name: _mask_ranges(codes == index[name]) for name in names}


@functools.cache
def property_ranges(name: str) -> tuple[tuple[int, int], ...]:
  """The scalar values of the ECMAScript property `\\p{name}`: a General_Category value
  (short or long name, or `General_Category=`/`gc=` it), or `Any`, `ASCII`, `Assigned`.

  Raises:
    RegexSyntaxError: `name` is no Unicode property.
    UnsupportedRegexError: a property this library has no data for (`Script=`,
      `Script_Extensions=`, binary properties such as `Alphabetic`).
  """
  key, _, value = name.partition("=")
  if value and key in ("General_Category", "gc"):
    name = value
  elif value:
    if key in ("Script", "sc", "Script_Extensions", "scx"):
      raise errors.UnsupportedRegexError(
          f"\\p{{{name}}}: Unicode scripts are not supported (Python's `unicodedata` has"
          " no script data). Expected a General_Category such as \\p{L} or \\p{Nd}. List"
          " the script's ranges in a class instead.")
    raise errors.RegexSyntaxError(
        f"\\p{{{name}}} names no Unicode property. Expected General_Category=, gc=,"
        " Script= or Script_Extensions=.")
  if name == "Any":
    return _ALL_SCALARS
  if name == "ASCII":
    return ((0, 0x7F),)
  if name == "Assigned":
    return ir.complement_ranges(property_ranges("Cn"))
  short = _GC_ALIASES.get(name, name)
  if short in _GC_GROUPS:
    table = _general_categories()
    return ir.normalize_ranges([r for c in _GC_GROUPS[short] for r in table[c]])
  if short in _GC_VALUES:
    return ir.normalize_ranges(_general_categories()[short])
  raise errors.UnsupportedRegexError(
      f"\\p{{{name}}} is not a supported Unicode property. Expected a General_Category"
      " (L, Lu, Letter, Nd, ...), Any, ASCII or Assigned; binary properties and scripts"
      " are not supported. List the characters in a class instead.")


def _class_text(ranges) -> str:
  """`ranges` as the inside of a class, every bound an `\\U` escape."""
  return "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}"
                 for lo, hi in ranges)


def _nonempty(ranges, escape: str):
  if not ranges:
    raise errors.UnsupportedRegexError(
        f"{escape} matches no character of UTF-8 text (surrogates never occur in it)."
        " Expected a property with some scalar value. Remove it.")
  return ranges


def expand_property_escapes(pattern: str) -> str:
  """`pattern` with each ECMAScript `\\p{...}` / `\\P{...}` (Unicode mode) written as an
  explicit class of its code points (`property_ranges`; `\\P` the complement), outside
  classes as `[...]` / `[^...]`, inside a class as its ranges; unchanged without one.

  Raises:
    RegexSyntaxError: an unknown property name.
    UnsupportedRegexError: an unsupported property, or one under `(?i)`.
  """
  if "\\p{" not in pattern and "\\P{" not in pattern:
    return pattern
  out, i, n = [], 0, len(pattern)
  found = False
  while i < n:
    c = pattern[i]
    if c == "[":
      end = class_end(pattern, i)
      body, j = [], i
      while j < end:
        match = _PROPERTY_ESCAPE.match(pattern, j)
        if pattern[j] == "\\" and match:
          ranges = property_ranges(match.group(2))
          if match.group(1) == "P":
            ranges = ir.complement_ranges(ranges)
          body.append(_class_text(_nonempty(ranges, match.group(0))))
          found = True
          j = match.end()
        else:
          step = 2 if pattern[j] == "\\" else 1
          body.append(pattern[j:j + step])
          j += step
      out.append("".join(body))
      i = end
      continue
    if c == "\\":
      match = _PROPERTY_ESCAPE.match(pattern, i)
      if match:
        negate = "^" if match.group(1) == "P" else ""
        ranges = _nonempty(property_ranges(match.group(2)), match.group(0))
        out.append(f"[{negate}{_class_text(ranges)}]")
        found = True
        i = match.end()
        continue
      out.append(pattern[i:i + 2])
      i += 2
      continue
    out.append(c)
    i += 1
  if found and re.search(r"\(\?[a-zA-Z]*i", pattern):
    raise errors.UnsupportedRegexError(
        f"Regex {_shown(pattern)} uses \\p{{...}} with case-insensitive matching (?i),"
        " which is not supported. Expected a case-sensitive pattern. List both cases.")
  return "".join(out)

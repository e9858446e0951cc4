"""Regex front end: Python `re` syntax -> constraint IR, with full-match semantics.

Public functions:
  parse_regex(pattern, *, unicode=False)  the IR of the texts that `re.fullmatch` accepts.

The pattern is parsed by the standard library's own parser (`re._parser`, formerly
`sre_parse`), so the syntax is exactly Python's; this module only walks the parse tree.
The language of `parse_regex(p)` is the set of UTF-8 encodings `s.encode()` of the
strings `s` without surrogates such that `re.fullmatch(p, s, re.ASCII)` matches
(`re.fullmatch(p, s)` with `unicode=True`). Decisions that this entails:

* Mode. By default `\\d \\w \\s` (and `(?i)`) follow `re.ASCII`: `\\d` = [0-9],
  `\\w` = [A-Za-z0-9_], `\\s` = [ \\t\\n\\r\\f\\v]; their negations are complements over
  all of Unicode. `unicode=True` or an inline `(?u)` selects Python's Unicode semantics;
  an inline `(?a)` forces ASCII even with `unicode=True`. Local `(?a:...)` / `(?u:...)`
  switch the mode inside the group, as in `re`.
* `.` is any scalar value except `\\n` (with `(?s)`, any scalar value). Classes and
  negated classes range over U+0000..U+10FFFF minus surrogates. A literal surrogate
  (`\\ud800`) can never occur in UTF-8 text, so it matches nothing.
* `(?i)` is exactly `re.IGNORECASE` for the mode, quirks included (e.g. Python's
  `(?i)[a\\U00010400]` matches neither U+10400 nor U+10428): the sets are computed by
  mirroring `re._compiler._optimize_charset` and `_sre`'s matching, and a test checks
  them against `re` over all code points.
* Anchors. `^`, `\\A` at the start and `$`, `\\Z` at the end (of the pattern, or of an
  alternative or group that is itself at the start/end) are no-ops under full match;
  in particular `$` does not admit a trailing newline, since `re.fullmatch('a$', 'a\\n')`
  is None. `(?m)` changes nothing there. Anchors anywhere else raise.
* Lazy quantifiers denote the same language as greedy ones. Possessive quantifiers,
  atomic groups, lookaround, backreferences, conditionals and `\\b`/`\\B` raise
  `UnsupportedRegexError` with the character offset of the construct.
* Named groups `(?P<NAME>...)` are terminal labels and sugar (Sec. 2.5 of the paper)
  when `labels=True` (as `cd.Regex` does): `(?P<QUOTED_TEXT>)`, `(?P<TEXT_TOKEN>)`,
  `(?P<SUBSTRING_OF>text)`, ...; their languages and argument syntax are documented in
  `constraints/_labels.py`. A label may appear several times (`re` itself would reject
  the repeated group name). Any other name, and every named group with
  `labels=False` (JSON Schema patterns, Lark terminals), raises.
"""

import bisect
import ctypes
import dataclasses
import functools
import itertools
import re
import typing
from re import _constants as sre
from re import _parser as sre_parse
from re._casefix import _EXTRA_CASES

import _sre
import numpy as np

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _labels

_ASCII = sre.SRE_FLAG_ASCII
_UNICODE = sre.SRE_FLAG_UNICODE
_TYPE_FLAGS = _ASCII | _UNICODE | sre.SRE_FLAG_LOCALE
_IGNORECASE = sre.SRE_FLAG_IGNORECASE
_DOTALL = sre.SRE_FLAG_DOTALL
_VERBOSE = sre.SRE_FLAG_VERBOSE

_BOL = frozenset({sre.AT_BEGINNING, sre.AT_BEGINNING_STRING})  # ^ \A
_EOL = frozenset({sre.AT_END, sre.AT_END_STRING})  # $ \Z
_UNSUPPORTED_OPS = {  # Parse items the scan reports with a position; names for fallback.
    sre.POSSESSIVE_REPEAT: "a possessive quantifier",
    sre.ATOMIC_GROUP: "an atomic group",
    sre.ASSERT: "a lookahead",
    sre.ASSERT_NOT: "a negative lookahead",
    sre.GROUPREF: "a backreference",
    sre.GROUPREF_EXISTS: "a conditional group",
}

# Hot-loop aliases (module globals are faster than attribute lookups).
_LITERAL, _IN, _AT, _SUBPATTERN, _BRANCH = sre.LITERAL, sre.IN, sre.AT, sre.SUBPATTERN, sre.BRANCH
_MAX_REPEAT, _MIN_REPEAT, _MAXREPEAT = sre.MAX_REPEAT, sre.MIN_REPEAT, sre.MAXREPEAT
_Bytes, _CharClass, _Concat, _Union = ir.Bytes, ir.CharClass, ir.Concat, ir.Union
_NOTHING = ir.NOTHING
_MAYBE_EMPTY = frozenset({sre.AT, sre.SUBPATTERN, sre.BRANCH})  # Items `_eol_like` can accept.
_SURROGATE_LO, _SURROGATE_HI = ir.SURROGATES
_ALL_SCALARS = ir.normalize_ranges(((0, ir.MAX_CODE_POINT),))
_NOT_NEWLINE = ir.normalize_ranges(((0, 9), (11, ir.MAX_CODE_POINT)))
_BMP_MAX = 0xFFFF
_LABEL = object()  # Opcode of a label group in a marked parse tree: (_LABEL, (span, sub)).
_REDEFINITION = re.compile(r"redefinition of group name '(\w+)'")
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)

# Size limits checked before any expansion, so that every pattern answers quickly (a
# hostile `a{100000000}` or `(?:a?){10000}` used to run for minutes). The front end
# does not see `CompileOptions`, so these are module constants.
# Most byte-automaton states: `CompileOptions.max_states`' default. A pattern whose
# shortest match, or whose longest one when there is a longest, is this many bytes
# needs more states than that (a shortest accepted path never repeats a state), so it
# would fail the compiler's own check anyway, only later.
_MAX_STATES = 100_000
# Most automaton states the expansion of counted repeats may create (about 2 s of
# back-end work; 5x the states of the largest automaton within `_MAX_STATES`).
_MAX_EXPANDED_STATES = 500_000
# Most estimated epsilon-removal and determinization steps (`_Size.work`): about 1 s.
_MAX_WORK = 100_000_000
# Most nested groups: the parsers (`re`'s too) and the back end recurse once or more per
# level; 100 leaves room under Python's default limit of 1000 frames for deep callers.
_MAX_NESTING = 100
_METACHARACTERS = re.compile(r"[\\.^$*+?{}\[\]|()]")

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


def parse_regex(pattern: str, *, unicode: bool = False, labels: bool = False) -> ir.Node:
  """The constraint IR of the strings that fully match `pattern`.

  ```python
  parse_regex(r"\\d{2}-[01]|x")
  # Union((Concat((Repeat(CharClass(((48, 57),)), 2, 2), Bytes(b"-"),
  #                CharClass(((48, 49),)))), Bytes(b"x")))
  ```

  Args:
    pattern: A Python `re` pattern, matched against the whole text.
    unicode: Use Python's Unicode semantics for `\\d \\w \\s` and `(?i)` instead of
      `re.ASCII`'s (an inline `(?u)` or `(?a)` in the pattern takes precedence).
    labels: Read named groups as terminal labels and sugar (`_labels.py`); when False
      every named group raises.

  Returns:
    An IR node whose byte language is the UTF-8 encoding of the matching strings.

  Raises:
    TypeError: `pattern` is not a `str` (e.g. a `bytes` pattern).
    RegexSyntaxError: `re` cannot parse `pattern` (a repeat count beyond `re`'s
      limit included).
    CompileBudgetError: The automaton of `pattern` would be too large, estimated
      before expanding any counted repeat (see `_check_budget`).
    UnsupportedRegexError: `pattern` uses a construct that is not supported here
      (lookaround, backreferences, anchors in the middle, unknown named groups,
      malformed label arguments, IMAGE, more than `_MAX_NESTING` nested groups, ...).
  """
  if not isinstance(pattern, str):
    raise TypeError(
        f"Expected the regex pattern as a str, got {type(pattern).__name__} {pattern!r}"
        " instead. Decode a bytes pattern first, e.g. pattern.decode('utf-8')."
    )
  _check_pattern_size(pattern)
  try:
    node = _parse(pattern, unicode=unicode, labels=labels)
  except RecursionError as e:  # A safety net: `_MAX_NESTING` should prevent it.
    raise errors.UnsupportedRegexError(
        f"Regex {_shown(pattern)} nests too deeply for this parser. Expected at most "
        f"{_MAX_NESTING} nested groups; flatten the pattern.") from e
  _check_budget(pattern, node)
  return node


def _parse(pattern: str, *, unicode: bool, labels: bool) -> ir.Node:
  """`parse_regex` without the size checks."""
  if labels and "(?P<" in pattern:
    tree, renamed = _parse_with_unique_names(pattern)
  else:
    tree, renamed = _sre_parse(pattern, pattern), pattern
  verbose = bool(tree.state.flags & _VERBOSE)
  walker = _Walker(pattern, verbose, labels=labels, renamed=renamed)
  if tree.state.groupdict:
    if not labels:
      walker.unsupported("a named group")
    walker.spans = _label_spans(pattern, verbose)
    walker.mark_labels(tree, 0, len(pattern))
  flags = tree.state.flags & ~_TYPE_FLAGS
  if tree.state.flags & _ASCII:  # An inline (?a).
    flags |= _ASCII
  elif unicode or _has_global_unicode_flag(pattern):
    flags |= _UNICODE
  else:
    flags |= _ASCII
  return walker.walk(tree.data, flags, True, True)


def _sre_parse(pattern: str, text: str, flags: int = 0, offset: int = 0):
  """`re`'s parse tree of `text`, which is `pattern[offset:]...`; errors name `pattern`."""
  try:
    return sre_parse.parse(text, flags)
  except re.error as e:
    raise errors.RegexSyntaxError(
        f"Regex '{pattern}' is not a valid regular expression: {e.msg} at position"
        f" {offset + e.pos}. Expected Python `re` syntax; fix the pattern at that position."
    ) from e
  except OverflowError as e:  # A repeat count beyond re's limit: `a{4294967296}`.
    raise errors.RegexSyntaxError(
        f"Regex {_shown(pattern)} is not a valid regular expression: {e}. Expected"
        f" repeat counts below {int(_MAXREPEAT)}; counts that large cannot be compiled anyway."
    ) from e
  except ValueError as e:  # Incompatible flags, detected after parsing.
    raise errors.RegexSyntaxError(
        f"Regex '{pattern}' is not a valid regular expression: {e}. Expected Python"
        " `re` syntax; remove one of the conflicting inline flags."
    ) from e


def _parse_with_unique_names(pattern: str):
  """(parse tree, renamed pattern): `pattern` parsed with repeated labels renamed.

  `re` rejects a group name used twice, but a label may appear any number of times. Each
  repetition `re` reports is renamed to a fresh name of the same length, so every
  position in the renamed pattern is the same as in `pattern` (errors and label spans
  refer to the original).
  """
  renamed = pattern
  counter = itertools.count()
  while True:
    try:
      return sre_parse.parse(renamed, 0), renamed
    except OverflowError:
      _sre_parse(pattern, renamed)  # Raises the syntax error.
      raise
    except re.error as e:
      found = _REDEFINITION.match(e.msg or "")
      if found is None or e.pos is None:
        _sre_parse(pattern, renamed)  # Raises the syntax error.
        raise
      name, start = found.group(1), e.pos
      fresh = next(f for f in (f"_{i}_".ljust(len(name), "_") for i in counter)
                   if f not in renamed)
      if name not in _labels.LABELS or len(fresh) > len(name):
        raise errors.UnsupportedRegexError(
            f"Regex '{pattern}' uses the named group '{name}' twice (again at position"
            f" {start - 4}), and '{name}' is not a terminal label. Expected named groups"
            f" only for the labels {', '.join(_labels.LABELS)}. Use (?:...) to group."
        ) from e
      renamed = renamed[:start] + fresh + renamed[start + len(name):]


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


def _label_spans(pattern: str, verbose: bool) -> list[_LabelSpan]:
  """The named groups of a valid pattern, in order; raises for names that are no label."""
  scanner = _Scanner(pattern, labels=True)
  scanner.alternatives(verbose)
  spans = sorted(scanner.label_spans, key=lambda span: span.start)
  for span in spans:
    if span.name not in _labels.LABELS:
      raise errors.UnsupportedRegexError(
          f"Regex '{pattern}' uses the named group '{span.name}' at position {span.start},"
          f" which is not a terminal label. Expected one of {', '.join(_labels.LABELS)};"
          " use (?:...) for a plain group."
      )
  return spans


def _has_global_unicode_flag(pattern: str) -> bool:
  """Whether `pattern` (already known to parse) has an inline global `(?u)`.

  `re` adds UNICODE to every str pattern, so the parse tree cannot tell; but parsing
  again with `re.ASCII` fails exactly when the pattern itself turns UNICODE on.
  """
  if "(?" not in pattern or "u" not in pattern:
    return False
  try:
    sre_parse.parse(pattern, _ASCII)
  except ValueError:
    return True
  return False


def _combine_flags(flags: int, add_flags: int, del_flags: int) -> int:
  """Flags inside `(?add-del:...)`, as `re._compiler._combine_flags` computes them."""
  if add_flags & _TYPE_FLAGS:
    flags &= ~_TYPE_FLAGS
  return (flags | add_flags) & ~del_flags


def _only_anchors(op, av, anchors) -> bool:
  """Whether an item only matches the empty string at one of `anchors` (`^`, `(?:^|)`)."""
  if op is sre.AT:
    return av in anchors
  if op is sre.SUBPATTERN:
    return all(_only_anchors(*item, anchors) for item in av[3].data)
  if op is sre.BRANCH:
    return all(_only_anchors(*item, anchors) for alt in av[1] for item in alt.data)
  return False


def _bol_like(op, av) -> bool:
  """Whether an item only matches the empty string at the start (`^`, `\\A`, `(?:^|)`)."""
  return _only_anchors(op, av, _BOL)


def _eol_like(op, av) -> bool:
  """Whether an item only matches the empty string at the end (`$`, `\\Z`, `(?:$|)`)."""
  return _only_anchors(op, av, _EOL)


class _Walker:
  """Lowers an `re._parser` parse tree of `pattern` to IR.

  Attributes:
    pattern: The source, for error messages.
    verbose: Whether the pattern is in verbose mode from the start (for error positions).
    labels: Whether named groups are labels.
    renamed: `pattern` with repeated label names made unique (same positions).
    spans: Every label group of the pattern, in order of position.
  """

  __slots__ = ("pattern", "verbose", "labels", "renamed", "spans")

  def __init__(self, pattern: str, verbose: bool, *, labels: bool = False,
               renamed: str | None = None):
    self.pattern = pattern
    self.verbose = verbose
    self.labels = labels
    self.renamed = pattern if renamed is None else renamed
    self.spans: list[_LabelSpan] = []

  def unsupported(self, construct: str):
    """Raises `UnsupportedRegexError` for the first unsupported construct in the text."""
    found = _first_unsupported(self.pattern, self.verbose, labels=self.labels)
    if found is None:  # The scanner and the tree disagree; still say what is wrong.
      raise errors.UnsupportedRegexError(
          f"Regex '{self.pattern}' uses {construct}, which is not supported."
          f" {_FIXES.get(construct, '')}"
      )
    position, construct, fix = found
    raise errors.UnsupportedRegexError(
        f"Regex '{self.pattern}' uses {construct} at position {position}, which is not"
        f" supported. {fix}"
    )

  def walk(self, items: list, flags: int, leading: bool, trailing: bool) -> ir.Node:
    """The IR of a sequence of parse items (a concatenation).

    Args:
      items: The `(opcode, argument)` pairs of one `SubPattern` (its `data`).
      flags: The `re` flags in force (with exactly one of ASCII and UNICODE set).
      leading: Nothing can have been consumed before `items` (`^` is a no-op here).
      trailing: Nothing can be consumed after `items` (`$` is a no-op here).
    """
    if len(items) == 1:  # Fast path for the many one-item sequences (alternatives).
      op, av = items[0]
      if op is _IN:
        return _CharClass(_class_ranges(av, flags))
      if op is _LITERAL and not flags & _IGNORECASE and not (
          _SURROGATE_LO <= av <= _SURROGATE_HI):
        return _Bytes(chr(av).encode())
    # Items after `last_consuming` match only the empty string at the end.
    last_consuming = len(items) - 1
    while last_consuming >= 0 and items[last_consuming][0] in _MAYBE_EMPTY and _eol_like(
        *items[last_consuming]):
      last_consuming -= 1
    folding = flags & _IGNORECASE
    parts: list[ir.Node] = []
    # Pending literal bytes, emitted as one `Bytes`; a bytearray, because appending to
    # `bytes` copies the run each time (quadratic: a 1 MB literal took minutes).
    run = bytearray()
    at_start = leading
    for k, (op, av) in enumerate(items):
      if op is _LITERAL and not (folding and _case_fold(flags).iscased(av)):
        if _SURROGATE_LO <= av <= _SURROGATE_HI:
          return _NOTHING  # Never present in UTF-8 text.
        run += chr(av).encode()
        at_start = False
        continue
      if op is _IN:
        if run:
          parts.append(_Bytes(bytes(run)))
          run = bytearray()
        parts.append(_CharClass(_class_ranges(av, flags)))
        at_start = False
        continue
      item_trailing = trailing and k >= last_consuming
      if op is _AT:
        if (av in _BOL and at_start) or (av in _EOL and item_trailing):
          continue  # A no-op under full match.
        self.unsupported("a word boundary" if av not in _BOL | _EOL else "an anchor")
      node = self._item(op, av, flags, at_start, item_trailing)
      kind = type(node)
      if kind is _Union and not node.alternatives:
        return _NOTHING
      for part in node.parts if kind is _Concat else (node,):
        if type(part) is _Bytes:  # Merge literal runs across groups: (?i:x)yz, a(b)c.
          run += part.data
        else:
          if run:
            parts.append(_Bytes(bytes(run)))
            run = bytearray()
          parts.append(part)
      at_start = at_start and _bol_like(op, av)
    if run:
      parts.append(_Bytes(bytes(run)))
    if len(parts) == 1:
      return parts[0]
    return _Concat(tuple(parts)) if parts else ir.EPSILON

  def _item(self, op, av, flags: int, leading: bool, trailing: bool) -> ir.Node:
    """The IR of one parse item other than a plain literal, a class or an anchor."""
    if op is _LABEL:
      return self._label(*av, flags)
    if op is _SUBPATTERN:
      _, add_flags, del_flags, sub = av
      if add_flags or del_flags:
        flags = _combine_flags(flags, add_flags, del_flags)
      return self.walk(sub.data, flags, leading, trailing)
    if op is _BRANCH:
      alternatives = []
      for alt in av[1]:
        node = self.walk(alt.data, flags, leading, trailing)
        if type(node) is _Union:
          alternatives += node.alternatives
        else:
          alternatives.append(node)
      return alternatives[0] if len(alternatives) == 1 else _Union(tuple(alternatives))
    if op is _MAX_REPEAT or op is _MIN_REPEAT:  # Greedy and lazy: the same language.
      min_count, max_count, sub = av
      body = self.walk(sub.data, flags, False, False)
      if max_count is _MAXREPEAT:
        max_count = None
      elif max_count == 0 or min_count == max_count == 1:
        return ir.EPSILON if max_count == 0 else body
      if type(body) is _Bytes and not body.data:
        return ir.EPSILON
      return ir.Repeat(body, min_count, max_count)
    if op is _LITERAL:  # Case-insensitive.
      return _CharClass(_case_fold(flags).literal(av))
    if op is sre.NOT_LITERAL:
      if flags & _IGNORECASE:
        return _CharClass(ir.complement_ranges(_case_fold(flags).literal(av)))
      return _CharClass(ir.complement_ranges(ir.normalize_ranges(((av, av),))))
    if op is sre.ANY:
      return _CharClass(_ALL_SCALARS if flags & _DOTALL else _NOT_NEWLINE)
    if op in _UNSUPPORTED_OPS:
      self.unsupported(_UNSUPPORTED_OPS[op])
    raise errors.UnsupportedRegexError(
        f"Regex '{self.pattern}' uses the `re` parse item {op}, which is not supported."
        " Please report this pattern."
    )

  # --- Terminal labels and sugar ------------------------------------------------------

  def mark_labels(self, tree, lo: int, hi: int) -> None:
    """Replaces the label groups of `tree` (the parse of pattern[lo:hi]) by `_LABEL` items.

    `re` numbers named groups in order of position, and `self.spans` are in that order,
    so the k-th named group of the tree is the k-th span within [lo, hi). Label contents
    are left alone: `_label` reads them itself.
    """
    spans = [span for span in self.spans if lo <= span.start < hi]
    by_group = dict(zip(sorted(tree.state.groupdict.values()), spans))
    _mark(tree.data, by_group)

  def _label_error(self, span: _LabelSpan, problem: str, fix: str, at: int | None = None):
    where = span.start if at is None else at
    raise errors.UnsupportedRegexError(
        f"Regex '{self.pattern}' uses {span.name} at position {where}, {problem}. {fix}")

  def _label(self, span: _LabelSpan, sub, flags: int) -> ir.Node:
    """The IR of one label group (see `_labels.py` for the languages)."""
    name = span.name
    if name == "IMAGE":
      self._label_error(
          span, "which is not supported for text models",
          "Expected a text label such as QUOTED_TEXT or TEXT_TOKEN; image generation"
          " needs a multi-modal model, and this library constrains text only.")
    if name in ("QUOTED_TEXT", "UNQUOTED_TEXT") or name in _labels.TOKEN_LABELS:
      if sub.data:
        self._label_error(span, "which takes no argument",
                          f"Expected (?P<{name}>) with nothing inside.", span.content)
      if name == "QUOTED_TEXT":
        return _labels.quoted_text()
      if name == "UNQUOTED_TEXT":
        return _labels.unquoted_text()
      return ir.Terminal(name)
    if name in ("TEXT_UNTIL", "SUBSTRING_OF"):
      text = self._literal(span, sub.data, flags)
      if not text:
        what = "a stop phrase" if name == "TEXT_UNTIL" else "the text"
        self._label_error(span, f"without {what}",
                          f"Expected (?P<{name}>text) with non-empty literal text.",
                          span.content)
      return _labels.text_until(text) if name == "TEXT_UNTIL" else _labels.substring_of(text)
    parts = self._arguments(span, flags)
    if name == "DELIMITED_LIST":
      if len(parts) != 2:
        self._label_error(
            span, f"with {len(parts)} argument(s)",
            "Expected (?P<DELIMITED_LIST>ITEM|DELIMITER): two regexes separated by a"
            " top-level '|'; wrap an alternation inside the item in (?:...).")
      return _labels.delimited_list(parts[0][1], parts[1][1])
    if len(parts) < 2:
      self._label_error(
          span, "without items",
          "Expected (?P<DELIMITED_SUBSEQUENCE_OF>ITEM_1|...|ITEM_N|DELIMITER): at least one"
          " item, then the delimiter, separated by top-level '|'.")
    for position, item in parts[:-1]:
      if item == ir.EPSILON:
        self._label_error(span, "with an empty item",
                          "Expected non-empty items; remove the empty alternative.",
                          position)
    return _labels.delimited_subsequence([item for _, item in parts[:-1]], parts[-1][1])

  def _literal(self, span: _LabelSpan, items: list, flags: int) -> str:
    """The text of a literal label argument (plain characters and escapes only)."""
    chars = []
    for op, av in items:
      if op is not _LITERAL:
        self._label_error(
            span, "with an argument that is not literal text",
            f"Expected plain characters and escapes; escape regex metacharacters (e.g."
            f" with re.escape) in the argument starting at position {span.content}.",
            span.content)
      if _SURROGATE_LO <= av <= _SURROGATE_HI:
        self._label_error(span, f"with the surrogate U+{av:04X} in its argument",
                          "Expected Unicode scalar values only.", span.content)
      if flags & _IGNORECASE and _case_fold(flags).iscased(av):
        self._label_error(
            span, "under (?i)",
            "Expected exact literal text: the argument is matched case-sensitively;"
            " scope (?i) to other parts with (?i:...).", span.content)
      chars.append(chr(av))
    return "".join(chars)

  def _arguments(self, span: _LabelSpan, flags: int) -> list[tuple[int, ir.Node]]:
    """(position, IR) of each `|`-separated argument of a sugar label, each parsed alone."""
    starts = (span.content, *(bar + 1 for bar in span.bars))
    ends = (*span.bars, span.end)
    parts = []
    for lo, hi in zip(starts, ends):
      tree = _sre_parse(self.pattern, self.renamed[lo:hi], flags, lo)
      if tree.state.groupdict:
        self.mark_labels(tree, lo, hi)
      parts.append((lo, self.walk(tree.data, flags, False, False)))
    return parts


def _mark(items: list, by_group: dict) -> None:
  """Replaces, in place, SUBPATTERN items whose group is in `by_group` by `_LABEL` items."""
  for k, (op, av) in enumerate(items):
    if op is _SUBPATTERN:
      span = by_group.get(av[0])
      if span is not None:
        items[k] = (_LABEL, (span, av[3]))
      else:
        _mark(av[3].data, by_group)
    elif op is _BRANCH:
      for alternative in av[1]:
        _mark(alternative.data, by_group)
    elif op in _REPEATS:
      _mark(av[2].data, by_group)


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


# --- Size estimate before expansion -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Size:
  """What expanding one IR node into a byte automaton costs, estimated without doing it.

  Attributes:
    states: Automaton states the expansion creates (each counted repeat copies its body).
    min_len, max_len: Shortest and longest matching byte string (None: no longest).
    char_len: The length in characters when every match has the same one, else None.
      Copies of a fixed-length body stay in step while matching; copies of a
      variable-length one drift apart, and the determinizer then tracks sets of them.
    work: Extra work, beyond the states, of removing epsilons and determinizing: a run
      of k optional parts, or k copies of a variable-length body, puts O(k) positions in
      every subset, so it costs O(k * states) rather than O(states).
    empty: The node matches nothing (then the lengths mean nothing).
    exits: States inside the node with an epsilon path to its end (optional copies of
      a counted repeat): in an epsilon chain, each of them reaches every later copy.
  """

  states: int
  min_len: int
  max_len: int | None
  char_len: int | None
  work: int
  empty: bool = False
  exits: int = 0


_EMPTY_SIZE = _Size(0, 0, 0, None, 0, empty=True)


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _utf8_width(code_point: int) -> int:
  return 1 if code_point < 0x80 else 2 if code_point < 0x800 else 3 if code_point < 0x10000 else 4


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _leaf_size(node) -> _Size:
  """The size of a node without IR children."""
  kind = type(node)
  if kind is ir.Bytes:
    data = node.data
    return _Size(len(data), len(data), len(data), len(data.decode("utf-8", "replace")), 0)
  if kind is ir.CharClass:
    if not node.ranges:
      return _EMPTY_SIZE
    lo, hi = _utf8_width(node.ranges[0][0]), _utf8_width(node.ranges[-1][1])
    # ASCII: one arc; otherwise a few states per UTF-8 length (shared suffixes).
    return _Size(1 + 3 * (hi - 1) + min(len(node.ranges), 16), lo, hi, 1, 0)
  if kind is ir.ByteClass:
    return _Size(1, 1, 1, 1, 0) if node.ranges else _EMPTY_SIZE
  return _Size(1, 1, 1, 1, 0)  # A Terminal: one token-class arc.


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _children(node) -> tuple:
  kind = type(node)
  if kind is ir.Concat:
    return node.parts
  if kind is ir.Union:
    return node.alternatives
  if kind is ir.Repeat:
    return (node.node,)
  if kind is ir.Graph:
    return tuple(label for _, label, _ in node.arcs)
  if kind is ir.Fragment:
    return (node.body,)
  return ()


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _concat_size(sizes: list[_Size]) -> _Size:
  """A concatenation; each run of consecutive optional parts adds run length x states."""
  if any(s.empty for s in sizes):
    return _EMPTY_SIZE
  work = sum(s.work for s in sizes)
  run_length = run_states = 0
  for s in sizes + [_Size(0, 1, 1, 1, 0)]:  # A sentinel ends the last run.
    if s.min_len == 0:
      run_length += 1
      run_states += s.states + 1
    else:
      if run_length > 1:
        work += run_length * run_length * run_states
      run_length = run_states = 0
  lengths = [s.char_len for s in sizes]
  exits = 0
  for s in reversed(sizes):  # The last part's exits, and those of any nullable tail.
    exits += s.exits
    if s.min_len:
      break
  return _Size(sum(s.states for s in sizes) + len(sizes), sum(s.min_len for s in sizes),
               None if any(s.max_len is None for s in sizes) else sum(s.max_len for s in sizes),
               None if None in lengths else sum(lengths), work, exits=exits)


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _union_size(sizes: list[_Size]) -> _Size:
  sizes = [s for s in sizes if not s.empty]
  if not sizes:
    return _EMPTY_SIZE
  lengths = {s.char_len for s in sizes}
  return _Size(sum(s.states for s in sizes), min(s.min_len for s in sizes),
               None if any(s.max_len is None for s in sizes) else max(s.max_len for s in sizes),
               lengths.pop() if len(lengths) == 1 else None, sum(s.work for s in sizes),
               exits=sum(s.exits for s in sizes))


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _repeat_size(node: ir.Repeat, body: _Size) -> _Size:
  """`body{min,max}`: one copy of the body per count (`x{m,}` is m copies, one looping)."""
  low, high = node.min, node.max
  if body.empty:
    return _EMPTY_SIZE if low else _Size(0, 0, 0, 0, 0)
  copies = high if high is not None else max(low, 1)
  states = copies * (body.states + 1) + 2
  work = copies * body.work
  if body.min_len == 0:  # An epsilon chain through every copy: each subset spans all.
    work += copies ** 3 * (body.states + 1) * max(1, body.exits)
  elif body.char_len is None:  # Copies drift apart (see `_Size.work`).
    work += copies * copies * (body.states + 1)
  max_len = None if high is None and body.max_len != 0 or body.max_len is None else (
      (high or 0) * body.max_len)
  char_len = low * body.char_len if low == high and body.char_len is not None else None
  exits = (copies - low if high is not None else 1) + body.exits
  return _Size(states, low * body.min_len, max_len, char_len, work, exits=exits)


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def _graph_size(node: ir.Graph, labels: list[_Size]) -> _Size:
  """An embedded automaton: its states and labels; lengths are not computed (0, None)."""
  return _Size(node.num_states + sum(s.states for s in labels), 0, None, None,
               sum(s.work for s in labels) + len(labels))


@typing.no_type_check  # Hot: once per IR node (`_check_budget`).
def estimate_size(node: ir.Node) -> _Size:
  """The `_Size` of `node`, in time linear in the IR (not in its expansion).

  Iterative (an explicit stack), so that deeply nested IR cannot exhaust Python's
  recursion limit; shared sub-nodes are sized once.
  """
  sizes: dict[int, _Size] = {}
  stack = [(node, False)]
  while stack:
    current, expanded = stack.pop()
    key = id(current)
    if key in sizes:
      continue
    children = _children(current)
    if not expanded and children:
      stack.append((current, True))
      stack.extend((child, False) for child in children if id(child) not in sizes)
      continue
    kind = type(current)
    parts = [sizes[id(child)] for child in children]
    if kind is ir.Concat:
      sizes[key] = _concat_size(parts)
    elif kind is ir.Union:
      sizes[key] = _union_size(parts)
    elif kind is ir.Repeat:
      sizes[key] = _repeat_size(current, parts[0])
    elif kind is ir.Graph:
      sizes[key] = _graph_size(current, parts)
    elif kind is ir.Fragment:
      sizes[key] = parts[0]
    else:
      sizes[key] = _leaf_size(current)
  return sizes[id(node)]


def _shown(pattern: str) -> str:
  """`pattern` quoted for a message, shortened past 60 characters."""
  if len(pattern) <= 60:
    return f"'{pattern}'"
  return f"'{pattern[:50]}...' ({len(pattern)} characters)"


def _nesting(pattern: str) -> int:
  """The deepest nesting of groups in `pattern` (escapes and classes skipped)."""
  depth = deepest = 0
  i, n = 0, len(pattern)
  while i < n:
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
      while i < n and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    elif c == "(":
      depth += 1
      deepest = max(deepest, depth)
    elif c == ")":
      depth -= 1
    i += 1
  return deepest


def _check_pattern_size(pattern: str) -> None:
  """Raises for patterns whose size alone rules them out, before `re` parses them."""
  if _METACHARACTERS.search(pattern) is None:  # A plain literal (parsing 1 MB takes 1 s).
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if size >= _MAX_STATES:
      raise errors.CompileBudgetError(
          f"Regex {_shown(pattern)} is a literal of {size} bytes, so its automaton needs "
          f"{size + 1} states. Expected at most {_MAX_STATES} states (the default "
          f"CompileOptions.max_states). Shorten the literal, or generate it in pieces.")
  if pattern.count("(") > _MAX_NESTING and _nesting(pattern) > _MAX_NESTING:
    raise errors.UnsupportedRegexError(
        f"Regex {_shown(pattern)} nests groups {_nesting(pattern)} deep. Expected at "
        f"most {_MAX_NESTING} nested groups; flatten the pattern.")


def _check_budget(pattern: str, node: ir.Node) -> None:
  """Raises `CompileBudgetError` when expanding `node` would cost too much (`_Size`)."""
  size = estimate_size(node)
  if size.empty:
    return  # The compiler reports the empty language.
  needed = max(size.min_len, size.max_len or 0) + 1
  if needed > _MAX_STATES:
    which = "longest" if size.max_len and size.max_len >= size.min_len else "shortest"
    raise errors.CompileBudgetError(
        f"Regex {_shown(pattern)} needs at least {needed} automaton states (its {which} "
        f"match is {needed - 1} bytes). Expected at most {_MAX_STATES} (the default "
        f"CompileOptions.max_states). Lower the counts of repeats such as '{{100000}}', "
        f"or use '*' or '+' where the exact count does not matter.")
  if size.states > _MAX_EXPANDED_STATES or size.states + size.work > _MAX_WORK:
    raise errors.CompileBudgetError(
        f"Regex {_shown(pattern)} would expand to about {size.states} automaton states "
        f"and {size.states + size.work} determinization steps (estimated before "
        f"expanding it). Expected at most {_MAX_EXPANDED_STATES} states and {_MAX_WORK} "
        f"steps. Lower the counts of nested or chained optional repeats such as "
        f"'(?:a?){{1000}}', '(?:.{{0,100}}){{100}}' or 'x*' repeated many times, or use "
        f"'*' or '+' where the exact count does not matter.")


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

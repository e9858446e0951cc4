"""Regex front end: Python `re` syntax -> constraint IR, with full-match semantics.

Public functions:
  parse_regex(pattern, *, unicode=False)  the IR of the texts that `re.fullmatch` accepts.

Its parts: `_regex_scan` (where a pattern uses an unsupported construct, label spans),
`_regex_classes` (code points of classes, categories, `(?i)`, `\\p{...}`) and
`_regex_size` (the expansion's size, estimated before expanding); this module walks
`re`'s parse tree and checks the budgets.

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

import itertools
import re
from re import _constants as sre
from re import _parser as sre_parse

from constrained_decoding import errors
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _labels
from constrained_decoding.constraints._regex_classes import (
    _ALL_SCALARS,
    _IGNORECASE,
    _SURROGATE_HI,
    _SURROGATE_LO,
    _UNICODE,
    _case_fold,
    _class_ranges,
)
from constrained_decoding.constraints._regex_scan import (
    _FIXES,
    _LabelSpan,
    _Scanner,
    _first_unsupported,
    _shown,
)
from constrained_decoding.constraints._regex_size import estimate_size

_ASCII = sre.SRE_FLAG_ASCII
_TYPE_FLAGS = _ASCII | _UNICODE | sre.SRE_FLAG_LOCALE
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
_NOT_NEWLINE = ir.normalize_ranges(((0, 9), (11, ir.MAX_CODE_POINT)))
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


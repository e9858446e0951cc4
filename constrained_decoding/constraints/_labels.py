"""Terminal labels and syntactic sugar (Sec. 2.5, Table 1): their exact languages, as IR.

In a `cd.Regex` they are written as named groups, `(?P<NAME>argument)`, and quantified
like any group (`(?P<PARAGRAPH_TOKEN>)+`, `(?P<QUOTED_TEXT>){3,5}`); `_regex.py` parses
them and calls the builders here. Languages are over UTF-8 text; "character" means a
Unicode scalar value.

Byte-level labels are ordinary byte languages, so a token may cross their boundary
(`"hi",` can be one token ending a QUOTED_TEXT). Their free-text loops become terminal
edges with cached token bitmaps through the wide-state machinery (`automata/_wide.py`),
which stays exact.

  QUOTED_TEXT      A JSON string literal, quotes included: `"` then any number of
                   (a character other than `"`, `\\` and U+0000..U+001F, or an escape
                   `\\"` `\\\\` `\\/` `\\b` `\\f` `\\n` `\\r` `\\t` `\\uXXXX` with any four hex
                   digits) then `"`. Exactly the strings `json.loads` reads as a str
                   (without surrounding whitespace); lone surrogate escapes included.
  UNQUOTED_TEXT    A single-line YAML plain scalar in block context (the value in
                   `key: value`), the way PyYAML's scanner reads one: one or more
                   printable characters (U+0020..U+007E, U+00A0..U+FFFD without
                   surrogates, U+2028, U+2029 and U+FEFF, and U+10000..U+10FFFF; so no
                   tab, line break or control character) such that
                   * the first is not an indicator `-?:,[]{}#&*!|>'"%@` or a backtick,
                     except that `-`, `?` or `:` may start it when a non-space follows;
                   * it contains neither `: ` nor ` #`, and ends with neither `:` nor a
                     space (so it has no leading or trailing space).
                   Syntax only: `true`, `12` or `null` are plain scalars too.
  TEXT_UNTIL       `(?P<TEXT_UNTIL>stop)`: any characters (newlines included) followed
                   by the stop phrase, where the phrase occurs only at the very end:
                   the text up to and including its first occurrence.

Token-level labels stand for one whole token each; they become `ir.Terminal` nodes,
token-class arcs of the byte automaton, and terminal edges in composition. A token
never crosses their boundary: the label is whole tokens.

  TEXT_TOKEN       Exactly one text token: a token to which the vocabulary gives bytes
                   (not a control, unknown or unused token, nor end of sequence) whose
                   bytes are non-empty, valid UTF-8 (whole characters). So a byte-fallback
                   token is a text token for an ASCII byte (`<0x0A>`), not for a lone
                   byte of a multi-byte character (`<0xE4>`), and a sequence of text
                   tokens is always valid UTF-8. Pieces the vocabulary spells as text,
                   such as Gemma's `<start_of_image>`, count as text.
  PARAGRAPH_TOKEN  Exactly one text token whose bytes contain no `\\n`.
  IMAGE            Not supported: UnsupportedRegexError (text models only).

Precedence (Sec. 2.5.1): the runtime follows an explicit token edge when one matches
(this includes the exact byte-level terminal edges of wide states), and otherwise the
first token-level terminal in `ir.TOKEN_CLASSES` order (PARAGRAPH_TOKEN, then
TEXT_TOKEN) whose class holds the token. So where a token could be read both ways
(`(?P<TEXT_TOKEN>)*END`: the token `END` is a text token and spells `END`), only the
preferred reading is kept: every output matches the regex, but some token sequences
the regex allows are not offered (here `END` always ends the text).

Syntactic sugar (Sec. 2.5.2). Arguments are regex syntax, parsed by `re` with the flags
in force (so `(?x)` drops their spaces); several arguments are separated by a top-level
`|` (so an alternation inside one argument needs `(?:...)`). The literal arguments of
SUBSTRING_OF and TEXT_UNTIL must be plain characters and escapes (`re.escape(text)`
makes any text one) and are matched exactly: under `(?i)` an argument with cased
letters is an error.

  SUBSTRING_OF     `(?P<SUBSTRING_OF>text)`: any non-empty substring of the literal
                   `text` (characters, not bytes). Built as the suffix automaton of
                   `text`: O(n) states and arcs, where a regex would be O(n^2). Write
                   `(?P<SUBSTRING_OF>...)?` to allow the empty string.
  DELIMITED_LIST   `(?P<DELIMITED_LIST>ITEM|DELIMITER)`: one or more ITEMs separated by
                   DELIMITERs, `ITEM(?:DELIMITER ITEM)*`; both are regexes (labels
                   allowed), ITEM written once. Add `?` for an empty list.
  DELIMITED_SUBSEQUENCE_OF
                   `(?P<DELIMITED_SUBSEQUENCE_OF>ITEM_1|...|ITEM_N|DELIMITER)`: a
                   non-empty subsequence of the ITEMs, in the given order, separated by
                   DELIMITERs (`b, c` or `a, c` of `a|b|c|, `). Items are regexes
                   (literals typically) and must not be empty. An O(N) automaton.

Public functions:
  LABELS, BYTE_LABELS, TOKEN_LABELS, SUGAR   the label names by kind.
  quoted_text(), unquoted_text()             the byte-level labels' IR.
  text_until(stop), substring_of(text)       O(|argument|) automata (`ir.Graph`).
  delimited_list(item, delimiter)            `item (delimiter item)*`.
  delimited_subsequence(items, delimiter)    an O(N) `ir.Graph`.
"""

import functools

from constrained_decoding.constraints import _ir as ir

BYTE_LABELS = ("QUOTED_TEXT", "UNQUOTED_TEXT", "TEXT_UNTIL")
TOKEN_LABELS = ir.TOKEN_CLASSES
SUGAR = ("SUBSTRING_OF", "DELIMITED_LIST", "DELIMITED_SUBSEQUENCE_OF")
LABELS = BYTE_LABELS + TOKEN_LABELS + ("IMAGE",) + SUGAR

_QUOTE = ir.Bytes(b'"')
_HEX = ir.char_class(((0x30, 0x39), (0x41, 0x46), (0x61, 0x66)))


@functools.cache
def quoted_text() -> ir.Node:
  """A JSON string literal with backslash escapes, quotes included (see the module doc)."""
  plain = ir.CharClass(ir.complement_ranges(ir.normalize_ranges(
      ((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)))))
  escape = ir.concat(ir.Bytes(b"\\"), ir.union(
      ir.char_class((ord(c), ord(c)) for c in '"\\/bfnrt'),
      ir.concat(ir.Bytes(b"u"), ir.repeat(_HEX, 4, 4))))
  return ir.concat(_QUOTE, ir.repeat(ir.union(plain, escape), 0, None), _QUOTE)


# YAML printable characters without tab and line breaks (YAML 1.1's U+2028/U+2029
# included) and without the byte order mark.
_YAML_TEXT = ir.normalize_ranges(((0x20, 0x7E), (0xA0, 0x2027), (0x202A, 0xFEFE),
                                  (0xFF00, 0xFFFD), (0x10000, ir.MAX_CODE_POINT)))
_YAML_INDICATORS = "-?:,[]{}#&*!|>'\"%@`"


def _without(ranges, chars: str) -> ir.CharClass:
  """`ranges` minus the characters of `chars`, as a CharClass."""
  removed = ir.normalize_ranges((ord(c), ord(c)) for c in chars)
  return ir.CharClass(ir.complement_ranges(ir.normalize_ranges(
      ir.complement_ranges(ranges) + removed)))


@functools.cache
def unquoted_text() -> ir.Node:
  """A single-line YAML plain scalar in block context (see the module doc).

  States of the automaton: after a character that is neither a space nor a colon
  (accepting), after colons (a space may not follow), after spaces (`#` may not follow);
  neither of the last two is accepting.
  """
  safe = _without(_YAML_TEXT, " :")  # Neither space nor colon.
  colons = ir.repeat(ir.Bytes(b":"), 1, None)
  first = ir.union(
      _without(_YAML_TEXT, " " + _YAML_INDICATORS),
      ir.concat(ir.char_class((ord(c), ord(c)) for c in "-?:"),
                ir.repeat(ir.Bytes(b":"), 0, None), safe))
  step = ir.union(
      safe,
      ir.concat(colons, safe),
      ir.concat(ir.repeat(ir.Bytes(b" "), 1, None),
                ir.union(_without(_YAML_TEXT, " :#"), ir.concat(colons, safe))))
  return ir.concat(first, ir.repeat(step, 0, None))


def _char(c: str) -> ir.Bytes:
  return ir.Bytes(c.encode())


def text_until(stop: str) -> ir.Graph:
  """Any text whose first occurrence of `stop` (non-empty) is at its very end.

  The string-matching automaton of `stop` over characters (Knuth-Morris-Pratt): state
  i < m = len(stop) means that the longest suffix of the text that is a prefix of
  `stop` has i characters; state m (accepting, no arcs) that `stop` just occurred.
  Each state has arcs for the characters that lead to a state other than 0 (at most
  2m such arcs in total, Simon's bound) and one arc for all other characters back to 0.
  """
  if not stop:
    raise ValueError("text_until needs a non-empty stop phrase.")
  m = len(stop)
  # nonzero[i]: {character: target != 0} of state i, built along failure links.
  nonzero: list[dict[str, int]] = [{stop[0]: 1}]
  fail = 0  # Failure state of the state being built.
  for i in range(1, m):
    row = dict(nonzero[fail])
    row[stop[i]] = i + 1
    nonzero.append(row)
    fail = nonzero[fail].get(stop[i], 0)
  arcs = []
  for i, row in enumerate(nonzero):
    arcs.extend((i, _char(c), j) for c, j in row.items())
    others = ir.complement_ranges(ir.normalize_ranges((ord(c), ord(c)) for c in row))
    if others:
      arcs.append((i, ir.CharClass(others), 0))
  return ir.Graph(m + 1, tuple(arcs), (m,))


def substring_of(text: str) -> ir.Graph:
  """The non-empty substrings of `text` (non-empty): its suffix automaton, O(n).

  Blumer et al.'s online construction over characters: at most 2n - 1 states and
  3n - 4 arcs; every path from the start spells a substring and every substring has
  one, so all states but the start are accepting.
  """
  if not text:
    raise ValueError("substring_of needs a non-empty text.")
  length, link, nexts = [0], [-1], [{}]
  last = 0
  for c in text:
    cur = len(length)
    length.append(length[last] + 1)
    link.append(0)
    nexts.append({})
    p = last
    while p != -1 and c not in nexts[p]:
      nexts[p][c] = cur
      p = link[p]
    if p != -1:
      q = nexts[p][c]
      if length[p] + 1 == length[q]:
        link[cur] = q
      else:
        clone = len(length)
        length.append(length[p] + 1)
        link.append(link[q])
        nexts.append(dict(nexts[q]))
        while p != -1 and nexts[p].get(c) == q:
          nexts[p][c] = clone
          p = link[p]
        link[q] = link[cur] = clone
    last = cur
  arcs = tuple((s, _char(c), t) for s, row in enumerate(nexts) for c, t in row.items())
  return ir.Graph(len(length), arcs, tuple(range(1, len(length))))


def delimited_list(item: ir.Node, delimiter: ir.Node) -> ir.Node:
  """One or more `item`s separated by `delimiter`s: `item (delimiter item)*`."""
  return ir.concat(item, ir.repeat(ir.concat(delimiter, item), 0, None))


def delimited_subsequence(items: list[ir.Node], delimiter: ir.Node) -> ir.Graph:
  """A non-empty subsequence of `items`, in order, separated by `delimiter`s.

  States: `choose_j` (0 <= j < n; the next item is item j or a later one; choose_0 is
  the start) and `after_j` (n + j; item j was the last one, accepting). Arcs:
  choose_j -> choose_j+1 (skip item j), choose_j -item_j-> after_j and
  after_j -delimiter-> choose_j+1. O(n) arcs, against O(n^2) for the regex.
  """
  n = len(items)
  arcs = []
  for j, item in enumerate(items):
    arcs.append((j, item, n + j))
    if j + 1 < n:
      arcs.append((j, ir.EPSILON, j + 1))
      arcs.append((n + j, delimiter, j + 1))
  return ir.Graph(2 * n, tuple(arcs), tuple(range(n, 2 * n)))

"""Shared JSON pieces as constraint IR: whitespace, strings, numbers, constants, any value.

Every piece denotes a set of JSON texts (UTF-8 bytes). The JSON Schema front end
(`_json_schema.py`) and schema-free JSON (`Json`) are built from them.

Public functions and classes:
  Whitespace(name, max_run)           a whitespace policy: where whitespace may go.
  whitespace_policy(name, max_run)    validates a policy name, returns a `Whitespace`.
  json_string(min_length, max_length) any JSON string, optionally bounded in code points.
  canonical_string(text)              the one string `json.dumps(text, ensure_ascii=False)`.
  encode_text(node)                   IR over decoded text -> IR over canonical JSON string bodies.
  string_except(texts)                canonical JSON strings whose value is not in `texts`.
  text_except(texts)                  decoded texts not in `texts` (IR over characters).
  integer_range(lo, hi)               canonical decimal integers in [lo, hi] (None: unbounded).
  number_range(lo, hi, ...)           decimal numbers (no exponent) in an interval.
  json_value(ws, max_depth, ...)      schema-free JSON with bounded nesting.
  json_value_rule(ws, name)           schema-free JSON as a grammar rule (unbounded).
  json_value_fragment(ws, max_depth)  the same as a shared `ir.Fragment` (spliced by compilers).
  const_value(value, ws)              one Python JSON value, serialized under `ws`.
  delimited(open, close, item, ws, min_count, max_count)  `[item, item, ...]`-style lists.
  separated(head, item, separator, tail, min_count)      the same, as a looping `ir.Graph`.
Constants: JSON_NUMBER, JSON_INTEGER, JSON_BOOLEAN, JSON_NULL, STRING_CHAR, UNICODE_ESCAPE,
SURROGATE_PAIR_ESCAPE.

Formatting decisions (narrowings of JSON that make generation well defined):
* Whitespace policies. `compact`: no whitespace at all (`{"a":1,"b":[1,2]}`).
  `single`: one space after `:` and `,` and nowhere else, as Python's `json.dumps`
  default (`{"a": 1, "b": [1, 2]}`). `flexible`: any run of JSON whitespace
  (space, tab, LF, CR) of at most `max_run` characters (default 2) between any two
  tokens inside objects and arrays; never before or after the top-level value. The
  cap prevents the "runaway whitespace" failure of unconstrained `\\s*`.
* Numbers. Integers have no leading zeros, no `+`, and no negative zero (`-0`).
  Unbounded numbers follow the full JSON grammar (fraction and exponent allowed; the
  exponent is not bounded, so Python's `json.loads` may read a huge one as `inf`).
  Bounded numbers (`number_range`) have no exponent and no negative zero (`-0.0`);
  their value is compared with the bounds exactly, as a decimal (JSON Schema's numbers
  are mathematical values). A validator that reads JSON numbers as binary floats may
  disagree next to a bound on texts with more than 17 significant digits
  (`0.10000000000000000001` exceeds 0.1 but reads as the float 0.1).
* Strings. Unconstrained string values (`STRING_CHAR`: `{"type": "string"}` with or
  without `minLength`/`maxLength`, free-form values and their keys) accept the full
  JSON string syntax: every escape, `\\uXXXX` for any scalar value, and characters
  above U+FFFF either as UTF-8 or as a surrogate pair escape (`\\ud83d\\ude00`, as
  `json.dumps` writes it by default; one character for the lengths, as `json.loads` and
  `jsonschema` count it). A lone surrogate escape (`\\ud83d` alone, a low one first, a
  high one twice) is never accepted: RFC 8259's grammar allows it and `json.loads` reads
  it, but it is no Unicode scalar value (no UTF-8 text holds it); a narrowing. Strings
  whose *content* is constrained (patterns, formats, constants, declared object keys,
  `propertyNames`, distinct string items) use the canonical encoding of
  `json.dumps(s, ensure_ascii=False)`: only `"`, `\\` and control characters are escaped
  (`\\n \\r \\t \\b \\f` short forms, else `\\u00xx` with lowercase hex), so every
  value has exactly one encoding (characters above U+FFFF as UTF-8, never as a pair).
  Keys of additional properties next to declared ones (`string_except`, without
  `propertyNames`/`patternProperties`) are canonical too, but also take a pair once
  the key can no longer spell a declared key, or where none goes on above U+FFFF.
"""

import dataclasses
import fractions
import functools
import json
import math

from constrained_decoding.constraints import _ir as ir

WHITESPACE_POLICIES = ("compact", "single", "flexible")
_JSON_WHITESPACE = ir.char_class([(0x20, 0x20), (0x09, 0x0A), (0x0D, 0x0D)])

_DIGIT = ir.char_class([(0x30, 0x39)])
_NONZERO_DIGIT = ir.char_class([(0x31, 0x39)])
_HEX = ir.char_class([(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)])
_MINUS = ir.Bytes(b"-")

# Code points a JSON string may contain unescaped: all but `"`, `\` and controls.
_UNESCAPED = ((0x20, 0x21), (0x23, 0x5B), (0x5D, ir.MAX_CODE_POINT))
UNICODE_ESCAPE = ir.concat(
    ir.Bytes(b"u"),
    ir.union(
        ir.concat(ir.char_class([(0x30, 0x39), (0x41, 0x43), (0x45, 0x46), (0x61, 0x63),
                                 (0x65, 0x66)]), _HEX, _HEX, _HEX),
        ir.concat(ir.char_class([(0x44, 0x44), (0x64, 0x64)]), ir.char_class([(0x30, 0x37)]),
                  _HEX, _HEX),
    ),
)
"""`uXXXX` (after a backslash): a scalar value, never a surrogate D800-DFFF; any hex case."""

_D = ir.char_class([(0x44, 0x44), (0x64, 0x64)])
SURROGATE_PAIR_ESCAPE = ir.concat(
    ir.Bytes(b"u"), _D, ir.char_class([(0x38, 0x39), (0x41, 0x42), (0x61, 0x62)]), _HEX, _HEX,
    ir.Bytes(b"\\u"), _D, ir.char_class([(0x43, 0x46), (0x63, 0x66)]), _HEX, _HEX,
)
"""`uD8XX\\uDCXX` (after a backslash): a high surrogate escape then a low one, which
JSON decoders read as one code point above U+FFFF (RFC 8259, section 7); any hex case.
`json.dumps` (`ensure_ascii=True`, its default) writes astral characters so. A lone
surrogate escape is never accepted (see the module docstring)."""

STRING_CHAR = ir.union(
    ir.char_class(_UNESCAPED),
    ir.concat(ir.Bytes(b"\\"), ir.union(ir.char_class([(c, c) for c in b'"\\/bfnrt']),
                                        UNICODE_ESCAPE, SURROGATE_PAIR_ESCAPE)),
)
"""One character of a JSON string body in the full syntax (literal or any escape; a
surrogate pair escape is one character, as its code point)."""

_QUOTE = ir.Bytes(b'"')

JSON_INTEGER = ir.union(ir.Bytes(b"0"), ir.concat(ir.repeat(_MINUS, 0, 1), _NONZERO_DIGIT,
                                                  ir.repeat(_DIGIT, 0, None)))
"""Canonical JSON integers: no leading zeros, no `+`, no `-0`."""

_FRACTION = ir.concat(ir.Bytes(b"."), ir.repeat(_DIGIT, 1, None))
_EXPONENT = ir.concat(ir.char_class([(0x45, 0x45), (0x65, 0x65)]),
                      ir.repeat(ir.char_class([(0x2B, 0x2B), (0x2D, 0x2D)]), 0, 1),
                      ir.repeat(_DIGIT, 1, None))
JSON_NUMBER = ir.concat(
    ir.repeat(_MINUS, 0, 1), ir.union(ir.Bytes(b"0"), ir.concat(_NONZERO_DIGIT,
                                                                ir.repeat(_DIGIT, 0, None))),
    ir.repeat(_FRACTION, 0, 1), ir.repeat(_EXPONENT, 0, 1),
)
"""Any JSON number (RFC 8259 grammar: fraction and exponent allowed)."""

JSON_BOOLEAN = ir.union(ir.Bytes(b"true"), ir.Bytes(b"false"))
JSON_NULL = ir.Bytes(b"null")


@dataclasses.dataclass(frozen=True)
class Whitespace:
  """Where whitespace may appear between JSON tokens (see the module docstring).

  ```python
  ws = Whitespace("single")
  ws.comma  # Bytes(b", ")
  ```

  Attributes:
    name: `compact`, `single` or `flexible`.
    max_run: Most consecutive whitespace characters between two tokens (`flexible`).
  """

  name: str = "compact"
  max_run: int = 2

  @property
  def gap(self) -> ir.Node:
    """Whitespace allowed between two tokens that `single` would not separate."""
    if self.name == "flexible":
      return ir.repeat(_JSON_WHITESPACE, 0, self.max_run)
    return ir.EPSILON

  @property
  def colon(self) -> ir.Node:
    """The separator between an object key and its value."""
    if self.name == "single":
      return ir.Bytes(b": ")
    return ir.concat(self.gap, ir.Bytes(b":"), self.gap)

  @property
  def comma(self) -> ir.Node:
    """The separator between two members or elements."""
    if self.name == "single":
      return ir.Bytes(b", ")
    return ir.concat(self.gap, ir.Bytes(b","), self.gap)

  def open(self, bracket: bytes) -> ir.Node:
    """An opening bracket followed by the whitespace allowed after it."""
    return ir.concat(ir.Bytes(bracket), self.gap)

  def close(self, bracket: bytes) -> ir.Node:
    """A closing bracket preceded by the whitespace allowed before it."""
    return ir.concat(self.gap, ir.Bytes(bracket))

  def empty(self, brackets: bytes) -> ir.Node:
    """An empty object or array, e.g. `{}` (with at most one whitespace run inside)."""
    return ir.concat(ir.Bytes(brackets[:1]), self.gap, ir.Bytes(brackets[1:]))


def whitespace_policy(name: str, max_run: int = 2) -> Whitespace:
  """A validated `Whitespace`.

  Raises:
    ValueError: Unknown policy name or a negative `max_run`.
  """
  if name not in WHITESPACE_POLICIES:
    raise ValueError(
        f"Whitespace policy {name!r} is not known. Expected one of {WHITESPACE_POLICIES}."
        " Use 'flexible' to let the model choose its whitespace."
    )
  if isinstance(max_run, bool) or not isinstance(max_run, int) or max_run < 0:
    raise ValueError(
        f"max_whitespace {max_run!r} is not a non-negative int. Expected e.g. 2 (the"
        " default). Raise it to allow indented output."
    )
  return Whitespace(name, max_run)


def json_string(min_length: int = 0, max_length: int | None = None) -> ir.Node:
  """JSON strings (full syntax) of `min_length..max_length` code points.

  Each character is one unit: a literal scalar value, one escape, or one surrogate pair
  escape (a lone surrogate escape is excluded, so the count is the code points'
  `json.loads` gives). Note: a bounded repeat of this
  wide class costs one automaton state per allowed length, and each such state allows
  most of the vocabulary, so large `max_length` values make big token tables.
  """
  return ir.concat(_QUOTE, ir.repeat(STRING_CHAR, min_length, max_length), _QUOTE)


def canonical_string(text: str) -> ir.Node:
  """The JSON string `json.dumps(text, ensure_ascii=False)`, quotes included."""
  return ir.Bytes(json.dumps(text, ensure_ascii=False).encode())


def _escape_of(code_point: int) -> bytes:
  """The canonical body encoding of one scalar value."""
  return json.dumps(chr(code_point), ensure_ascii=False)[1:-1].encode()


@functools.lru_cache(maxsize=4096)
def _canonical_class(ranges: tuple[tuple[int, int], ...]) -> ir.Node:
  """Canonical encodings of the scalar values in `ranges` (a normalized CharClass)."""
  literal = _intersect(ranges, _UNESCAPED)
  special = [c for lo, hi in _intersect(ranges, ((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)))
             for c in range(lo, hi + 1)]
  parts = [ir.CharClass(literal)] if literal else []
  if special:
    parts.append(_prefix_tree([_escape_of(c) for c in special]))
  return ir.union(*parts) if parts else ir.NOTHING


def _prefix_tree(strings: list[bytes]) -> ir.Node:
  """The union of ASCII `strings`, factored by common prefixes (a trie, not a list).

  The 34 escapes of `_canonical_class` share `\\` and `\\u00`: as a trie they take a
  dozen automaton states instead of ~170, which matters because every character class
  of a pattern, key or constant string carries them.
  """
  if b"" in strings:
    rest = [s for s in strings if s]
    return ir.union(ir.EPSILON, _prefix_tree(rest)) if rest else ir.EPSILON
  by_first: dict[int, list[bytes]] = {}
  for s in strings:
    by_first.setdefault(s[0], []).append(s[1:])
  leaves = [b for b, tails in by_first.items() if tails == [b""]]
  parts = []
  if len(leaves) > 1:
    parts.append(ir.char_class([(b, b) for b in leaves]))
  else:
    leaves = []
  for b, tails in by_first.items():
    if b not in leaves:
      parts.append(ir.concat(ir.Bytes(bytes([b])), _prefix_tree(tails)))
  return ir.union(*parts)


def _intersect(a, b) -> tuple[tuple[int, int], ...]:
  out = []
  for lo, hi in a:
    for lo2, hi2 in b:
      if max(lo, lo2) <= min(hi, hi2):
        out.append((max(lo, lo2), min(hi, hi2)))
  return ir.normalize_ranges(out)


def encode_text(node: ir.Node) -> ir.Node:
  """Maps an IR over decoded text (UTF-8) to the canonical JSON string bodies of that text.

  The result denotes `{json.dumps(s, ensure_ascii=False)[1:-1] : s in L(node)}`, so a
  regex over string *values* (a JSON Schema `pattern`) becomes one over JSON text.

  Raises:
    ValueError: `node` holds raw bytes that are not whole UTF-8 characters, a
      `ByteClass` or a `Terminal` (none of which denote text).
  """
  match node:
    case ir.Bytes(data):
      try:
        text = data.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(
            f"IR bytes {data!r} are not UTF-8 text. Expected whole characters. Build text"
            " constraints from str patterns."
        ) from e
      return ir.Bytes(json.dumps(text, ensure_ascii=False)[1:-1].encode())
    case ir.CharClass(ranges):
      return _canonical_class(ranges)
    case ir.Concat(parts):
      return ir.concat(*(encode_text(p) for p in parts))
    case ir.Union(alternatives):
      if not alternatives:
        return ir.NOTHING
      return ir.union(*(encode_text(a) for a in alternatives))
    case ir.Repeat(body, lo, hi):
      return ir.repeat(encode_text(body), lo, hi)
    case ir.Graph(num_states, arcs, finals):
      return ir.Graph(num_states, tuple((a, encode_text(label), b) for a, label, b in arcs),
                      finals)
  raise ValueError(
      f"IR node {node!r} does not denote text. Expected Bytes, CharClass, Concat, Union,"
      " Repeat or Graph. Use a regex without byte classes or terminals."
  )


_ASTRAL = ((0x10000, ir.MAX_CODE_POINT),)


def _key_class(ranges: tuple[tuple[int, int], ...]) -> ir.Node:
  """`_canonical_class(ranges)`, plus every surrogate pair escape when `ranges` holds
  every code point above U+FFFF (else none: only a whole plane is cheap to spell so)."""
  node = _canonical_class(ranges)
  if _intersect(ranges, _ASTRAL) == _ASTRAL:
    node = ir.union(node, ir.concat(ir.Bytes(b"\\"), SURROGATE_PAIR_ESCAPE))
  return node


_ANY_KEY_CHAR = _key_class(ir.normalize_ranges([(0, ir.MAX_CODE_POINT)]))


# Code points that are not printable ASCII written literally: the escaped ones (controls,
# `"`, `\\`) and everything non-ASCII. `string_except` reaches one shared copy of their
# (large, UTF-8) class from every key prefix instead of building one copy per prefix.
_LITERAL_ASCII = ir.normalize_ranges([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7F)])
_SHARED_RANGES = ir.complement_ranges(_LITERAL_ASCII)
_SHARED_CLASS = _key_class(_SHARED_RANGES)


def string_except(texts) -> ir.Node:
  """Canonical JSON strings (quotes included) whose decoded value is not in `texts`.

  Built as the complement of the trie of `texts` (size linear in their total length),
  over canonical encodings, so that no other spelling (`"\\u0061"` for `"a"`) can
  smuggle in an excluded value. The one other spelling taken is a surrogate pair escape
  for a character above U+FFFF, once the string has left the trie or where the trie
  continues with no such character (so it never spells a prefix of a text). A string not in `texts` is either a proper prefix of
  one that is no text itself, or leaves the trie at some prefix with a character that
  no text continues with, followed by anything. The "anything" loop, and the large class
  of non-ASCII and escaped characters at every prefix whose continuations avoid it, are
  built once, not once per prefix (same language, a much smaller automaton to compile).
  """
  trie: dict = {}
  for text in texts:
    node = trie
    for ch in text:
      node = node.setdefault(ord(ch), {})
    node[None] = True  # End of a text.
  non_texts, leave, shared_prefixes = _trie_complement(trie)
  left = ir.union(leave, ir.concat(shared_prefixes, _SHARED_CLASS))
  body = ir.union(non_texts, ir.concat(left, ir.repeat(_ANY_KEY_CHAR, 0, None)))
  return ir.concat(_QUOTE, body, _QUOTE)


def text_except(texts) -> ir.Graph:
  """Decoded texts (IR over characters, for `_intersect.intersect_text`) other than `texts`.

  The trie of `texts` with one more state, "anything": a character that no text
  continues with leads there, and it reads any character. Every state but the texts'
  ends is final.
  """
  children: list[dict[int, int]] = [{}]
  is_text = [False]
  for text in texts:
    if not text.isascii():
      try:
        text.encode()
      except UnicodeEncodeError:
        continue  # A lone surrogate: no text of the IR spells it anyway.
    node = 0
    for ch in text:
      nxt = children[node].get(ord(ch))
      if nxt is None:
        nxt = children[node][ord(ch)] = len(children)
        children.append({})
        is_text.append(False)
      node = nxt
    is_text[node] = True
  anything = len(children)
  arcs = [(anything, ir.char_class([(0, ir.MAX_CODE_POINT)]), anything)]
  for node, kids in enumerate(children):
    arcs += [(node, ir.Bytes(chr(c).encode()), child) for c, child in kids.items()]
    others = ir.complement_ranges(ir.normalize_ranges((c, c) for c in kids))
    if others:
      arcs.append((node, ir.CharClass(others), anything))
  finals = [node for node in range(anything) if not is_text[node]] + [anything]
  return ir.Graph(num_states=anything + 1, arcs=tuple(arcs), finals=tuple(finals))


def _trie_complement(node: dict) -> tuple[ir.Node, ir.Node, ir.Node]:
  """Three languages of canonical bodies s, for the trie `node` reached by prefix P.

  Returns:
    (s such that P + s is a trie node but not a text,
     s that leaves the trie with its last character, unless that character is in
       `_SHARED_RANGES` and the prefix it follows continues with none of them,
     s such that P + s is a prefix continuing with none of `_SHARED_RANGES`).
  """
  children = sorted(k for k in node if k is not None)
  non_texts = [] if None in node else [ir.EPSILON]
  leave, shared = [], []
  for c in children:
    child_non_texts, child_leave, child_shared = _trie_complement(node[c])
    step = ir.Bytes(_escape_of(c))
    non_texts.append(ir.concat(step, child_non_texts))
    leave.append(ir.concat(step, child_leave))
    shared.append(ir.concat(step, child_shared))
  classes, takes_shared = _leaving_classes(tuple(children))
  leave += classes
  if not takes_shared:
    shared.append(ir.EPSILON)
  return ir.union(*non_texts), ir.union(*leave), ir.union(*shared)


@functools.lru_cache(maxsize=4096)
def _leaving_classes(children: tuple[int, ...]) -> tuple[tuple[ir.Node, ...], bool]:
  """(classes of the characters leaving a trie node whose children are `children`,
  whether a child is in `_SHARED_RANGES`), for `_trie_complement`: cached per set of
  children, as declared keys share letters."""
  taken = ir.normalize_ranges([(c, c) for c in children])
  literal = _intersect(_LITERAL_ASCII, ir.complement_ranges(taken))
  classes = [ir.CharClass(literal)] if literal else []
  takes_shared = bool(_intersect(taken, _SHARED_RANGES))
  if takes_shared:  # A text continues with one: exact class here.
    others = _intersect(_SHARED_RANGES, ir.complement_ranges(taken))
    if others:
      classes.append(_key_class(others))  # Pairs only if no text continues astrally.
  return tuple(classes), takes_shared


# ---- Integer and number ranges (digit-by-digit automata). ----


def _digit_range(lo: int, hi: int) -> ir.Node:
  return ir.char_class([(0x30 + lo, 0x30 + hi)])


def _same_length(a: str, b: str) -> ir.Node:
  """Digit strings of length len(a) == len(b) between `a` and `b` (inclusive).

  Classic construction: after the common prefix, the range splits into
  `a0 [a_rest..9...9] | [a0+1..b0-1] \\d{n-1} | b0 [0...0..b_rest]`, merging the outer
  parts into the middle when `a_rest` is all zeros or `b_rest` all nines.
  """
  if a == b:
    return ir.Bytes(a.encode())
  k = 0
  while a[k] == b[k]:
    k += 1
  if k:
    return ir.concat(ir.Bytes(a[:k].encode()), _same_length(a[k:], b[k:]))
  if len(a) == 1:
    return _digit_range(int(a), int(b))
  rest = len(a) - 1
  parts = []
  mid_lo, mid_hi = int(a[0]), int(b[0])
  if a[1:] != "0" * rest:
    parts.append(ir.concat(ir.Bytes(a[:1].encode()), _same_length(a[1:], "9" * rest)))
    mid_lo += 1
  if b[1:] != "9" * rest:
    mid_hi -= 1
  if mid_lo <= mid_hi:
    parts.append(ir.concat(_digit_range(mid_lo, mid_hi), ir.repeat(_DIGIT, rest, rest)))
  if b[1:] != "9" * rest:
    parts.append(ir.concat(ir.Bytes(b[:1].encode()), _same_length("0" * rest, b[1:])))
  return ir.union(*parts)


def _natural_range(lo: int, hi: int | None) -> ir.Node:
  """Canonical decimals (no leading zeros) of the integers in [lo, hi], 0 <= lo."""
  if hi is not None and lo > hi:
    return ir.NOTHING
  parts = []
  top = len(str(hi)) if hi is not None else len(str(lo))
  for n in range(len(str(lo)), top + 1):
    a = max(lo, 10 ** (n - 1) if n > 1 else 0)
    b = 10**n - 1 if hi is None else min(hi, 10**n - 1)
    parts.append(_same_length(str(a), str(b)))
  if hi is None:  # Every longer number: a nonzero digit and at least `top` more.
    parts.append(ir.concat(_NONZERO_DIGIT, ir.repeat(_DIGIT, top, None)))
  return ir.union(*parts)


def integer_range(lo: int | None, hi: int | None) -> ir.Node:
  """Canonical decimal integers n with lo <= n <= hi (None: unbounded on that side).

  Exact: the language is `{str(n) : lo <= n <= hi}` (no `+`, no leading zeros, no
  `-0`); its size is linear in the number of digits of the bounds.
  """
  if lo is not None and hi is not None and lo > hi:
    return ir.NOTHING
  parts = []
  if hi is None or hi >= 0:
    parts.append(_natural_range(max(lo, 0) if lo is not None else 0, hi))
  if lo is None or lo < 0:
    magnitude_lo = 1 if hi is None or hi >= 0 else -hi
    parts.append(ir.concat(_MINUS, _natural_range(magnitude_lo,
                                                   None if lo is None else -lo)))
  return ir.union(*parts)


_ANY_FRACTION = ir.repeat(_FRACTION, 0, 1)


def decimal_digits(x: fractions.Fraction) -> tuple[int, str]:
  """(integer part, fraction digits without trailing zeros) of a finite decimal x >= 0.

  Raises:
    ValueError: x has no finite decimal expansion (a denominator with a prime factor
      other than 2 and 5); JSON numbers always have one.
  """
  q = x.denominator
  for p in (2, 5):
    while q % p == 0:
      q //= p
  if q != 1:
    raise ValueError(f"{x} has no finite decimal expansion")
  whole, rest = divmod(x.numerator, x.denominator)
  digits = []
  while rest:
    digit, rest = divmod(10 * rest, x.denominator)
    digits.append(str(digit))
  return whole, "".join(digits)


def _fraction_digits(lo, hi, memo: dict) -> tuple[ir.Node, bool]:
  """Digit strings F whose value 0.F is within the bounds, as (the IR of the non-empty
  ones, whether the empty string is one).

  `lo`/`hi` are None (unbounded) or (d, strict): 0.F >= 0.d (> when strict) and
  0.F <= 0.d (<), d without trailing zeros. Digit by digit: a first digit above lo's
  (below hi's) frees the rest from that bound; an equal one passes the rest of d on.
  """
  if lo is not None and not lo[0] and not lo[1]:
    lo = None  # 0.F >= 0 always holds.
  if hi is not None and not hi[0] and hi[1]:
    return ir.NOTHING, False  # 0.F < 0 never does.
  key = (lo, hi)
  if key in memo:
    return memo[key]
  empty_ok = lo is None  # 0 meets every remaining upper bound, and no lower one.
  if lo is None and hi is None:
    node = ir.repeat(_DIGIT, 1, None)
  elif lo is not None and not lo[0] and hi is None:  # Some nonzero digit.
    node = ir.concat(ir.repeat(ir.Bytes(b"0"), 0, None), _NONZERO_DIGIT,
                     ir.repeat(_DIGIT, 0, None))
  elif lo is None and not hi[0]:  # Zeros only.
    node = ir.repeat(ir.Bytes(b"0"), 1, None)
  elif lo is not None and hi is not None and not lo[0] and not hi[0]:
    node = ir.NOTHING  # Nonzero and all zeros.
  else:
    low = int(lo[0][0]) if lo is not None and lo[0] else 0
    high = int(hi[0][0]) if hi is not None and hi[0] else 0 if hi is not None else 9
    by_rest: dict = {}
    for c in range(low if lo is not None else 0, high + 1):
      rest_lo = None if lo is None or c > low else (lo[0][1:], lo[1])
      rest_hi = None if hi is None or c < high else (hi[0][1:], hi[1])
      by_rest.setdefault((rest_lo, rest_hi), []).append(c)
    parts = []
    for (rest_lo, rest_hi), digits in by_rest.items():
      rest, rest_empty = _fraction_digits(rest_lo, rest_hi, memo)
      tail = ir.union(ir.EPSILON, rest) if rest_empty else rest
      parts.append(ir.concat(ir.char_class([(0x30 + d, 0x30 + d) for d in digits]), tail))
    node = ir.union(*parts)
  memo[key] = node, empty_ok
  return memo[key]


def _fraction_part(lo, hi) -> ir.Node:
  """`(.F)?` texts, F within the bounds of `_fraction_digits` (no part: F empty)."""
  digits, empty_ok = _fraction_digits(lo, hi, {})
  dotted = ir.concat(ir.Bytes(b"."), digits)
  return ir.union(ir.EPSILON, dotted) if empty_ok else dotted


def _magnitude(lo: fractions.Fraction, lo_exclusive: bool, hi: fractions.Fraction | None,
               hi_exclusive: bool) -> ir.Node:
  """Decimals `I(.F)?` (canonical I) whose value m satisfies lo <(=) m <(=) hi, lo >= 0.

  The integer part I decides everything but at the bounds' own integer parts, where the
  fraction is compared with the bound's fraction digit by digit (`_fraction_digits`).
  """
  low, low_digits = decimal_digits(lo)
  low_bound = (low_digits, lo_exclusive)
  if hi is None:
    return ir.union(ir.concat(_natural_range(low + 1, None), _ANY_FRACTION),
                    ir.concat(ir.Bytes(str(low).encode()), _fraction_part(low_bound, None)))
  high, high_digits = decimal_digits(hi)
  high_bound = (high_digits, hi_exclusive)
  if low > high:
    return ir.NOTHING
  if low == high:
    return ir.concat(ir.Bytes(str(low).encode()), _fraction_part(low_bound, high_bound))
  return ir.union(ir.concat(_natural_range(low + 1, high - 1), _ANY_FRACTION),
                  ir.concat(ir.Bytes(str(low).encode()), _fraction_part(low_bound, None)),
                  ir.concat(ir.Bytes(str(high).encode()), _fraction_part(None, high_bound)))


def number_range(lo, hi, *, lo_exclusive: bool = False, hi_exclusive: bool = False
                 ) -> ir.Node:
  """Decimal numbers `-?I(.F)?` (no exponent) with value in an interval.

  `lo` and `hi` are ints, `fractions.Fraction`s with a finite decimal expansion (every
  JSON number has one), or None for an unbounded side. Exact for that format: every such
  text whose value v satisfies `lo <= v` (`lo < v` if `lo_exclusive`) and `v <= hi`
  (`v < hi`), except negative zeros (`-0`, `-0.0`).
  """
  lo = None if lo is None else fractions.Fraction(lo)
  hi = None if hi is None else fractions.Fraction(hi)
  parts = []
  if hi is None or hi > 0 or (hi == 0 and not hi_exclusive):
    if lo is None or lo < 0:
      low, low_exclusive = fractions.Fraction(0), False
    else:
      low, low_exclusive = lo, lo_exclusive
    parts.append(_magnitude(low, low_exclusive, hi, hi_exclusive))
  if lo is None or lo < 0:  # v = -m with m > 0.
    if hi is None or hi >= 0:
      m_lo, m_lo_exclusive = fractions.Fraction(0), True
    else:
      m_lo, m_lo_exclusive = -hi, hi_exclusive
    m_hi = None if lo is None else -lo
    parts.append(ir.concat(_MINUS, _magnitude(m_lo, m_lo_exclusive, m_hi, lo_exclusive)))
  return ir.union(*parts)


def multiple_of(step: fractions.Fraction, *, max_states: int = 100_000) -> ir.Node:
  """Decimal texts `-?D+(.D+)?` whose value is an integer multiple of `step` > 0.

  Permissive on form (leading zeros, `-0`): intersect it with a canonical number IR.
  With step = p/q in lowest terms and s its number of decimal places, every multiple
  has at most s significant fraction digits, and x is one exactly when X = x * 10^s
  (an integer) is divisible by D = p * 10^s / q. The automaton reads X's digits
  keeping X mod D; after s fraction digits only zeros may follow, and at the end the
  missing places count as zeros.

  Raises:
    ValueError: step has no finite decimal expansion, or D would exceed `max_states`.
  """
  _, digits = decimal_digits(step)
  places = len(digits)
  divisor = step.numerator * 10**places // step.denominator
  num_states = 2 + divisor * (places + 3)
  if num_states > max_states:
    raise ValueError(f"multipleOf {step} needs {num_states} states")
  # States: 0 start, 1 after '-'; with X mod D = r so far: integer part, f fraction
  # digits read (f = 0..places), and zeros past the places (at least one read).
  def integer(r):
    return 2 + r

  def fraction(r, f):
    return 2 + divisor * (1 + f) + r

  def zeros(r):
    return 2 + divisor * (places + 2) + r

  arcs, finals = [(0, ir.Bytes(b"-"), 1)], []

  def digit_arcs(source, target_of):
    by_target: dict[int, list] = {}
    for d in range(10):
      target = target_of(d)
      if target is not None:
        by_target.setdefault(target, []).append((0x30 + d, 0x30 + d))
    arcs.extend((source, ir.char_class(ranges), target) for target, ranges in by_target.items())

  for source in (0, 1):
    digit_arcs(source, lambda d: integer(d % divisor))
  for r in range(divisor):
    digit_arcs(integer(r), lambda d, r=r: integer((10 * r + d) % divisor))
    arcs.append((integer(r), ir.Bytes(b"."), fraction(r, 0)))
    if r * 10**places % divisor == 0:
      finals.append(integer(r))
    for f in range(places):
      digit_arcs(fraction(r, f), lambda d, r=r, f=f: fraction((10 * r + d) % divisor, f + 1))
    for f in range(1, places + 1):
      if r * 10**(places - f) % divisor == 0:
        finals.append(fraction(r, f))
    arcs += [(fraction(r, places), ir.Bytes(b"0"), zeros(r)), (zeros(r), ir.Bytes(b"0"), zeros(r))]
    if r % divisor == 0:
      finals.append(zeros(r))
  return ir.Graph(num_states=num_states, arcs=tuple(arcs), finals=tuple(finals))


# ---- Containers, constants and schema-free JSON. ----


def delimited(open_bracket: bytes, close_bracket: bytes, item: ir.Node, ws: Whitespace,
              min_count: int = 0, max_count: int | None = None) -> ir.Node:
  """`[item, item, ...]` with `min_count..max_count` items, brackets and commas per `ws`."""
  if max_count is not None and max_count < min_count:
    return ir.NOTHING
  parts = []
  if min_count == 0:
    parts.append(ws.empty(open_bracket + close_bracket))
  if max_count is None and item != ir.NOTHING:
    parts.append(separated(ws.open(open_bracket), item, ws.comma, ws.close(close_bracket),
                           max(min_count, 1)))
  elif max_count is not None and max_count >= 1 and item != ir.NOTHING:
    more = ir.repeat(ir.concat(ws.comma, item), max(min_count - 1, 0), max_count - 1)
    parts.append(ir.concat(ws.open(open_bracket), item, more, ws.close(close_bracket)))
  return ir.union(*parts) if parts else ir.NOTHING


# The `count` bound of a register counter without an upper bound (the largest int32).
UNBOUNDED_COUNT = 2**31 - 1


def counted_comma(ws: Whitespace, count: ir.Marker) -> ir.Node:
  """`ws.comma` with the register marker `count` right before the `,` byte (where `]` or
  `}` is the other way on, so a full count is never a dead end)."""
  if ws.name == "single":
    return ir.concat(count, ir.Bytes(b", "))
  return ir.concat(ws.gap, count, ir.Bytes(b","), ws.gap)


def separated(head: ir.Node, item: ir.Node, separator: ir.Node, tail: ir.Node,
              min_count: int = 1) -> ir.Node:
  """`head item (separator item)* tail` with at least `min_count` >= 1 items.

  As an `ir.Graph` whose last item loops back through the separator, so that the item
  is built `min_count` times, not `min_count + 1` (the regex form writes it once before
  and once inside the repetition). Nested containers multiply that saving: schema-free
  JSON of depth 2 compiles to the same automaton from about a quarter of the states.
  """
  arcs = [(0, head, 1)]
  for i in range(1, min_count):  # Items 1..min_count-1, each followed by a separator.
    arcs += [(2 * i - 1, item, 2 * i), (2 * i, separator, 2 * i + 1)]
  last = 2 * min_count - 1  # The state before the looping item.
  arcs += [(last, item, last + 1), (last + 1, separator, last), (last + 1, tail, last + 2)]
  return ir.Graph(num_states=last + 3, arcs=tuple(arcs), finals=(last + 2,))


def const_value(value, ws: Whitespace) -> ir.Node:
  """The JSON text of one Python JSON value under `ws` (objects keep their key order).

  Scalars are written as `json.dumps` writes them (strings canonically), so each value
  has one spelling, except for the whitespace `ws` allows inside containers.

  Raises:
    ValueError: `value` is not JSON (a NaN or infinite float, a set, ...).
  """
  if value is None or isinstance(value, (bool, int, str)):
    return ir.Bytes(json.dumps(value, ensure_ascii=False).encode())
  if isinstance(value, float):
    if not math.isfinite(value):
      raise ValueError(
          f"JSON value {value!r} is not finite. Expected a finite number. JSON has no"
          " NaN or Infinity."
      )
    return ir.Bytes(json.dumps(value).encode())
  if isinstance(value, (list, tuple)):
    if not value:
      return ws.empty(b"[]")
    items = [const_value(v, ws) for v in value]
    return ir.concat(ws.open(b"["), *interleave(items, ws.comma), ws.close(b"]"))
  if isinstance(value, dict):
    if not value:
      return ws.empty(b"{}")
    members = [ir.concat(canonical_string(str(k)), ws.colon, const_value(v, ws))
               for k, v in value.items()]
    return ir.concat(ws.open(b"{"), *interleave(members, ws.comma), ws.close(b"}"))
  raise ValueError(
      f"Value {value!r} of type {type(value).__name__} is not JSON. Expected None, bool,"
      " int, float, str, list or dict."
  )


def interleave(items: list, separator: ir.Node) -> list:
  """`items` with `separator` between consecutive ones."""
  out = []
  for i, item in enumerate(items):
    if i:
      out.append(separator)
    out.append(item)
  return out


_SCALARS = ir.union(json_string(), JSON_NUMBER, JSON_BOOLEAN, JSON_NULL)


def json_value(ws: Whitespace, max_depth: int, *, max_object_depth: int | None = None,
               max_array_depth: int | None = None, root: str = "any") -> ir.Node:
  """Schema-free JSON values with nesting limits (Sec. 5.1: k_O and k_A).

  JSON is context-free; bounding the nesting makes it regular. `max_depth` bounds the
  total nesting of containers (0: scalars only; `{"a": [1]}` has depth 2);
  `max_object_depth` and `max_array_depth` (default: `max_depth`) bound how many
  objects, and arrays, may enclose one another on any path. Object keys are any JSON
  string; keys may repeat (not regular to prevent without bounding the object size).
  `root` (`any`, `object` or `array`) restricts the top-level value.
  """
  objects = max_depth if max_object_depth is None else min(max_object_depth, max_depth)
  arrays = max_depth if max_array_depth is None else min(max_array_depth, max_depth)
  if root == "any":
    return _json_value(ws, max_depth, objects, arrays)
  if root == "object" and max_depth > 0 and objects > 0:
    return _object_of(ws, _json_value(ws, max_depth - 1, objects - 1, arrays))
  if root == "array" and max_depth > 0 and arrays > 0:
    return delimited(b"[", b"]", _json_value(ws, max_depth - 1, objects, arrays - 1), ws)
  return ir.NOTHING


def json_value_rule(ws: Whitespace, name: str) -> ir.Node:
  """The body of a grammar rule `name` of schema-free JSON values that nests through
  `ir.RuleRef(name)`: JSON itself, context-free, its nesting bounded only by the
  device stack (`CompileOptions.stack_depth`), unlike `json_value`."""
  value = ir.RuleRef(name)
  return ir.union(_SCALARS, delimited(b"[", b"]", value, ws), _object_of(ws, value))


def json_value_fragment(ws: Whitespace, max_depth: int, *, leading_gap: bool = False
                        ) -> ir.Fragment:
  """`json_value(ws, max_depth)` as an `ir.Fragment`: compilers compose it with their
  vocabulary once and splice it into every constraint using it (`automata/_splice.py`).

  `leading_gap` puts the whitespace `ws` allows before the value (`ws.gap`) inside the
  fragment: a spliced fragment must start where nothing but it may be read.
  """
  body = json_value(ws, max_depth)
  if leading_gap and ws.gap != ir.EPSILON:
    return ir.Fragment(f"json-value/{ws.name}/{ws.max_run}/{max_depth}/gap",
                       ir.concat(ws.gap, body))
  return ir.Fragment(f"json-value/{ws.name}/{ws.max_run}/{max_depth}", body)


def _object_of(ws: Whitespace, value: ir.Node) -> ir.Node:
  return delimited(b"{", b"}", ir.concat(json_string(), ws.colon, value), ws)


@functools.lru_cache(maxsize=1024)
def _json_value(ws: Whitespace, depth: int, objects: int, arrays: int) -> ir.Node:
  parts = [_SCALARS]
  if depth > 0 and arrays > 0:
    parts.append(delimited(b"[", b"]", _json_value(ws, depth - 1, objects, arrays - 1), ws))
  if depth > 0 and objects > 0:
    parts.append(_object_of(ws, _json_value(ws, depth - 1, objects - 1, arrays)))
  return ir.union(*parts)

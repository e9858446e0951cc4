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
  json_value(ws, max_depth, ...)      schema-free JSON with bounded nesting.
  json_value_rule(ws, name)           schema-free JSON as a grammar rule (unbounded).
  json_value_inline(ws, name, levels) the same language, `levels` deep inline, then calls.
  json_value_fragment(ws, max_depth)  the same as a shared `ir.Fragment` (spliced by compilers).
  const_value(value, ws)              one Python JSON value, serialized under `ws`.
  delimited(open, close, item, ws, min_count, max_count)  `[item, item, ...]`-style lists.
  separated(head, item, separator, tail, min_count)      the same, as a looping `ir.Graph`.
Constants: JSON_BOOLEAN, JSON_NULL, STRING_CHAR, UNICODE_ESCAPE, SURROGATE_PAIR_ESCAPE.
Numbers (`JSON_NUMBER`, `JSON_INTEGER`, integer and decimal ranges, `multipleOf`) are in
`_json_numbers`.

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
import functools
import json
import math

from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints._json_numbers import JSON_NUMBER

WHITESPACE_POLICIES = ("compact", "single", "flexible")
_JSON_WHITESPACE = ir.char_class([(0x20, 0x20), (0x09, 0x0A), (0x0D, 0x0D)])

_HEX = ir.char_class([(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)])

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
  return json_value_inline(ws, name, 1)


@functools.lru_cache(maxsize=1024)
def json_value_inline(ws: Whitespace, name: str, levels: int) -> ir.Node:
  """Schema-free JSON values written inline `levels` containers deep, each value below
  a call `ir.RuleRef(name)` of the rule `json_value_rule(ws, name)`: the same language
  as that call (0 levels: the call itself). `_json_free_form_align` writes free-form
  values so where they compete with inline values of another branch."""
  if levels == 0:
    return ir.RuleRef(name)
  value = json_value_inline(ws, name, levels - 1)
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

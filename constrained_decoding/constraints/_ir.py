"""The constraint IR: a tiny algebra of byte languages that every front end lowers to.

Front ends (regex, JSON Schema, dataclasses, grammars) build these nodes; only
`automata/` turns them into pynini automata. Nodes are frozen, hashable dataclasses, so
sub-expressions can be cached and specs compared.

Nodes (each denotes a set of byte strings):
  Bytes(data)            the single string `data` (b"" is the empty string).
  CharClass(ranges)      one Unicode scalar value from `ranges`, encoded as UTF-8.
  ByteClass(ranges)      one raw byte from `ranges` (for non-text constraints).
  Concat(parts)          concatenation.
  Union(alternatives)    union; `Union(())` is the empty language.
  Repeat(node, min, max) `node` repeated min..max times (`max=None`: unbounded).
  Terminal(name, arg)    exactly one token of the token class `name` (Sec. 2.5.1), one of
                         TOKEN_CLASSES; a token-level atom, not a byte language.
  Graph(n, arcs, finals) an automaton given directly, its arcs labelled by nodes: for
                         sugar whose regex would be quadratic (Sec. 2.5.2).
  RuleRef(name)          the language of grammar rule `name`; only inside a `GrammarIR`
                         (`constraints/_grammar.py`), never compiled directly.
  Fragment(name, body)   the language of `body`, marked as a part that many constraints
                         share (schema-free JSON values): the compiler may build its
                         token automaton once per vocabulary and splice in copies.
"""

import dataclasses
from typing import Union as _TypingUnion

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


@dataclasses.dataclass(frozen=True)
class Bytes:
  """The language {data}."""

  data: bytes


@dataclasses.dataclass(frozen=True)
class CharClass:
  """One Unicode scalar value in `ranges`, as UTF-8 bytes.

  `ranges` are inclusive `(lo, hi)` code point pairs, sorted, disjoint and
  non-adjacent, containing no surrogates (use `char_class` to normalize).
  """

  ranges: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class ByteClass:
  """One byte whose value lies in `ranges` (inclusive pairs within 0..255)."""

  ranges: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Concat:
  """Concatenation of `parts`, in order."""

  parts: tuple["Node", ...]


@dataclasses.dataclass(frozen=True)
class Union:
  """Union of `alternatives`; the empty union is the empty language."""

  alternatives: tuple["Node", ...]


@dataclasses.dataclass(frozen=True)
class Repeat:
  """`node` repeated between `min` and `max` times (`max=None` for no upper bound)."""

  node: "Node"
  min: int
  max: int | None


@dataclasses.dataclass(frozen=True)
class Terminal:
  """Exactly one token of the token class `name` (one of `TOKEN_CLASSES`).

  A token-level atom (Sec. 2.5.1's `TEXT_TOKEN`, `PARAGRAPH_TOKEN`): it stands for one
  whole token, not for bytes, so the back end turns it into a token-class arc that
  composition makes a terminal edge. `argument` is reserved for parametrized classes.
  """

  name: str
  argument: str = ""


@dataclasses.dataclass(frozen=True)
class Graph:
  """An automaton given directly: state 0 is the start, arcs are labelled by IR nodes.

  The language is the union, over paths from state 0 to a state in `finals`, of the
  concatenation of the arc labels' languages. Front ends use it for sugar whose regex
  form would be much larger than its automaton (a suffix automaton is O(n), the regex
  of all substrings O(n^2)); the back end embeds it as is.

  Attributes:
    num_states: Number of states, numbered 0..num_states-1.
    arcs: (source, label, target) triples.
    finals: The accepting states.
  """

  num_states: int
  arcs: tuple[tuple[int, "Node", int], ...]
  finals: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RuleRef:
  """A reference to the grammar rule `name` (Alg. 3's non-terminals).

  Meaningful only inside a `GrammarIR`, whose analyses inline or unroll it; the byte
  automaton back end does not accept it.
  """

  name: str


@dataclasses.dataclass(frozen=True)
class Fragment:
  """The language of `body`, as a part whose token automaton may be shared.

  Byte-wise a fragment is just `body`. It marks a sub-language that appears in many
  constraints (an additional property's schema-free JSON value), so that the compiler
  may compose it with the vocabulary once and splice a copy into each automaton
  (`automata/_splice.py`) instead of composing it again every time.

  Attributes:
    name: Identifies `body`: fragments with one name must have equal bodies (equality
      and hashing use the name only, so that large bodies are never hashed).
    body: The language.
  """

  name: str
  body: "Node" = dataclasses.field(compare=False, repr=False)


Node = _TypingUnion[Bytes, CharClass, ByteClass, Concat, Union, Repeat, Terminal, Graph,
                    RuleRef, Fragment]

# Token classes of `Terminal` nodes, in precedence order: when a token belongs to several
# classes allowed in one state, the terminal edge of the earlier class is followed
# (explicit token edges come before all of them). Narrower classes come first.
TOKEN_CLASSES = ("PARAGRAPH_TOKEN", "TEXT_TOKEN")

EPSILON = Bytes(b"")
NOTHING = Union(())


def normalize_ranges(
    ranges, *, limit: int = MAX_CODE_POINT, exclude_surrogates: bool = True
) -> tuple[tuple[int, int], ...]:
  """Sorts, clips and merges inclusive `(lo, hi)` ranges; drops surrogates if asked."""
  pieces = []
  for lo, hi in ranges:
    lo, hi = max(0, lo), min(limit, hi)
    if lo > hi:
      continue
    if exclude_surrogates and lo <= SURROGATES[1] and hi >= SURROGATES[0]:
      if lo < SURROGATES[0]:
        pieces.append((lo, SURROGATES[0] - 1))
      if hi > SURROGATES[1]:
        pieces.append((SURROGATES[1] + 1, hi))
    else:
      pieces.append((lo, hi))
  pieces.sort()
  merged: list[tuple[int, int]] = []
  for lo, hi in pieces:
    if merged and lo <= merged[-1][1] + 1:
      merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
    else:
      merged.append((lo, hi))
  return tuple(merged)


def complement_ranges(
    ranges: tuple[tuple[int, int], ...], *, limit: int = MAX_CODE_POINT
) -> tuple[tuple[int, int], ...]:
  """The code points (or bytes, with `limit=255`) in 0..limit not in normalized `ranges`."""
  out = []
  nxt = 0
  for lo, hi in ranges:
    if lo > nxt:
      out.append((nxt, lo - 1))
    nxt = hi + 1
  if nxt <= limit:
    out.append((nxt, limit))
  return normalize_ranges(out, limit=limit, exclude_surrogates=limit == MAX_CODE_POINT)


def char_class(ranges) -> CharClass:
  """A normalized `CharClass` from any iterable of inclusive code point ranges."""
  return CharClass(normalize_ranges(ranges))


def byte_class(ranges) -> ByteClass:
  """A normalized `ByteClass` from any iterable of inclusive byte ranges."""
  return ByteClass(normalize_ranges(ranges, limit=255, exclude_surrogates=False))


def concat(*parts: Node) -> Node:
  """Concatenation, flattening nested `Concat`s and dropping empty strings."""
  flat: list[Node] = []
  for part in parts:
    if isinstance(part, Concat):
      flat.extend(part.parts)
    elif part != EPSILON:
      flat.append(part)
  if any(p == NOTHING for p in flat):
    return NOTHING
  if len(flat) == 1:
    return flat[0]
  return Concat(tuple(flat))


def union(*alternatives: Node) -> Node:
  """Union, flattening nested `Union`s and dropping duplicates (order kept)."""
  flat: list[Node] = []
  for alt in alternatives:
    for a in alt.alternatives if isinstance(alt, Union) else (alt,):
      if a not in flat:
        flat.append(a)
  if len(flat) == 1:
    return flat[0]
  return Union(tuple(flat))


def repeat(node: Node, min_count: int, max_count: int | None) -> Node:
  """`node{min_count,max_count}`, with the trivial cases simplified."""
  if max_count is not None and max_count < min_count:
    raise ValueError(f"Repeat bounds {{{min_count},{max_count}}} have max < min.")
  if max_count == 0 or node == EPSILON:
    return EPSILON
  if min_count == max_count == 1:
    return node
  return Repeat(node, min_count, max_count)


def inline_fragments(node: Node) -> Node:
  """`node` with every `Fragment` replaced by its body (for analyses that do not know
  fragments, such as the grammar builder's)."""
  memo: dict[int, tuple[Node, Node]] = {}

  def walk(n: Node) -> Node:
    hit = memo.get(id(n))
    if hit is not None:
      return hit[1]
    out = n  # Unchanged unless a fragment is inside.
    if isinstance(n, Fragment):
      out = walk(n.body)
    elif isinstance(n, Concat):
      parts = [walk(p) for p in n.parts]
      if any(a is not b for a, b in zip(parts, n.parts)):
        out = concat(*parts)
    elif isinstance(n, Union):
      alternatives = [walk(a) for a in n.alternatives]
      if any(a is not b for a, b in zip(alternatives, n.alternatives)):
        out = union(*alternatives)
    elif isinstance(n, Repeat):
      inner = walk(n.node)
      if inner is not n.node:
        out = repeat(inner, n.min, n.max)
    elif isinstance(n, Graph):
      labels = [walk(label) for _, label, _ in n.arcs]
      if any(a is not label for a, (_, label, _) in zip(labels, n.arcs)):
        out = Graph(n.num_states, tuple((a, new, b) for (a, _, b), new in zip(n.arcs, labels)),
                    n.finals)
    memo[id(n)] = (n, out)  # Keeps `n` alive so that its id stays unique.
    return out

  return walk(node)

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
  Marker(kind, word, operand)  the empty string, plus an operation on a per-row register
                         word that the device applies and checks when a token crosses
                         this point (`automata/_registers.py`: objects in any order).

Walking the IR (every pass that visits sub-nodes goes through these, so that all agree
on what a node's sub-nodes are):
  children(node)                      the direct sub-nodes (graph arc labels and fragment
                                      bodies included).
  rebuild(node, children)             the same node over new children (itself if none
                                      changed).
  transform(node, fn, before=...)     a memoized bottom-up rewrite (with an optional
                                      top-down replacement).
  inline_fragments(node)              every `Fragment` replaced by its body.
"""

import contextlib
import dataclasses
import gc
from typing import Union as _TypingUnion

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


def _hash_once(node, fields: tuple) -> int:
  """`hash(fields)`, the value the dataclass's own `__hash__` gives, kept on `node`.

  Nodes are immutable, and the dataclass hash of a node hashes its whole sub-tree every
  time: a dict key holding a nested object (the front end's register blocks, `lru_cache`d
  analyses) cost the size of every object below it, per level as objects nest. Inner
  nodes compute it once (same value, so dict and set orders do not change); the cache
  is left out when pickling (`__getstate__`): string hashes differ between processes.
  """
  value = hash(fields)
  object.__setattr__(node, "_hash", value)
  return value


def _state_without_hash(node) -> dict:
  return {k: v for k, v in node.__dict__.items() if k != "_hash"}


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

  def __hash__(self) -> int:
    return self.__dict__.get("_hash") or _hash_once(self, (self.parts,))

  __getstate__ = _state_without_hash


@dataclasses.dataclass(frozen=True)
class Union:
  """Union of `alternatives`; the empty union is the empty language."""

  alternatives: tuple["Node", ...]

  def __hash__(self) -> int:
    return self.__dict__.get("_hash") or _hash_once(self, (self.alternatives,))

  __getstate__ = _state_without_hash


@dataclasses.dataclass(frozen=True)
class Repeat:
  """`node` repeated between `min` and `max` times (`max=None` for no upper bound)."""

  node: "Node"
  min: int
  max: int | None

  def __hash__(self) -> int:
    return self.__dict__.get("_hash") or _hash_once(self, (self.node, self.min, self.max))

  __getstate__ = _state_without_hash


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

  def __hash__(self) -> int:
    return self.__dict__.get("_hash") or _hash_once(self, (self.num_states, self.arcs,
                                                           self.finals))

  __getstate__ = _state_without_hash


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


@dataclasses.dataclass(frozen=True)
class Marker:
  """The empty string, marked with an operation on register word `word` of a row.

  Byte-wise a marker is epsilon; to the automaton it is one more symbol (so determinization
  keeps the paths it separates apart), which the compiler turns into an operation on the
  token edges that cross it (`automata/_registers.py`). Kinds (`operand` a bit mask):
    "clear"  word := 0.
    "set"    allowed only if the bits are clear in the word; then sets them (a key
             written at most once).
    "need"   allowed only if all the bits are set (required keys, before `}`).
  and, with `operand` a number (arrays whose items are counted, `maxItems`):
    "count"  allowed only if the word is below `operand`; then adds 1 to it.
    "atleast"  allowed only if the word is at least `operand`.
  and, for arrays of distinct strings (`automata/_unique_strings.py`), `word` the first
  word of a block of hashes:
    "uopen"  before the opening quote of a string item (operand 0).
    "uclose" before its closing quote: allowed only if the item differs from the items
             before it, and fewer than `operand` of them were written.
  """

  kind: str
  word: int
  operand: int


MARKER_KINDS = ("clear", "set", "need", "count", "atleast", "uopen", "uclose")

Node = _TypingUnion[Bytes, CharClass, ByteClass, Concat, Union, Repeat, Terminal, Graph,
                    RuleRef, Fragment, Marker]

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


# ---------------------------------------------------------------------------------------
# One generic walk, so that every pass agrees on what a node's sub-nodes are.


@contextlib.contextmanager
def gc_paused():
  """Pauses the cyclic garbage collector (restored as it was after), around work that
  allocates many small acyclic objects: memo entries and tuples of a walk, an NFA's
  lists. Each 700 allocations start a collection that finds nothing, and the rarer
  older-generation ones walk every object the process holds (a fold over the corpus's
  byte-DFA roots: 55 -> 25 ms CPU paused)."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


def children(node: Node) -> tuple[Node, ...]:
  """The direct sub-nodes of `node`, in order; `()` for leaves.

  Every node type is covered, so that a pass built on this walk cannot silently skip a
  language: a `Graph`'s children are its arc labels (in arc order) and a `Fragment`'s
  child is its body. Analyses (sizes, searches, reference sets) see through fragments;
  rewriting a fragment's body is another matter (see `rebuild` and `transform`).

  Raises:
    TypeError: `node` is not an IR node (a new node type must be added here).
  """
  get = _CHILDREN.get(type(node))  # The common case, without the `match` below.
  if get is not None:
    return get(node)
  match node:
    case Concat(parts):
      return parts
    case Union(alternatives):
      return alternatives
    case Repeat():
      return (node.node,)
    case Graph():
      return tuple(label for _, label, _ in node.arcs)
    case Fragment():
      return (node.body,)
    case Bytes() | CharClass() | ByteClass() | Terminal() | RuleRef() | Marker():
      return ()
    case _:
      raise TypeError(f"Expected an IR node, got {node!r} instead.")


def _no_children(node) -> tuple:
  del node
  return ()


# `children` by exact type (subclasses go through its `match`).
_CHILDREN = {
    Concat: lambda node: node.parts,
    Union: lambda node: node.alternatives,
    Repeat: lambda node: (node.node,),
    Fragment: lambda node: (node.body,),
    Bytes: _no_children, CharClass: _no_children, ByteClass: _no_children,
    Terminal: _no_children, RuleRef: _no_children, Marker: _no_children,
}


def rebuild(node: Node, new_children, *, allow_fragment_body_change: bool = False) -> Node:
  """`node` with its `children` replaced by `new_children` (same number, same order).

  Returns `node` itself when every new child is the old child object, so that passes
  preserve sharing and identity where nothing changed. The rebuilt node uses the plain
  constructors (no flattening or simplification): `children(rebuild(n, c)) == c`.

  A `Fragment` names its body, and fragments with one name must have equal bodies
  (`Fragment`'s docstring), so a fragment is rebuilt with a different body only when
  `allow_fragment_body_change` is set: by a caller that then removes the fragment (as
  `inline_fragments` does) or vouches that the new body has the same language.

  Raises:
    ValueError: The number of children differs, or a fragment's body would change
      without `allow_fragment_body_change`.
  """
  new_children = tuple(new_children)
  old_children = children(node)
  if len(new_children) != len(old_children):
    raise ValueError(
        f"Expected {len(old_children)} children to rebuild {type(node).__name__}, got"
        f" {len(new_children)} instead.")
  if all(new is old for new, old in zip(new_children, old_children)):
    return node
  match node:
    case Concat():
      return Concat(new_children)
    case Union():
      return Union(new_children)
    case Repeat():
      return Repeat(new_children[0], node.min, node.max)
    case Graph():
      arcs = tuple((source, label, target)
                   for (source, _, target), label in zip(node.arcs, new_children))
      return Graph(node.num_states, arcs, node.finals)
    case Fragment():
      if not allow_fragment_body_change:
        raise ValueError(
            f"Fragment {node.name!r} would keep its name with a different body. Expected"
            " an unchanged body, since fragments with one name share one automaton. Pass"
            " allow_fragment_body_change=True only when the fragment is then removed.")
      return Fragment(node.name, new_children[0])
  raise AssertionError(f"{type(node).__name__} has children but no rebuild case.")


def rebuild_simplified(node: Node, new_children, *, make_concat=None, make_union=None,
                       make_repeat=None) -> Node:
  """`rebuild`, but a changed `Concat`, `Union` or `Repeat` goes through `concat`,
  `union` or `repeat` (flattening, dropping empty strings and duplicates), or through
  the given replacements for them (a pass with its own simplifications)."""
  new_children = tuple(new_children)
  if all(new is old for new, old in zip(new_children, children(node))):
    return node
  match node:
    case Concat():
      return (make_concat or concat)(*new_children)
    case Union():
      return (make_union or union)(*new_children)
    case Repeat():
      return (make_repeat or repeat)(new_children[0], node.min, node.max)
  return rebuild(node, new_children)


def transform(node: Node, fn=None, *, before=None, build=rebuild,
              enter_fragments: bool = False, memo: dict | None = None) -> Node:
  """`node` rewritten bottom-up: `fn` applied to each sub-node after its children.

  For each node `n` (post-order), the children are transformed first, `n` is rebuilt
  from them with `build` (which returns `n` itself when no child changed), and `fn` is
  applied to the rebuilt node; its result replaces `n`. Shared sub-trees are visited
  once per call (memoized by object identity), so they stay shared in the result, and
  a tree in which nothing changes comes back as the very same object.

  Args:
    node: The root.
    fn: Node -> node, applied to every (rebuilt) node; None for the identity.
    before: Optional node -> node or None, applied top-down before `n`'s children are
      visited: a node it returns is `n`'s result as is (neither the children nor `fn`
      see `n`); None goes on with the bottom-up rewrite. For passes that replace whole
      sub-trees by looking at them as they were written.
    build: `rebuild` (plain constructors) or a variant with the same contract, such as
      `rebuild_simplified`.
    enter_fragments: Whether fragment bodies are rewritten too. By default a `Fragment`
      is a leaf here: its name stands for its body, so a changed body under the same
      name would be a different language sharing one automaton. When set, a fragment
      is rebuilt around its transformed body under its name and `fn` must deal with it
      (typically by returning the body, as `inline_fragments` does).
    memo: A dict to share between calls with the same `fn`, `before` and `build`, so
      that sub-trees shared between several roots are rewritten once; fresh by default.

  Returns:
    The rewritten node.
  """
  memo = {} if memo is None else memo
  children_of = _CHILDREN.get

  def walk(n: Node) -> Node:
    hit = memo.get(id(n))
    if hit is not None:
      return hit[1]
    out = None if before is None else before(n)
    if out is None:
      if isinstance(n, Fragment):
        rebuilt = (rebuild(n, (walk(n.body),), allow_fragment_body_change=True)
                   if enter_fragments else n)
      else:
        get = children_of(type(n))
        old = children(n) if get is None else get(n)
        rebuilt = n  # `build` returns `n` itself when no child changed: skip the call.
        if old:
          new = [walk(c) for c in old]
          for a, b in zip(new, old):
            if a is not b:
              rebuilt = build(n, tuple(new))
              break
      out = rebuilt if fn is None else fn(rebuilt)
    memo[id(n)] = (n, out)  # Keeps `n` alive so that its id stays unique.
    return out

  with gc_paused():
    return walk(node)


def fold(node: Node, fn, *, enter_fragments: bool = False, memo: dict | None = None):
  """`fn(n, values of n's children)` computed bottom-up, once per distinct sub-tree.

  Shared sub-trees are visited once (memoized by object identity), so a measure that
  counts a shared part once per occurrence (sizes, copies) takes time linear in the
  distinct nodes, not in the paths through the tree. A `Fragment`'s child is its body
  only with `enter_fragments`. `memo` may be shared between calls with the same `fn`
  and `enter_fragments` (a front end measuring each object as it nests them), so that
  a sub-tree is measured once in all; fresh by default.
  """
  memo = {} if memo is None else memo
  lookup, children_of = memo.get, _CHILDREN.get

  def walk(n: Node):
    hit = lookup(id(n))
    if hit is not None:
      return hit[1]
    kind = type(n)
    get = children_of(kind)
    if kind is Fragment or get is None and isinstance(n, Fragment):
      values = (walk(n.body),) if enter_fragments else ()
    else:
      kids = children(n) if get is None else get(n)
      values = tuple(map(walk, kids)) if kids else ()
    out = fn(n, values)
    memo[id(n)] = (n, out)  # Keeps `n` alive so that its id stays unique.
    return out

  # `gc_paused` inlined: a front end folds thousands of small trees per schema.
  enabled = gc.isenabled()
  gc.disable()
  try:
    return walk(node)
  finally:
    if enabled:
      gc.enable()


def inline_fragments(node: Node) -> Node:
  """`node` with every `Fragment` replaced by its body (for analyses that do not know
  fragments, such as the grammar builder's)."""
  return transform(node, _fragment_body, build=rebuild_simplified, enter_fragments=True)


def _fragment_body(node: Node) -> Node:
  return node.body if isinstance(node, Fragment) else node

"""Constraint IR -> epsilon-NFA over byte ranges, in plain Python lists (no pynini here).

The first half of `_fsa.compile_byte_dfa`: the NFA is built by one adder per IR node
type (`build_nfa`), its few epsilon arcs removed (`remove_epsilons`) and its ranges cut
into byte classes (`byte_classes`: maximal byte ranges no range splits); `_nfa_pack.py`
packs it as the bytes `pywrapfst.Fst.read_from_string` parses in one call, and `_fsa.py`
determinizes, minimizes and exports it.
States that spell equal suffixes into one state are built once (`Nfa.cons`: the tails
of alternatives, a string's `\\uXXXX` escapes, literals' endings, UTF-8 continuation
bytes), and loops inside a concatenation start at its own state (`_add_repeat`): equal
states that determinization would keep apart, so OpenFst does ~40% less work.

Labels: byte `b` is the value b and label b + 1 (OpenFst reserves label 0 for epsilon).
A token-level `ir.Terminal` (class j of `ir.TOKEN_CLASSES`) is the pseudo-byte
`TOKEN_CLASS_BASE + j`; kept fragments and register markers are pseudo-bytes from
`FRAGMENT_BASE` on, numbered in the order the NFA meets them (`Nfa.pseudo`).

Public names:
  Nfa, build_nfa(node, fragments, share)  the NFA of an IR node (start 0, final 1).
  nfa_size(node, fragments)        about how many states `build_nfa` would create.
  remove_epsilons(nfa)             in place; returns the final states.
  byte_classes(bounds)             the class edges of an NFA's `bounds`.
  BYTE_EDGES, TOKEN_CLASS_BASE, FRAGMENT_BASE, EPSILON_LABEL  the label layout.
"""

import functools

from constrained_decoding import errors
from constrained_decoding.automata._utf8 import utf8_sequences
from constrained_decoding.constraints import _ir as ir

EPSILON_LABEL = 0
# One class per byte (label b + 1 is byte b) and per token class (label 257 + j).
BYTE_EDGES = list(range(257 + len(ir.TOKEN_CLASSES)))
TOKEN_CLASS_BASE = 256  # Token class j is the pseudo-byte 256 + j.
# Fragment k of a compile is the pseudo-byte 256 + len(TOKEN_CLASSES) + k.
FRAGMENT_BASE = TOKEN_CLASS_BASE + len(ir.TOKEN_CLASSES)


class Nfa:
  """An epsilon-NFA over byte ranges under construction.

  State 0 is the start and state 1 the final state. Ranges become labels only when
  packing, either one label per byte or one per byte class (`_nfa_pack.pack_bytes`).

  Attributes:
    arcs: `arcs[s]` is the flat list `[lo, hi, next, lo, hi, next, ...]` of the arcs
      leaving `s`, one per byte range `lo..hi`.
    epsilons: `epsilons[s]` lists the targets of the epsilon arcs leaving `s`.
    bounds: Every `lo` and `hi + 1` of a range: the edges of the byte classes.
  """

  __slots__ = ("arcs", "epsilons", "bounds", "keep_fragments", "pseudo", "cons")

  def __init__(self, fragments: bool = False, share: bool = True):
    self.arcs: list[list[int]] = [[], []]
    self.epsilons: dict[int, list[int]] = {}
    self.bounds = {0, 256}
    # Whether fragments become pseudo-bytes (else their bodies are inlined).
    self.keep_fragments = fragments
    # Pseudo-byte index of each kept fragment and marker: label FRAGMENT_BASE + index.
    self.pseudo: dict = {}
    # Shared states, by what they spell and the state they go on to: `(type, data or
    # ranges, next)` of a leaf part, `(part, next)` of another node (by value) -> the
    # state before a concatenation's part (`_add_concat`), and
    # `(next << 8) | byte` -> a literal's state whose only arc is `byte` to `next`
    # (`_add_bytes`). A state's right language depends on nothing else, so sharing it
    # keeps the language; determinizing and minimizing get ~30% fewer states and arcs.
    self.cons: dict = {} if share else _NoSharing()

  def pseudo_label(self, node) -> int:
    """The label of the pseudo-byte standing for `node` (a kept fragment, a marker)."""
    return FRAGMENT_BASE + self.pseudo.setdefault(node, len(self.pseudo))

  def new_state(self) -> int:
    self.arcs.append([])
    return len(self.arcs) - 1

  def add_epsilon(self, src: int, dst: int) -> None:
    if src != dst:
      self.epsilons.setdefault(src, []).append(dst)

  def add_range(self, src: int, lo: int, hi: int, dst: int) -> None:
    self.arcs[src] += (lo, hi, dst)
    self.bounds.add(lo)
    self.bounds.add(hi + 1)


class _NoSharing(dict):
  """`Nfa.cons` of an NFA built without shared states (a reference for tests)."""

  def get(self, key, default=None):
    return default


def remove_epsilons(nfa: Nfa) -> set[int]:
  """Removes the epsilon arcs in place; returns the final states.

  Each state with epsilon arcs gets the byte arcs of every state in its epsilon
  closure, and is final if the closure holds the final state 1. Regexes have few
  epsilons (optional and starred parts), so this beats a call to OpenFst's rmepsilon.
  """
  finals = {1}
  epsilons = nfa.epsilons
  if not epsilons:
    return finals
  arcs = nfa.arcs
  own = [len(a) for a in arcs]  # Arcs before any copying.
  for state in list(epsilons):
    closure = {state}
    stack = [state]
    while stack:
      for target in epsilons.get(stack.pop(), ()):
        if target not in closure:
          closure.add(target)
          stack.append(target)
    closure.discard(state)
    for other in closure:
      arcs[state] += arcs[other][: own[other]]
    if 1 in closure:
      finals.add(state)
  epsilons.clear()
  return finals


def byte_classes(bounds) -> list[int]:
  """The sorted edges of the byte classes: class k holds bytes `edges[k]..edges[k+1]-1`.

  Every range of the NFA is a union of whole classes, so the DFA over class labels,
  read through `byte -> class`, is the DFA over bytes, with far fewer arcs (a `\\d`
  is one to five classes, a UTF-8 continuation range one) for OpenFst to process.
  """
  return sorted(bounds)


def _add_char_class(nfa: Nfa, node: ir.CharClass, src: int, dst: int) -> None:
  """Adds paths src -> dst spelling the UTF-8 encoding of each scalar value of `node`.

  States are shared between sequences with the same byte-range suffix (all the
  `[80-BF]` continuation tails), so large Unicode classes stay small before minimization;
  and with other classes into the same dst (`Nfa.cons`), as a string's first character
  and its other characters are.
  """
  ranges = node.ranges
  if ranges and ranges[-1][1] < 0x80:  # ASCII only: one arc per range (inlined).
    arcs, bounds = nfa.arcs[src], nfa.bounds
    for lo, hi in ranges:
      arcs += (lo, hi, dst)
      bounds.add(lo)
      bounds.add(hi + 1)
    return
  _, state_arcs, bounds, suffixes = _char_class_template(ranges)
  arcs, cons = nfa.arcs, nfa.cons
  # Template state k >= 2 spells suffixes[k - 2] into dst: an existing state, or a new one.
  state_of = [src, dst]
  fresh = [False, False]
  for suffix in suffixes:
    key = (suffix, dst)
    state = cons.get(key)
    fresh.append(state is None)
    if state is None:
      state = cons[key] = len(arcs)
      arcs.append([])
    state_of.append(state)
  for k, flat in state_arcs:
    if k >= 2 and not fresh[k]:  # Its arcs are there already.
      continue
    out = list(flat)
    for i in range(2, len(out), 3):  # Every third entry is a template state.
      out[i] = state_of[out[i]]
    arcs[state_of[k]] += out
  nfa.bounds |= bounds


@functools.lru_cache(maxsize=1024)
def _char_class_template(ranges: tuple[tuple[int, int], ...]):
  """The UTF-8 automaton of a non-ASCII class, built once per class (a pure function).

  Returns:
    (number of new states, [(state, flat arcs [lo, hi, next, ...])], byte bounds,
    suffixes), with the class built between states 0 (src) and 1 (dst), new states
    numbered from 2, and new state k spelling the byte ranges `suffixes[k - 2]` into 1.
  """
  nfa = Nfa()
  suffix_states: dict[tuple, int] = {}

  def state_for(suffix: tuple) -> int:
    state = suffix_states.get(suffix)
    if state is None:
      state = suffix_states[suffix] = nfa.new_state()
      target = 1 if len(suffix) == 1 else state_for(suffix[1:])
      nfa.add_range(state, *suffix[0], target)
    return state

  for lo, hi in ranges:
    if hi < 0x80:
      nfa.add_range(0, lo, hi, 1)
      continue
    for seq in utf8_sequences(lo, hi):
      target = 1 if len(seq) == 1 else state_for(seq[1:])
      nfa.add_range(0, *seq[0], target)
  state_arcs = tuple((k, tuple(a)) for k, a in enumerate(nfa.arcs) if a)
  suffixes = [None] * (len(nfa.arcs) - 2)
  for suffix, state in suffix_states.items():
    suffixes[state - 2] = ("utf8",) + tuple(suffix)
  return len(nfa.arcs) - 2, state_arcs, frozenset(nfa.bounds), tuple(suffixes)


def _add_bytes(nfa: Nfa, node: ir.Bytes, src: int, dst: int) -> None:
  """Adds the literal `node.data` from src to dst as a chain built from its end, each
  state after the first byte shared with every chain that spells the same suffix into
  the same state (`Nfa.cons`)."""
  data = node.data
  if not data:
    nfa.add_epsilon(src, dst)
    return
  arcs, bounds, cons = nfa.arcs, nfa.bounds, nfa.cons
  nxt = dst
  for i in range(len(data) - 1, 0, -1):
    b = data[i]
    key = (nxt << 8) | b
    state = cons.get(key)
    if state is None:
      state = cons[key] = len(arcs)
      arcs.append([b, b, nxt])
      bounds.add(b)
      bounds.add(b + 1)
    nxt = state
  b = data[0]
  arcs[src] += (b, b, nxt)
  bounds.add(b)
  bounds.add(b + 1)


def _add_byte_class(nfa: Nfa, node: ir.ByteClass, src: int, dst: int) -> None:
  for lo, hi in node.ranges:
    nfa.add_range(src, lo, hi, dst)


def _add_concat(nfa: Nfa, node: ir.Concat, src: int, dst: int) -> None:
  parts = node.parts
  if not parts:
    nfa.add_epsilon(src, dst)
    return
  if _REPEAT in map(type, parts):
    loops = _separated_lists(parts)
    if loops:
      _add_concat_with_loops(nfa, parts, loops, src, dst)
      return
  # The state before part i spells parts[i:] into dst whatever leads to it, so it is
  # shared with every concatenation that has an equal suffix into the same state
  # (`Nfa.cons`): the longest such suffix is looked up from the end, and only the parts
  # before it are built, from the start (pseudo-bytes keep their order of appearance).
  # Parts are keyed by value (leaves by their data, other nodes by their cached hash and
  # `==`): equal sub-trees built as separate objects (a definition lowered at each use)
  # share too (12% fewer NFA states on the corpus). The adders of one byte and of ASCII
  # classes are inlined: one corpus pass builds ~16k concatenations.
  cons = nfa.cons
  nxt = dst
  i = len(parts) - 1
  while i:
    part = parts[i]
    key = _cons_key(part, nxt)
    state = cons.get(key)
    if state is None:
      break
    nxt = state
    i -= 1
  arcs = nfa.arcs
  before = len(arcs) - 1  # Part k >= 1 starts at the fresh state before + k.
  if i:
    arcs += [[] for _ in range(i)]
    cons[key] = before + i
    for k in range(i - 1, 0, -1):
      cons[_cons_key(parts[k], before + k + 1)] = before + k
  adders, bounds = _ADDERS, nfa.bounds
  state = src
  for k in range(i + 1):
    part = parts[k]
    target = before + k + 1 if k < i else nxt
    kind = type(part)
    if kind is _BYTES and len(part.data) == 1:
      b = part.data[0]
      arcs[state] += (b, b, target)
      bounds.add(b)
      bounds.add(b + 1)
    elif kind is _CHAR_CLASS and part.ranges and part.ranges[-1][1] < 0x80:
      out = arcs[state]
      for lo, hi in part.ranges:
        out += (lo, hi, target)
        bounds.add(lo)
        bounds.add(hi + 1)
    elif kind is _REPEAT and k:  # Only part k leaves its fresh state.
      _add_repeat(nfa, part, state, target, True)
    else:
      adders.get(kind, _add_unknown)(nfa, part, state, target)
    state = target


def _cons_key(part, nxt: int):
  """`Nfa.cons`'s key of the state that spells `part` and then goes on as `nxt`: leaves
  by their data, other nodes by value (their cached hash and `==`)."""
  kind = type(part)
  if kind is _BYTES:
    return (kind, part.data, nxt)
  if kind is _CHAR_CLASS or kind is _BYTE_CLASS:
    return (kind, part.ranges, nxt)
  return (part, nxt)


_BYTES, _CHAR_CLASS, _BYTE_CLASS, _REPEAT = ir.Bytes, ir.CharClass, ir.ByteClass, ir.Repeat


def _separated_lists(parts: tuple) -> dict[int, tuple[int, tuple]]:
  """Where `parts` spell a separated list `X (Y X)*` (JSON members and items): first
  index of X -> (number of parts in X, the parts of Y). Found by X's parts being (equal
  to) the last parts of the starred concatenation that follows them."""
  found = {}
  for j, part in enumerate(parts):
    if (type(part) is ir.Repeat and part.min == 0 and part.max is None
        and type(part.node) is ir.Concat):
      inner = part.node.parts
      for k in range(min(j, len(inner) - 1), 0, -1):
        if all(a is b or a == b for a, b in zip(parts[j - k:j], inner[-k:])):
          found[j - k] = (k, inner[:-k])
          break
  return found


def _add_concat_with_loops(nfa: Nfa, parts: tuple, loops: dict, src: int, dst: int) -> None:
  """`_add_concat` building each separated list `X (Y X)*` as one loop a -X-> b -Y-> a
  (b left for dst), with one copy of X instead of two. The language is the same; the
  NFA is smaller, and much smaller for nested objects, whose members were copied twice
  per level: determinizing and minimizing it is several times faster (k8s_deployment:
  35,146 determinized states for 1,574 minimal ones before, 3,631 now)."""
  state, i, last = src, 0, len(parts) - 1
  while i <= last:
    k, separator = loops.get(i, (0, ()))
    end = i + k  # The last part consumed: the starred repeat, or part i itself.
    nxt = dst if end == last else nfa.new_state()
    if not k:
      if i and type(parts[i]) is ir.Repeat:  # Only part i leaves its fresh state.
        _add_repeat(nfa, parts[i], state, nxt, True)
      else:
        _add_node(nfa, parts[i], state, nxt)
    else:
      # The loop closes on fresh states; a fresh state of ours may be its entry.
      leave = nfa.new_state()
      if i:
        enter = state
      else:
        enter = nfa.new_state()
        nfa.add_epsilon(state, enter)
      _add_node(nfa, ir.Concat(parts[i:end]) if k > 1 else parts[i], enter, leave)
      _add_node(nfa, ir.Concat(separator), leave, enter)
      nfa.add_epsilon(leave, nxt)
    state, i = nxt, end + 1


def _add_union(nfa: Nfa, node: ir.Union, src: int, dst: int) -> None:
  adders = _ADDERS
  for alternative in node.alternatives:
    adders.get(type(alternative), _add_unknown)(nfa, alternative, src, dst)


def _add_repeat(nfa: Nfa, node: ir.Repeat, src: int, dst: int, own_src: bool = False
                ) -> None:
  """Adds `body{min,max}` (max None: unbounded) between src and dst.

  With `own_src` (a concatenation's inner state: no other node adds arcs leaving src),
  an unbounded loop starts at src itself instead of at a fresh state entered by an
  epsilon, and `x*` is one state looping on x: the two states that both meant "more x,
  or go on" (before the loop and after each x) were equal, and so was every state of x
  that led to one or the other, which determinization kept apart.
  """
  body, min_count, max_count = node.node, node.min, node.max
  state = src
  if max_count is None:
    # x{m,} = x^(m-1) x+: one copy fewer than x^m x*.
    for _ in range(max(min_count - 1, 0)):
      nxt = nfa.new_state()
      _add_node(nfa, body, state, nxt)
      state = nxt
      own_src = True  # A fresh state: only the loop leaves it.
    if own_src and min_count == 0:
      _add_node(nfa, body, state, state)
      nfa.add_epsilon(state, dst)
      return
    if own_src:
      loop_in = state
    else:
      loop_in = nfa.new_state()
      nfa.add_epsilon(state, loop_in)
    loop_out = nfa.new_state()
    _add_node(nfa, body, loop_in, loop_out)
    nfa.add_epsilon(loop_out, loop_in)
    nfa.add_epsilon(loop_out, dst)
    if min_count == 0:
      nfa.add_epsilon(state, dst)
    return
  # x{m,n} = x^m (eps | x (eps | x (...))): one optional copy per extra repetition.
  for i in range(max_count):
    nxt = dst if i == max_count - 1 else nfa.new_state()
    if i >= min_count:
      nfa.add_epsilon(state, dst)
    _add_node(nfa, body, state, nxt)
    state = nxt
  if max_count == 0:
    nfa.add_epsilon(src, dst)


def _add_terminal(nfa: Nfa, node: ir.Terminal, src: int, dst: int) -> None:
  """Adds the token-class arc src --class--> dst (the pseudo-byte 256 + class index)."""
  if node.name not in ir.TOKEN_CLASSES or node.argument:
    raise errors.UnsupportedFeatureError(
        f"Terminal {node.name!r} (argument {node.argument!r}) is not a token class."
        f" Expected one of {', '.join(ir.TOKEN_CLASSES)} without an argument; byte-level"
        " labels such as QUOTED_TEXT lower to bytes and classes instead."
    )
  label = TOKEN_CLASS_BASE + ir.TOKEN_CLASSES.index(node.name)
  nfa.add_range(src, label, label, dst)


def _add_fragment(nfa: Nfa, node: ir.Fragment, src: int, dst: int) -> None:
  """Adds the fragment's body, or its pseudo-byte arc when the NFA keeps fragments."""
  if not nfa.keep_fragments:
    _add_node(nfa, node.body, src, dst)
    return
  label = nfa.pseudo_label(node)
  nfa.add_range(src, label, label, dst)


def _add_marker(nfa: Nfa, node: ir.Marker, src: int, dst: int) -> None:
  """Adds the marker's pseudo-byte arc (`marker_arcs` once exported)."""
  if node.kind not in ir.MARKER_KINDS:
    raise ValueError(f"Expected a marker kind in {ir.MARKER_KINDS}, got {node.kind!r}.")
  label = nfa.pseudo_label(node)
  nfa.add_range(src, label, label, dst)


def _add_graph(nfa: Nfa, node: ir.Graph, src: int, dst: int) -> None:
  """Embeds the automaton `node` between src and dst through fresh states.

  Its states get fresh NFA states (entered from src and left to dst by epsilons), so
  arcs coming back to its start state cannot leak into the surrounding automaton.
  """
  states = [nfa.new_state() for _ in range(node.num_states)]
  nfa.add_epsilon(src, states[0])
  adders = _ADDERS
  for a, label, b in node.arcs:
    adders.get(type(label), _add_unknown)(nfa, label, states[a], states[b])
  for final in node.finals:
    nfa.add_epsilon(states[final], dst)


_ADDERS = {
    ir.Bytes: _add_bytes,
    ir.CharClass: _add_char_class,
    ir.ByteClass: _add_byte_class,
    ir.Concat: _add_concat,
    ir.Union: _add_union,
    ir.Repeat: _add_repeat,
    ir.Terminal: _add_terminal,
    ir.Graph: _add_graph,
    ir.Fragment: _add_fragment,
    ir.Marker: _add_marker,
}


def _add_unknown(nfa: Nfa, node, src: int, dst: int) -> None:
  del nfa, src, dst  # Unused.
  raise TypeError(f"Expected a constraint IR node, got {node!r} instead.")


def _add_node(nfa: Nfa, node: ir.Node, src: int, dst: int) -> None:
  """Adds paths src -> dst spelling exactly the language of `node`.

  Invariant that makes shared endpoints safe (unions build every alternative between
  the same two states): a call only adds arcs leaving `src` or entering `dst`, and
  every loop goes through fresh states. (Hot loops call `_ADDERS` directly.)
  """
  _ADDERS.get(type(node), _add_unknown)(nfa, node, src, dst)


def nfa_size(node: ir.Node, fragments: bool = False) -> int:
  """About how many NFA states `build_nfa(node, fragments)` creates, without building it.

  Counts what the adders create (a repeat's body once per copy, a `Graph`'s states, a
  non-ASCII class's template; separated lists as if X were built twice, so budgets do
  not depend on `_separated_lists`), in time linear in the number of distinct IR nodes: a
  budget check that trips in milliseconds where building the NFA of, say, 200 nested
  copies of 200 copies of an object would run for minutes and exhaust memory.

  Its own walk rather than `ir.fold` (same values, same sub-nodes: `ir.children`): it
  runs on every compile, and leaves, most of the nodes, are sized without a memo entry
  or a call per node (corpus roots: 48 -> 20 ms CPU); the parts of a concatenation or
  union are sized in its own loop, without a call per leaf (32k of the 55k sizes of one
  corpus pass), and the memo holds bare sizes (the 42 roots of a pass: 24.6 -> 16.8 ms).
  """
  # By id, without keeping the node alive: every node sized is a sub-node of `node`,
  # immutable and held by it for the whole call, so no id is reused meanwhile.
  memo: dict[int, int] = {}
  enter = not fragments
  concat, union, repeat, graph = ir.Concat, ir.Union, ir.Repeat, ir.Graph
  leaf_size = _LEAF_SIZE.get
  literal, char_class, zero = ir.Bytes, ir.CharClass, _ZERO_SIZE
  template = _char_class_template

  def size(n) -> int:
    total = memo.get(id(n))
    if total is not None:
      return total
    kind = type(n)
    if kind is concat or kind is union:
      if kind is concat:
        parts = n.parts
        total = len(parts) - 1 if parts else 0
      else:
        parts = n.alternatives
        total = 0
      for part in parts:  # `_LEAF_SIZE`, inlined.
        kind = type(part)
        if kind is literal:
          data = part.data
          if data:
            total += len(data) - 1
        elif kind is char_class:
          ranges = part.ranges
          if ranges and ranges[-1][1] >= 0x80:
            total += template(ranges)[0]
        elif kind not in zero:
          total += size(part)
    elif kind is repeat:
      copies = max(n.min, 1) if n.max is None else n.max
      total = 2 + copies * (size(n.node) + 1)
    elif kind is graph:
      total = n.num_states
      for _, label, _ in n.arcs:
        total += size(label)
    elif kind is ir.Fragment:
      total = size(n.body) if enter else 0
    else:
      leaf = leaf_size(kind)
      if leaf is not None:
        return leaf(n)
      # A subclass, or not a node (`ir.fold` raises the TypeError).
      total = ir.fold(n, _size_of, enter_fragments=enter)
    memo[id(n)] = total
    return total

  with ir.gc_paused():
    return 2 + size(node)


def _size_of(n: ir.Node, children: tuple) -> int:
  """`nfa_size`'s measure of one node from its children's (as an `ir.fold` function)."""
  match n:
    case ir.Bytes(data):
      return max(len(data) - 1, 0)
    case ir.CharClass():
      return _char_class_size(n)
    case ir.Concat(parts):
      return max(len(parts) - 1, 0) + sum(children)
    case ir.Repeat(_, low, high):
      return 2 + (max(low, 1) if high is None else high) * (children[0] + 1)
    case ir.Graph(num_states, _, _):
      return num_states + sum(children)
    case _:  # Union; a Fragment's body (counted only when entered); leaves.
      return sum(children)


def _char_class_size(node: ir.CharClass) -> int:
  ranges = node.ranges
  return 0 if not ranges or ranges[-1][1] < 0x80 else _char_class_template(ranges)[0]


# `nfa_size` of the leaf types (by exact type; subclasses go through `ir.fold`).
_ZERO_SIZE = frozenset((ir.ByteClass, ir.Terminal, ir.RuleRef, ir.Marker))
_LEAF_SIZE = {
    ir.Bytes: lambda n: max(len(n.data) - 1, 0),
    ir.CharClass: _char_class_size,
    **{kind: lambda n: 0 for kind in _ZERO_SIZE},
}


def build_nfa(node: ir.Node, fragments: bool = False, share: bool = True) -> Nfa:
  """The epsilon-NFA of `node` from state 0 to state 1; with `fragments`, each distinct
  `ir.Fragment` is one pseudo-byte arc instead of its body; without `share`, no state is
  shared (`Nfa.cons`), so that it has `nfa_size`'s states.

  Raises:
    UnsupportedFeatureError: `node` contains a `Terminal` that is not a token class.
  """
  nfa = Nfa(fragments, share)
  _add_node(nfa, node, 0, 1)
  return nfa


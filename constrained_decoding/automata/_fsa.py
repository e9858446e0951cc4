"""Constraint IR -> pynini acceptor -> minimal `ByteDfa`: the only place IR meets pynini.

Labels: an acceptor over bytes in which byte `b` carries label `b + 1`, because
OpenFst reserves label 0 for epsilon. Unicode classes become UTF-8 byte automata.
A token-level `ir.Terminal` (one whole token of a class of `ir.TOKEN_CLASSES`) is one
more symbol: class j is the pseudo-byte 256 + j (label 257 + j), so determinization and
minimization treat it like any byte, and the exported `ByteDfa` lists it in
`token_arcs`. An `ir.Graph` is embedded state for state between fresh NFA states. An
`ir.Fragment` is its body, or, when the caller asks (`compile_byte_dfa(node,
fragments=True)`), one more pseudo-byte per distinct fragment, exported as
`fragment_arcs` for `_splice.py` to replace with a copy of the fragment's automaton.
An `ir.Marker` (a register operation, `_registers.py`) is one more pseudo-byte in the
same numbering as fragments, exported as `marker_arcs`.

Public functions:
  utf8_sequences(lo, hi)  (from `_utf8`) the UTF-8 byte-range sequences of lo..hi.
  ir_to_fst(node)         an (epsilon-)NFA acceptor for the IR node, as a `pynini.Fst`.
  fst_to_byte_dfa(fst)    rmepsilon + determinize + minimize, exported as a `ByteDfa`.
  compile_byte_dfa(node)  the same DFA as `fst_to_byte_dfa(ir_to_fst(node))`, faster.

Speed matters (a regex is compiled per request; the budget is a fraction of a
millisecond), so `compile_byte_dfa`:
  * builds the NFA over byte *ranges* in plain Python lists and removes its few
    epsilon arcs there;
  * labels arcs with byte classes (maximal byte ranges that no NFA range splits)
    rather than bytes, so OpenFst handles a `\\d` as 1-5 arcs instead of 10;
  * hands the NFA to OpenFst in one piece, as the binary `vector` format parsed by
    `read_from_string` (about 2x faster than `add_arc` per arc, loops included), packed
    with numpy when the NFA is large;
  * builds the UTF-8 automaton of each non-ASCII class once per process (a cached
    template, copied into the NFA);
  * skips determinization when the NFA is already deterministic (`Red|Blue|...`);
  * reads the minimal DFA back by converting it to the `const` format, whose
    fixed-size records numpy parses without a Python loop over states or arcs, and
    keeps the byte classes in the `ByteDfa` (`class_edges`) for later analyses.

`tests/automata/fsa_test.py` checks these fast paths against the plain pipeline.
States are numbered breadth-first from the start, arcs in byte order, so that equal
languages give equal tables whatever IR, NFA or OpenFst numbering they came from
(`tests/automata/fsa_canonical_test.py`); `class_edges` still come from the NFA.
"""

import functools
import itertools
import struct

import numpy as np
import pynini
import pywrapfst

from constrained_decoding import errors
from constrained_decoding.automata import _byte_dfa
from constrained_decoding.automata._utf8 import utf8_sequences  # re-exported
from constrained_decoding.constraints import _ir as ir

EPSILON_LABEL = 0
# Most states subset construction may create before giving up with a typed error: an
# ambiguous repetition such as `(a|b)*a(a|b){20}` doubles them per count (2^21 here),
# and determinizing without a bound would run for minutes and exhaust memory.
MAX_DETERMINIZED_STATES = 100_000

_MAGIC = 2125659606  # OpenFst's binary FST magic number.
_FILE_VERSION = 2  # VectorFst file version.
# kExpanded | kMutable | kAcceptor: what `VectorFst` itself would set for our NFA.
# The other property bits stay "unknown", so OpenFst computes them when it needs them.
_NFA_PROPERTIES = 0x1 | 0x2 | 0x10000
# Tropical weights: Zero (inf) marks a non-final state; One (0.0, the word 0) is the
# weight of every arc and of final states.
_ZERO = float("inf")
_INF_BITS = 0x7F800000  # `_ZERO` as the bits of a little-endian float32.


def _string_field(text: bytes) -> bytes:
  return struct.pack("<i", len(text)) + text


# Magic, fst type, arc type, version, flags (0: no symbol tables); then come the
# properties (uint64), start, number of states and number of arcs (int64 each).
_HEADER_PREFIX = (
    struct.pack("<i", _MAGIC)
    + _string_field(b"vector")
    + _string_field(b"standard")
    + struct.pack("<ii", _FILE_VERSION, 0)
)
# The same for the `const` format, and its fixed-size state record (ConstFst::State).
_CONST_HEADER_PREFIX = (
    struct.pack("<i", _MAGIC)
    + _string_field(b"const")
    + _string_field(b"standard")
    + struct.pack("<ii", _FILE_VERSION, 0)
)
_CONST_STATE = np.dtype([
    ("final", "<f4"), ("first_arc", "<u4"), ("num_arcs", "<u4"),
    ("num_input_epsilons", "<u4"), ("num_output_epsilons", "<u4"),
])

class _Nfa:
  """An epsilon-NFA over byte ranges under construction.

  State 0 is the start and state 1 the final state. Ranges become labels only when
  packing, either one label per byte or one per byte class (see `_pack_bytes`).

  Attributes:
    arcs: `arcs[s]` is the flat list `[lo, hi, next, lo, hi, next, ...]` of the arcs
      leaving `s`, one per byte range `lo..hi`.
    epsilons: `epsilons[s]` lists the targets of the epsilon arcs leaving `s`.
    bounds: Every `lo` and `hi + 1` of a range: the edges of the byte classes.
  """

  __slots__ = ("arcs", "epsilons", "bounds", "keep_fragments", "pseudo")

  def __init__(self, fragments: bool = False):
    self.arcs: list[list[int]] = [[], []]
    self.epsilons: dict[int, list[int]] = {}
    self.bounds = {0, 256}
    # Whether fragments become pseudo-bytes (else their bodies are inlined).
    self.keep_fragments = fragments
    # Pseudo-byte index of each kept fragment and marker: label _FRAGMENT_BASE + index.
    self.pseudo: dict = {}

  def pseudo_label(self, node) -> int:
    """The label of the pseudo-byte standing for `node` (a kept fragment, a marker)."""
    return _FRAGMENT_BASE + self.pseudo.setdefault(node, len(self.pseudo))

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


def _remove_epsilons(nfa: _Nfa) -> set[int]:
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


def _byte_classes(bounds) -> list[int]:
  """The sorted edges of the byte classes: class k holds bytes `edges[k]..edges[k+1]-1`.

  Every range of the NFA is a union of whole classes, so the DFA over class labels,
  read through `byte -> class`, is the DFA over bytes, with far fewer arcs (a `\\d`
  is one to five classes, a UTF-8 continuation range one) for OpenFst to process.
  """
  return sorted(bounds)


def _pack_bytes(nfa: _Nfa, edges: list[int], finals) -> tuple[bytes, bool]:
  """The NFA in OpenFst's binary `vector` format, label `k + 1` meaning class `k`.

  `read_from_string` parses this in one C++ call, about twice as fast as `add_arc`.
  Every field of a state record is one or two 32-bit words (weights are float32, the
  arc count an int64), so the records are packed as one list of ints: weight One (0.0)
  is the word 0 and Zero (inf) is `_INF_BITS`.

  Returns:
    The bytes, and whether the NFA is already deterministic (no epsilon arcs, no
    label twice on one state), in which case determinization can be skipped.
  """
  if not nfa.epsilons and len(nfa.arcs) >= 64:  # Below that, numpy's overhead loses.
    return _pack_bytes_numpy(nfa, edges, finals)
  class_of = {edge: k for k, edge in enumerate(edges)}
  words: list[int] = []  # `words += tuple` is cheaper than a `words.extend` call.
  epsilons = nfa.epsilons
  deterministic = not epsilons
  for state, arcs in enumerate(nfa.arcs):
    final = 0 if state in finals else _INF_BITS
    num_ranges = len(arcs)
    if num_ranges == 3 and state not in epsilons:  # Fast path: one arc, one class.
      lo, hi, dst = arcs
      label = class_of[lo] + 1
      if label == class_of[hi + 1]:
        words += (final, 1, 0, label, label, 0, dst)
        continue
    header = len(words)
    words += (final, 0, 0)
    for target in epsilons.get(state, ()):
      words += (EPSILON_LABEL, EPSILON_LABEL, 0, target)
    for k in range(0, num_ranges, 3):
      dst = arcs[k + 2]
      first, last = class_of[arcs[k]] + 1, class_of[arcs[k + 1] + 1]
      if first == last:
        words += (first, first, 0, dst)
      else:
        for label in range(first, last + 1):
          words += (label, label, 0, dst)
    count = (len(words) - header - 3) // 4
    words[header + 1] = count
    # Deterministic: no label twice among the state's arcs (one set per state).
    if deterministic and count > 1 and len(set(words[header + 3::4])) != count:
      deterministic = False
  num_arcs = (len(words) - 3 * len(nfa.arcs)) // 4
  header = _HEADER_PREFIX + struct.pack(
      "<Qqqq", _NFA_PROPERTIES, 0, len(nfa.arcs), num_arcs
  )
  # `struct.pack` converts a list of ints faster than `array` or numpy do.
  return header + struct.pack(f"<{len(words)}i", *words), deterministic


def _pack_bytes_numpy(nfa: _Nfa, edges: list[int], finals) -> tuple[bytes, bool]:
  """`_pack_bytes` for an NFA without epsilon arcs, with numpy instead of a loop per arc.

  The same bytes: state records in state order, each the final weight, the arc count
  (int64) and the arcs `(label, label, weight One, next)` in the order of the state's
  ranges, labels ascending within a range.
  """
  arcs = nfa.arcs
  num_states = len(arcs)
  per_state = np.fromiter(map(len, arcs), np.int64, num_states) // 3
  flat = np.fromiter(itertools.chain.from_iterable(arcs), np.int64, 3 * int(per_state.sum()))
  bounds = np.asarray(edges, np.int64)
  first = np.searchsorted(bounds, flat[0::3]) + 1  # Label of the class of lo.
  last = np.searchsorted(bounds, flat[1::3] + 1)  # Label of the class ending at hi.
  labels_per_range = last - first + 1
  range_state = np.repeat(np.arange(num_states), per_state)
  ends = np.cumsum(labels_per_range)
  num_arcs = int(ends[-1]) if len(ends) else 0
  label = np.repeat(first - (ends - labels_per_range), labels_per_range) + np.arange(num_arcs)
  arc_state = np.repeat(range_state, labels_per_range)
  arc_count = np.bincount(arc_state, minlength=num_states)
  # State s's record starts after 3 words per earlier state and 4 per earlier arc.
  arcs_before = np.cumsum(arc_count) - arc_count
  start = 3 * np.arange(num_states) + 4 * arcs_before
  words = np.zeros(3 * num_states + 4 * num_arcs, np.int32)
  words[start] = _INF_BITS
  final_states = np.fromiter(finals, np.int64)
  words[start[final_states[final_states < num_states]]] = 0
  words[start + 1] = arc_count
  arc_at = 3 * (arc_state + 1) + 4 * np.arange(num_arcs)
  words[arc_at] = label
  words[arc_at + 1] = label
  words[arc_at + 3] = np.repeat(flat[2::3], labels_per_range)
  # Deterministic: no state has two arcs with one label.
  key = arc_state * (len(edges) + 1) + label
  if num_states * (len(edges) + 1) <= 1 << 22:
    deterministic = num_arcs == 0 or int(np.bincount(key).max()) <= 1
  else:
    key.sort()
    deterministic = not (key[1:] == key[:-1]).any()
  header = _HEADER_PREFIX + struct.pack("<Qqqq", _NFA_PROPERTIES, 0, num_states, num_arcs)
  return header + words.astype("<i4", copy=False).tobytes(), deterministic


# One class per byte (label b + 1 is byte b) and per token class (label 257 + j).
_BYTE_EDGES = list(range(257 + len(ir.TOKEN_CLASSES)))
_TOKEN_CLASS_BASE = 256  # Token class j is the pseudo-byte 256 + j.
# Fragment k of a compile is the pseudo-byte 256 + len(TOKEN_CLASSES) + k.
_FRAGMENT_BASE = _TOKEN_CLASS_BASE + len(ir.TOKEN_CLASSES)


def _add_char_class(nfa: _Nfa, node: ir.CharClass, src: int, dst: int) -> None:
  """Adds paths src -> dst spelling the UTF-8 encoding of each scalar value of `node`.

  States are shared between sequences with the same byte-range suffix (all the
  `[80-BF]` continuation tails), so large Unicode classes stay small before minimization.
  """
  ranges = node.ranges
  if ranges and ranges[-1][1] < 0x80:  # ASCII only: one arc per range (inlined).
    arcs, bounds = nfa.arcs[src], nfa.bounds
    for lo, hi in ranges:
      arcs += (lo, hi, dst)
      bounds.add(lo)
      bounds.add(hi + 1)
    return
  num_new, state_arcs, bounds = _char_class_template(ranges)
  arcs = nfa.arcs
  base = len(arcs) - 2  # Template state k >= 2 is NFA state base + k.
  arcs.extend([] for _ in range(num_new))
  state_of = (src, dst)
  for k, flat in state_arcs:
    out = list(flat)
    for i in range(2, len(out), 3):  # Every third entry is a template state.
      x = out[i]
      out[i] = state_of[x] if x < 2 else base + x
    arcs[state_of[k] if k < 2 else base + k] += out
  nfa.bounds |= bounds


@functools.lru_cache(maxsize=1024)
def _char_class_template(ranges: tuple[tuple[int, int], ...]):
  """The UTF-8 automaton of a non-ASCII class, built once per class (a pure function).

  Returns:
    (number of new states, [(state, flat arcs [lo, hi, next, ...])], byte bounds), with
    the class built between states 0 (src) and 1 (dst) and new states numbered from 2.
  """
  nfa = _Nfa()
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
  return len(nfa.arcs) - 2, state_arcs, frozenset(nfa.bounds)


def _add_bytes(nfa: _Nfa, node: ir.Bytes, src: int, dst: int) -> None:
  data = node.data
  if not data:
    nfa.add_epsilon(src, dst)
    return
  arcs, bounds = nfa.arcs, nfa.bounds
  state = src
  last = len(data) - 1
  for i, b in enumerate(data):
    if i == last:
      nxt = dst
    else:
      nxt = len(arcs)
      arcs.append([])
    arcs[state] += (b, b, nxt)
    bounds.add(b)
    bounds.add(b + 1)
    state = nxt


def _add_byte_class(nfa: _Nfa, node: ir.ByteClass, src: int, dst: int) -> None:
  for lo, hi in node.ranges:
    nfa.add_range(src, lo, hi, dst)


def _add_concat(nfa: _Nfa, node: ir.Concat, src: int, dst: int) -> None:
  parts = node.parts
  if not parts:
    nfa.add_epsilon(src, dst)
    return
  state = src
  last = len(parts) - 1
  adders = _ADDERS
  loops = _separated_lists(parts) if ir.Repeat in map(type, parts) else None
  if loops:
    _add_concat_with_loops(nfa, parts, loops, src, dst)
    return
  for i, part in enumerate(parts):
    nxt = dst if i == last else nfa.new_state()
    adders.get(type(part), _add_unknown)(nfa, part, state, nxt)
    state = nxt


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


def _add_concat_with_loops(nfa: _Nfa, parts: tuple, loops: dict, src: int, dst: int) -> None:
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
      _add_node(nfa, parts[i], state, nxt)
    else:
      enter, leave = nfa.new_state(), nfa.new_state()  # Fresh: the loop closes on them.
      nfa.add_epsilon(state, enter)
      _add_node(nfa, ir.Concat(parts[i:end]) if k > 1 else parts[i], enter, leave)
      _add_node(nfa, ir.Concat(separator), leave, enter)
      nfa.add_epsilon(leave, nxt)
    state, i = nxt, end + 1


def _add_union(nfa: _Nfa, node: ir.Union, src: int, dst: int) -> None:
  adders = _ADDERS
  for alternative in node.alternatives:
    adders.get(type(alternative), _add_unknown)(nfa, alternative, src, dst)


def _add_repeat(nfa: _Nfa, node: ir.Repeat, src: int, dst: int) -> None:
  """Adds `body{min,max}` (max None: unbounded) between src and dst."""
  body, min_count, max_count = node.node, node.min, node.max
  state = src
  if max_count is None:
    # x{m,} = x^(m-1) x+: one copy fewer than x^m x*.
    for _ in range(max(min_count - 1, 0)):
      nxt = nfa.new_state()
      _add_node(nfa, body, state, nxt)
      state = nxt
    loop_in, loop_out = nfa.new_state(), nfa.new_state()
    nfa.add_epsilon(state, loop_in)
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


def _add_terminal(nfa: _Nfa, node: ir.Terminal, src: int, dst: int) -> None:
  """Adds the token-class arc src --class--> dst (the pseudo-byte 256 + class index)."""
  if node.name not in ir.TOKEN_CLASSES or node.argument:
    raise errors.UnsupportedFeatureError(
        f"Terminal {node.name!r} (argument {node.argument!r}) is not a token class."
        f" Expected one of {', '.join(ir.TOKEN_CLASSES)} without an argument; byte-level"
        " labels such as QUOTED_TEXT lower to bytes and classes instead."
    )
  label = _TOKEN_CLASS_BASE + ir.TOKEN_CLASSES.index(node.name)
  nfa.add_range(src, label, label, dst)


def _add_fragment(nfa: _Nfa, node: ir.Fragment, src: int, dst: int) -> None:
  """Adds the fragment's body, or its pseudo-byte arc when the NFA keeps fragments."""
  if not nfa.keep_fragments:
    _add_node(nfa, node.body, src, dst)
    return
  label = nfa.pseudo_label(node)
  nfa.add_range(src, label, label, dst)


def _add_marker(nfa: _Nfa, node: ir.Marker, src: int, dst: int) -> None:
  """Adds the marker's pseudo-byte arc (`marker_arcs` once exported)."""
  if node.kind not in ir.MARKER_KINDS:
    raise ValueError(f"Expected a marker kind in {ir.MARKER_KINDS}, got {node.kind!r}.")
  label = nfa.pseudo_label(node)
  nfa.add_range(src, label, label, dst)


def _add_graph(nfa: _Nfa, node: ir.Graph, src: int, dst: int) -> None:
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


def _add_unknown(nfa: _Nfa, node, src: int, dst: int) -> None:
  del nfa, src, dst  # Unused.
  raise TypeError(f"Expected a constraint IR node, got {node!r} instead.")


def _add_node(nfa: _Nfa, node: ir.Node, src: int, dst: int) -> None:
  """Adds paths src -> dst spelling exactly the language of `node`.

  Invariant that makes shared endpoints safe (unions build every alternative between
  the same two states): a call only adds arcs leaving `src` or entering `dst`, and
  every loop goes through fresh states. (Hot loops call `_ADDERS` directly.)
  """
  _ADDERS.get(type(node), _add_unknown)(nfa, node, src, dst)


def nfa_size(node: ir.Node, fragments: bool = False) -> int:
  """About how many NFA states `_build_nfa(node, fragments)` creates, without building it.

  Counts what the adders create (a repeat's body once per copy, a `Graph`'s states, a
  non-ASCII class's template; separated lists as if X were built twice, so budgets do
  not depend on `_separated_lists`), in time linear in the number of distinct IR nodes: a
  budget check that trips in milliseconds where building the NFA of, say, 200 nested
  copies of 200 copies of an object would run for minutes and exhaust memory.
  """
  def size(n: ir.Node, children: tuple) -> int:
    match n:
      case ir.Bytes(data):
        return max(len(data) - 1, 0)
      case ir.CharClass(ranges):
        return 0 if not ranges or ranges[-1][1] < 0x80 else _char_class_template(ranges)[0]
      case ir.Concat(parts):
        return max(len(parts) - 1, 0) + sum(children)
      case ir.Repeat(_, low, high):
        return 2 + (max(low, 1) if high is None else high) * (children[0] + 1)
      case ir.Graph(num_states, _, _):
        return num_states + sum(children)
      case _:  # Union; a Fragment's body (counted only when entered); leaves.
        return sum(children)

  return 2 + ir.fold(node, size, enter_fragments=not fragments)


def _build_nfa(node: ir.Node, fragments: bool = False) -> _Nfa:
  nfa = _Nfa(fragments)
  _add_node(nfa, node, 0, 1)
  return nfa


def ir_to_fst(node: ir.Node) -> pynini.Fst:
  """An acceptor for the language of `node` (byte b has label b + 1, token class j 257 + j).

  The result may contain epsilon arcs and be nondeterministic; `fst_to_byte_dfa`
  cleans it up.

  Raises:
    UnsupportedFeatureError: `node` contains a `Terminal` that is not a token class.
  """
  data, _ = _pack_bytes(_build_nfa(node), _BYTE_EDGES, {1})
  return pynini.Fst.read_from_string(data)


def _minimize(
    fst: pywrapfst.MutableFst, *, has_epsilons: bool = True, deterministic: bool = False
) -> pywrapfst.Fst:
  """rmepsilon, determinize and minimize (which also trims); may modify `fst`.

  Plain `pywrapfst` functions, not pynini's wrappers: the result never leaves this
  module, and they skip pynini's per-call conversions.

  Args:
    fst: An acceptor.
    has_epsilons: False if `fst` is known to have no epsilon arcs.
    deterministic: True if `fst` is known to be deterministic (then it has no
      epsilons either); regexes without shared prefixes (`Red|Blue`) often are.

  Raises:
    CompileBudgetError: Determinizing needs more than `MAX_DETERMINIZED_STATES` states.
  """
  if deterministic:
    return fst.minimize()
  if has_epsilons:
    fst.rmepsilon()
    if fst.num_states() == 0:  # rmepsilon trims: the empty language.
      return fst
  dfa = pywrapfst.determinize(fst, nstate=MAX_DETERMINIZED_STATES)
  if dfa.num_states() >= MAX_DETERMINIZED_STATES:  # OpenFst stopped there.
    raise errors.CompileBudgetError(
        f"Determinizing the byte automaton needs more than {MAX_DETERMINIZED_STATES} states"
        " (an ambiguous bounded repetition such as '(a|b)*a(a|b){20}' makes it grow"
        " exponentially). Expected an unambiguous pattern: make the repeated part and what"
        " follows it start with different characters.")
  return dfa.minimize()


def _breadth_first(num_states: int, start: int, src, labels, dst
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(order, new_id): the states reachable from `start` in breadth-first order, arcs
  taken in label order, and each state's index in that order (-1: unreachable).

  Labels are byte classes in byte order, then token classes and pseudo-bytes, so two
  minimal DFAs of one language get one numbering. A plain queue (these automata are
  deep chains of literal bytes: one numpy step per level costs more), without loops and
  arcs to the target of the arc before them (a string body's classes).
  """
  src, labels, dst = np.asarray(src), np.asarray(labels), np.asarray(dst)
  same = src[1:] == src[:-1]
  if not ((src[1:] > src[:-1]) | same & (labels[1:] > labels[:-1])).all():  # Unsorted.
    by_label = np.lexsort((labels, src))
    src, dst = src[by_label], dst[by_label]
  useful = src != dst
  useful[1:] &= (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
  ends = np.cumsum(np.bincount(src[useful], minlength=num_states)).tolist()
  targets = dst[useful].tolist()
  new_id = [-1] * num_states
  new_id[start] = 0
  order = [start]
  for state in order:  # `order` grows while it is read: the queue.
    for target in targets[ends[state - 1] if state else 0:ends[state]]:
      if new_id[target] < 0:
        new_id[target] = len(order)
        order.append(target)
  return np.array(order, np.int64), np.array(new_id, np.int64)


def _dfa_from_arcs(start, accepting, src, labels, dst, edges,
                   fragments: tuple = ()) -> _byte_dfa.ByteDfa:
  """Builds a `ByteDfa` from arc arrays over class labels, numbered canonically.

  States are numbered by `_breadth_first` (start 0; unreachable ones dropped), so that
  equal minimal automata give equal tables, whatever OpenFst's numbering.

  Args:
    start: The start state (ignored when there are no states).
    accepting: bool `[Q]`, whether each state is final.
    src, labels, dst: The arcs, as int arrays; label k + 1 means byte class k.
    edges: Class k is the bytes `edges[k]..edges[k+1]-1` (`_BYTE_EDGES`: one per byte);
      values from 256 on are token classes (256 + j), exported as `token_arcs`, then
      pseudo-bytes (`_FRAGMENT_BASE + k`), exported as `fragment_arcs` or `marker_arcs`.
    fragments: The `ir.Fragment` or `ir.Marker` of each pseudo-byte index k.
  """
  num_states = len(accepting)
  if num_states == 0:
    return _byte_dfa.ByteDfa(
        transitions=np.zeros((0, 256), np.int32),
        accepting=np.zeros((0,), bool),
        start=_byte_dfa.NO_STATE,
    )
  order, new_id = _breadth_first(num_states, start, src, labels, dst)
  reached = new_id[src] >= 0
  # Column j holds the arcs labelled j (byte class j - 1); column 0 (epsilon) stays empty.
  table = np.full((len(order), len(edges)), _byte_dfa.NO_STATE, np.int32)
  table[new_id[src[reached]], labels[reached]] = new_id[dst[reached]]
  accepting = accepting[order]
  if len(edges) - 1 != edges[-1]:  # Not one class per value: expand classes to values.
    sizes = [b - a for a, b in zip(edges, edges[1:])]
    table = table.take(np.arange(1, len(edges)).repeat(sizes), axis=1)
  else:
    table = table[:, 1:]
  token_arcs = fragment_arcs = marker_arcs = np.zeros((0, 3), np.int32)
  markers = ()
  if table.shape[1] > _TOKEN_CLASS_BASE:
    extra = table[:, _TOKEN_CLASS_BASE:]
    state, klass = np.nonzero(extra != _byte_dfa.NO_STATE)
    arcs = np.stack([state, klass, extra[state, klass]], axis=1).astype(np.int32)
    is_pseudo = klass >= len(ir.TOKEN_CLASSES)
    token_arcs = arcs[~is_pseudo]
    pseudo_arcs = arcs[is_pseudo]
    pseudo_arcs[:, 1] -= len(ir.TOKEN_CLASSES)
    table = table[:, :_TOKEN_CLASS_BASE]
    fragment_arcs, marker_arcs, fragments, markers = _split_pseudo(pseudo_arcs, fragments)
  # Row-major: every later stage reads whole rows or (state, byte) pairs.
  table = np.ascontiguousarray(table)
  byte_edges = np.asarray([e for e in edges if e <= _TOKEN_CLASS_BASE])
  return _byte_dfa.ByteDfa(transitions=table, accepting=accepting, start=0,
                           token_arcs=token_arcs, class_edges=byte_edges,
                           fragment_arcs=fragment_arcs, fragments=tuple(fragments),
                           marker_arcs=marker_arcs, markers=markers)


def _split_pseudo(arcs: np.ndarray, pseudo: tuple):
  """(fragment arcs, marker arcs, fragments, markers): pseudo-byte arcs `(state, k,
  target)` split by what `pseudo[k]` is, each renumbered densely in its own list."""
  is_marker = np.array([isinstance(p, ir.Marker) for p in pseudo] + [False], bool)
  index = np.zeros(len(pseudo) + 1, np.int32)
  index[~is_marker] = np.arange(int((~is_marker).sum()))
  index[is_marker] = np.arange(int(is_marker.sum()))
  fragment_arcs = arcs[~is_marker[arcs[:, 1]]]
  marker_arcs = arcs[is_marker[arcs[:, 1]]]
  fragment_arcs[:, 1] = index[fragment_arcs[:, 1]]
  marker_arcs[:, 1] = index[marker_arcs[:, 1]]
  fragments = tuple(p for p in pseudo if not isinstance(p, ir.Marker))
  markers = tuple(p for p in pseudo if isinstance(p, ir.Marker))
  return fragment_arcs, marker_arcs, fragments, markers


def _export_fast(fst: pywrapfst.Fst, edges=_BYTE_EDGES, fragments: tuple = ()
                 ) -> _byte_dfa.ByteDfa:
  """Exports a DFA through OpenFst's binary `const` format, parsed with numpy.

  A `ConstFst` stores fixed-size state records and then all arcs in state order, so
  (unlike the `vector` format, whose records have variable length) the whole file is
  read by two `np.frombuffer` calls; converting to `const` costs about a microsecond.
  """
  data = pywrapfst.convert(fst, "const").write_to_string()
  if not data.startswith(_CONST_HEADER_PREFIX):
    raise ValueError(
        "Expected a ConstFst over standard arcs without symbol tables, got the header"
        f" {data[:40]!r} instead."
    )
  offset = len(_CONST_HEADER_PREFIX) + 8  # Skip the properties.
  start, num_states, num_arcs = struct.unpack_from("<qqq", data, offset)
  offset += 24
  states = np.frombuffer(data, _CONST_STATE, num_states, offset)
  arcs = np.frombuffer(data, "<i4", 4 * num_arcs, offset + _CONST_STATE.itemsize * num_states)
  labels = arcs[0::4]
  if labels.size and labels.min() <= EPSILON_LABEL:
    raise ValueError("Expected an epsilon-free automaton, got epsilon arcs instead.")
  return _dfa_from_arcs(
      start, states["final"] != _ZERO, np.arange(num_states).repeat(states["num_arcs"]),
      labels, arcs[3::4], edges, fragments,
  )


def fst_to_byte_dfa(fst: pynini.Fst) -> _byte_dfa.ByteDfa:
  """The minimal trimmed `ByteDfa` of a byte acceptor (labels b + 1, 0 = epsilon).

  Removes epsilons, determinizes and minimizes with OpenFst, keeps only states that
  are accessible and co-accessible, and numbers them breadth-first from the start
  (state 0), bytes in order (`_breadth_first`): one language, one table. The
  empty language gives a DFA with 0 states and `start == NO_STATE`. `fst` is not
  modified; symbol tables, if any, are ignored.
  """
  fst = fst.copy()
  fst.set_input_symbols(None)
  fst.set_output_symbols(None)
  return _export_fast(_minimize(fst))


def compile_byte_dfa(node: ir.Node, *, fragments: bool = False) -> _byte_dfa.ByteDfa:
  """The minimal `ByteDfa` of an IR node; the same as `fst_to_byte_dfa(ir_to_fst(node))`.

  Faster than that composition: OpenFst works over byte classes (sets of bytes that
  no range of the NFA separates) instead of single bytes, and the classes are expanded
  back to bytes only in the exported table.

  With `fragments`, each distinct `ir.Fragment` is one pseudo-byte arc (`fragment_arcs`,
  `fragments`) instead of its body, for `_splice.py`.

  Raises:
    UnsupportedFeatureError: `node` contains a `Terminal` that is not a token class.
  """
  fst, edges, pseudo = minimal_class_fst(node, fragments=fragments)
  return _export_fast(fst, edges, pseudo)


def minimal_class_fst(node: ir.Node, *, fragments: bool = False
                      ) -> tuple[pywrapfst.Fst, list[int], tuple]:
  """The minimal deterministic acceptor of `node` over its byte classes, before export.

  Returns (fst, edges, pseudo): arc label k + 1 covers the values edges[k] ..
  edges[k + 1] - 1 (bytes, and past 255 the pseudo-bytes of `ir.RuleRef`s and, with
  `fragments`, of fragments: `pseudo`). `compile_byte_dfa` expands it into a
  `ByteDfa`; `_pda.py` reads its call arcs.
  """
  # Lists of ints, acyclic: the collector would look at them in vain (`ir.gc_paused`).
  with ir.gc_paused():
    nfa = _build_nfa(node, fragments)
    finals = _remove_epsilons(nfa)
    edges = _byte_classes(nfa.bounds)
    data, deterministic = _pack_bytes(nfa, edges, finals)
  fst = _minimize(
      pywrapfst.Fst.read_from_string(data), has_epsilons=False, deterministic=deterministic
  )
  return fst, edges, tuple(nfa.pseudo)
